"""The client cache's layout (see :mod:`mirror.cache.hubcache`): its repo folders' names, and a blob put into place."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from huggingface_hub.file_download import repo_folder_name as hub_repo_folder_name

from mirror import hf

REPO_DIR_RE = re.compile(r"^(models|datasets|spaces)--(.+)$")


def repo_folder_name(repo: hf.RepoRef) -> str:
    """``models--acme--tiny-model``: huggingface_hub's own name for a repo's folder."""
    return hub_repo_folder_name(repo_id=repo.repo_id, repo_type=repo.type.value)


def link_or_copy(source: Path, dest: Path, link: bool) -> bool:
    """Put ``source``'s bytes at ``dest`` (replacing any file there): a hardlink when ``link`` and the disk allows
    it, a copy otherwise. True when linked.

    A symlinked ``source`` is followed to its file first (huggingface_hub 2.x: a repo's ``blobs/<etag>`` is a
    relative link into the cache-wide shared store): a hardlink of the link itself would dangle at ``dest``."""
    source = Path(os.path.realpath(source))
    dest.unlink(missing_ok=True)
    if link:
        try:
            os.link(source, dest)
            return True
        except OSError:
            pass
    shutil.copyfile(source, dest)
    return False
