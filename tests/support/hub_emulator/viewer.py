"""The emulator as the dataset viewer's host (``datasets-server.<hub>``) and the Hub's ``/api/datasets/{repo}/parquet``
routes, answered from a dataset's ``refs/convert/parquet`` branch, as the real services answer them.

``/info`` carries ``X-Revision`` (the commit ``main`` is at) and ``partial: false, pending: [], failed: []``: exactly
what ``datasets`` accepts. Datasets without a conversion answer 404 ``ResponseNotFound``, as the viewer does; a
dataset the caller may not read (private, gated, missing) answers what the viewer's auth check answers (its
``libapi``): 401 ``ExternalUnauthenticatedError`` without a valid token, 404 ``ExternalAuthenticatedError`` with one.
"""

from __future__ import annotations

import io
import json
from typing import Any
from urllib.parse import quote

from tests.support.hub_emulator.fixtures import Commit, Repo

ENDPOINTS = ("info", "splits", "parquet", "size", "is-valid")
UNAUTHENTICATED = ("The dataset does not exist, or is not accessible without authentication (private or gated). Please"
                   " check the spelling of the dataset name or retry with authentication.")
AUTHENTICATED = ("The dataset does not exist, or is not accessible with the current credentials (private or gated)."
                 " Please check the spelling of the dataset name or retry with other authentication credentials.")


class ViewerAnswer(Exception):
    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}


def _not_found(message: str) -> ViewerAnswer:
    return ViewerAnswer(404, {"error": message}, {"x-error-code": "ResponseNotFound"})


def conversion(repo: Repo) -> tuple[Commit, Commit]:
    """(main's commit, the conversion's commit), or a 404 answer."""
    if "parquet" not in repo.converts or "main" not in repo.branches:
        raise _not_found("Not found.")
    return repo.commits[repo.branches["main"]], repo.commits[repo.converts["parquet"]]


def _layout(convert: Commit) -> dict[str, dict[str, list[str]]]:
    """{config: {split: [paths]}} of the conversion branch (``partial-{split}`` folders included)."""
    out: dict[str, dict[str, list[str]]] = {}
    for path in sorted(convert.files):
        parts = path.split("/")
        if len(parts) == 3 and parts[2].endswith(".parquet"):
            split = parts[1].removeprefix("partial-")
            out.setdefault(parts[0], {}).setdefault(split, []).append(path)
    return out


def _split_stats(convert: Commit, paths: list[str]) -> tuple[int, int, dict[str, Any]]:
    import pyarrow.parquet as pq

    rows = nbytes = 0
    features: dict[str, Any] = {}
    for path in paths:
        pf = pq.ParquetFile(io.BytesIO(convert.files[path].read()))
        rows += pf.metadata.num_rows
        nbytes += pf.read().nbytes
        meta = (pf.schema_arrow.metadata or {}).get(b"huggingface")
        if meta:
            features = json.loads(meta)["info"]["features"]
    return rows, nbytes, features


def dataset_info(repo: Repo, convert: Commit, config: str) -> dict[str, Any]:
    name = repo.repo_id.split("/")[-1]
    splits, size, features = {}, 0, {}
    for split, paths in _layout(convert)[config].items():
        rows, nbytes, features = _split_stats(convert, paths)
        splits[split] = {"name": split, "num_bytes": nbytes, "num_examples": rows, "dataset_name": name}
        size += nbytes
    download = sum(convert.files[p].size for ps in _layout(convert)[config].values() for p in ps)
    return {"description": "", "citation": "", "homepage": "", "license": "", "features": features,
            "builder_name": "parquet", "dataset_name": name, "config_name": config,
            "version": {"version_str": "0.0.0", "major": 0, "minor": 0, "patch": 0}, "splits": splits,
            "download_size": download, "dataset_size": size}


def viewer(repo: Repo, endpoint: str, query: dict[str, list[str]], hub_base: str) -> ViewerAnswer:
    """The viewer's answer (raised) to ``/{endpoint}?dataset=...``; ``repo`` is readable by the caller."""
    main, convert = conversion(repo)
    layout = _layout(convert)
    config = (query.get("config") or [None])[0]
    split = (query.get("split") or [None])[0]
    if config is not None and config not in layout:
        raise _not_found("Not found.")
    configs = [config] if config else sorted(layout)
    done = {"pending": [], "failed": [], "partial": False}
    headers = {"x-revision": main.sha}
    if endpoint == "is-valid":
        raise ViewerAnswer(200, {"preview": True, "viewer": True, "search": True, "filter": True,
                                 "statistics": True}, headers)
    if endpoint == "info":
        if config:
            raise ViewerAnswer(200, {"dataset_info": dataset_info(repo, convert, config), **done}, headers)
        raise ViewerAnswer(200, {"dataset_info": {c: dataset_info(repo, convert, c) for c in configs}, **done},
                           headers)
    if endpoint == "splits":
        raise ViewerAnswer(200, {"splits": [{"dataset": repo.repo_id, "config": c, "split": s}
                                            for c in configs for s in layout[c]], "pending": [], "failed": []},
                           headers)
    if endpoint == "parquet":
        files = []
        for c in configs:
            for s, paths in layout[c].items():
                if split is not None and s != split:
                    continue
                for path in paths:
                    url = (f"{hub_base}/datasets/{repo.repo_id}/resolve/{quote('refs/convert/parquet', safe='')}/"
                           f"{path}")
                    files.append({"dataset": repo.repo_id, "config": c, "split": s, "url": url,
                                  "filename": path.rsplit("/", 1)[1], "size": convert.files[path].size})
        raise ViewerAnswer(200, {"parquet_files": files, **done}, headers)
    if endpoint == "size":
        splits = []
        for c in configs:
            for s, paths in layout[c].items():
                rows, nbytes, features = _split_stats(convert, paths)
                splits.append({"dataset": repo.repo_id, "config": c, "split": s, "num_rows": rows,
                               "num_columns": len(features), "num_bytes_parquet_files":
                                   sum(convert.files[p].size for p in paths), "num_bytes_memory": nbytes})
        total = {"dataset": repo.repo_id, "num_rows": sum(s["num_rows"] for s in splits),
                 "num_bytes_parquet_files": sum(s["num_bytes_parquet_files"] for s in splits),
                 "num_bytes_memory": sum(s["num_bytes_memory"] for s in splits)}
        raise ViewerAnswer(200, {"size": {"dataset": total, "configs": [], "splits": splits}, **done}, headers)
    raise _not_found("Not found.")


def hub_parquet(repo: Repo, args: list[str], hub_base: str) -> ViewerAnswer:
    """``/api/datasets/{repo}/parquet[/{config}[/{split}[/{n}.parquet]]]`` as the Hub answers it."""
    _, convert = conversion(repo)
    layout = _layout(convert)
    api = f"{hub_base}/api/datasets/{repo.repo_id}/parquet"

    def urls(config: str, split: str) -> list[str]:
        return [f"{api}/{config}/{split}/{i}.parquet" for i in range(len(layout[config][split]))]

    if not args:
        raise ViewerAnswer(200, {c: {s: urls(c, s) for s in splits} for c, splits in layout.items()})
    config = args[0]
    if config not in layout:
        raise _not_found(f"Config {config} not found")
    if len(args) == 1:
        raise ViewerAnswer(200, {s: urls(config, s) for s in layout[config]})
    split = args[1]
    if split not in layout[config]:
        raise _not_found(f"Split {split} not found")
    if len(args) == 2:
        raise ViewerAnswer(200, urls(config, split))
    name = args[2]
    index = int(name.removesuffix(".parquet")) if name.removesuffix(".parquet").isdigit() else -1
    if len(args) != 3 or not name.endswith(".parquet") or not 0 <= index < len(layout[config][split]):
        raise _not_found("Not found.")
    path = layout[config][split][index]
    location = f"{hub_base}/datasets/{repo.repo_id}/resolve/{quote('refs/convert/parquet', safe='')}/{path}"
    raise ViewerAnswer(302, {}, {"location": location})
