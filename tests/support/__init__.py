"""What the tests share: the Hub emulator, the mirror as a process, an nginx front and an S3
server (bench/ imports these too)."""
