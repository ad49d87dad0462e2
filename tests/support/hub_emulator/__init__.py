"""An upstream Hub emulator for the tests: a real HTTP server speaking the Hub's protocol (see app.py)."""
