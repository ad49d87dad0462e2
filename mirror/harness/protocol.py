"""What the parent and a pass's interpreter agree on: the event line prefix, the user-error exit code and
:class:`HarnessError`."""

from __future__ import annotations

EVENT_PREFIX = "@@hf-mirror-harness "
EXIT_USER_ERROR = 2
MISSING_COLUMN = "HARNESS_MISSING_COLUMN"


class HarnessError(Exception):
    """A problem the user can fix (bad endpoint, unknown repo, missing column): a clear message, exit code 2."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
