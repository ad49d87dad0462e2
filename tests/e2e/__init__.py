"""Real processes and real clients: the mirror, the Hub emulator, nginx, S3, browsers."""
