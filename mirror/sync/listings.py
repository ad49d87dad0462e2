"""What the sync asks of a listing beyond its pages (mirror.hubjson reads those): the paths clients probe."""

from __future__ import annotations

# Paths the clients probe (HEAD) whose absence must be answerable with upstream down (datasets, §8 of the protocol).
PROBED_PATHS = (".huggingface.yaml", "dataset_infos.json", "README.md")
