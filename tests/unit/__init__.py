"""Pure functions and modules in-process: no process started, milliseconds each."""
