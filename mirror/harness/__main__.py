"""``python -m mirror.harness --worker CONFIG``: the internal entry point of one measured pass."""

import sys

from mirror.harness.worker import worker_entry

sys.exit(worker_entry(sys.argv[1:]))
