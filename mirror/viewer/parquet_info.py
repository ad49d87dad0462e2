"""The dataset viewer's ``/info`` built from cached parquet files, for when upstream's answer was never cached and the
mirror cannot ask (offline, or the viewer down): what ``datasets`` needs to skip its own inference.

Read from the parquet footers only (ranged reads of the cached blobs, through pyarrow, the optional ``viewer``
extra): the row count of each split (exact), the bytes of its row groups (exact, uncompressed), and the features:
exact when the files carry the ``huggingface`` schema metadata that ``datasets`` writes; for plain files, derived
from the Arrow schema when every column is a plain value (ints, floats, strings, bools); otherwise no answer, and
``datasets`` infers as it would without the viewer. One config, ``default``; splits from the file names, as
``datasets`` names them (``train``, ``test``, ``validation``).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from mirror import hf
from mirror.index import MetadataIndex
from mirror.storage.base import BlobStore

# datasets' own split keywords in file and folder names (datasets.data_files), most specific first.
_SPLITS = (("validation", r"validation|valid|val|dev"), ("test", r"test|testing|eval|evaluation"),
           ("train", r"train|training"))
_PLAIN_TYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float", "double",
                "halffloat", "string", "large_string", "bool"}
_DTYPE = {"float": "float32", "double": "float64", "halffloat": "float16", "large_string": "large_string"}


def split_of(path: str) -> str | None:
    """The split a data file belongs to by its name, as ``datasets`` reads names; ``None`` when it names none."""
    for split, words in _SPLITS:
        if re.search(rf"(^|[/_.\-])({words})([/_.\-]|$)", path.lower()):
            return split
    return None


def _features(schema: Any) -> dict[str, Any] | None:
    """The ``datasets`` features of a parquet schema: its ``huggingface`` metadata, or plain values; else None."""
    meta = schema.metadata or {}
    if b"huggingface" in meta:
        try:
            features = json.loads(meta[b"huggingface"]).get("info", {}).get("features")
        except ValueError:
            features = None
        if isinstance(features, dict):
            return features
    out: dict[str, Any] = {}
    for field in schema:
        name = str(field.type)
        if name not in _PLAIN_TYPES:
            return None
        out[field.name] = {"dtype": _DTYPE.get(name, name), "_type": "Value"}
    return out


def _read(files: dict[str, list[Path]], name: str) -> dict[str, Any] | None:
    """Blocking (a thread): the dataset_info of one config from its files' footers."""
    import pyarrow.parquet as pq

    features: dict[str, Any] | None = None
    splits: dict[str, Any] = {}
    total_bytes = 0
    for split, paths in sorted(files.items()):
        rows = size = 0
        for path in paths:
            metadata = pq.read_metadata(path)
            found = _features(metadata.schema.to_arrow_schema())
            if found is None or (features is not None and found != features):
                return None  # a column datasets must infer, or files that disagree: let datasets do it
            features = found
            rows += metadata.num_rows
            size += sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        splits[split] = {"name": split, "num_bytes": size, "num_examples": rows, "dataset_name": name}
        total_bytes += size
    if features is None:
        return None
    return {"description": "", "citation": "", "homepage": "", "license": "", "features": features,
            "builder_name": "parquet", "dataset_name": name, "config_name": "default",
            "version": {"version_str": "0.0.0", "major": 0, "minor": 0, "patch": 0},
            "splits": splits, "dataset_size": total_bytes}


class OfflineInfo:
    """``(repo, config) -> (the /info JSON, its commit)`` from the cached parquet files of ``main``, or None."""

    def __init__(self, index: MetadataIndex, store: BlobStore) -> None:
        self.index = index
        self.store = store

    async def __call__(self, repo: hf.RepoRef, config: str | None) -> tuple[dict[str, Any], str] | None:
        if config not in (None, "default") or repo.type is not hf.RepoType.DATASET:
            return None
        try:
            import pyarrow.parquet  # noqa: F401 - the optional viewer extra
        except ImportError:
            return None
        ref = self.index.get_ref(repo, "main")
        if ref is None:
            return None
        entries = [e for e in await asyncio.to_thread(self.index.files_at, repo, ref.commit)
                   if not e.missing and e.path.endswith(".parquet")]
        files: dict[str, list[Path]] = {}
        for entry in entries:
            split = split_of(entry.path)
            path = self.store.cached_path(entry.etag)
            if split is None or path is None:
                return None  # a file of unknown split, or one not stored: the answer would not be whole
            files.setdefault(split, []).append(path)
        if not files:
            return None
        info = await asyncio.to_thread(_read, files, repo.repo_id.rsplit("/", 1)[-1])
        if info is None:
            return None
        return {"dataset_info": {"default": info}, "partial": False, "pending": [], "failed": []}, ref.commit
