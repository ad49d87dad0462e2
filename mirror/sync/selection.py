"""Which files of a revision to fetch: ``allow_patterns`` / ``ignore_patterns`` exactly as ``snapshot_download``
reads them, by running the function the clients run (``huggingface_hub.utils.filter_repo_objects``)."""

from __future__ import annotations

from collections.abc import Iterable

from huggingface_hub.utils import filter_repo_objects


def select(paths: Iterable[str], allow: Iterable[str] | None, ignore: Iterable[str] | None) -> list[str]:
    """The paths a client's ``snapshot_download(allow_patterns=allow, ignore_patterns=ignore)`` would take."""
    return list(filter_repo_objects(paths, allow_patterns=None if allow is None else list(allow),
                                    ignore_patterns=None if ignore is None else list(ignore)))
