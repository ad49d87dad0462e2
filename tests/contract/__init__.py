"""The storage backends against one contract (local disk and a real S3 server)."""
