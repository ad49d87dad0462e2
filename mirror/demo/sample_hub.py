"""A tiny read-only Hugging Face Hub for ``hf-mirror demo``: everything generated in memory at start-up, offline.

Repos: model ``demo/tiny-tokenizer`` (a WordPiece ``tokenizer.json`` trained with ``tokenizers`` on the dataset text,
``tokenizer_config.json``, ``special_tokens_map.json``, ``config.json``) and dataset ``demo/tiny-text`` (README with
YAML ``configs`` and two parquet files, columns ``text`` and ``label``). It speaks the routes the clients use (see
hub-protocol.md): HEAD/GET resolve with Range, ``/api/{models,datasets}/{repo}[/revision/{rev}]``, ``tree``,
``paths-info`` and ``refs``, with the Hub's ETag/X-Linked-*/X-Repo-Commit headers and ``X-Error-Code`` 404s.
It is not the test emulator: it only knows branch ``main`` and the commit sha.

With ``--size`` it also serves the bench's dataset ``demo/bench-text`` (parquet shards of that total size, streamed
from disk) and its tokenizer ``demo/bench-tokenizer`` (:mod:`mirror.harness.sample_data` generates them once).

``python -m mirror.demo.sample_hub --port 8091 [--rows 4000] [--write-local DIR] [--size 2G --seed 0 --shards N
--data-dir DIR]``
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from mirror.asgi import Receive, Scope, Send, answer_lifespan, read_body, send_response, watch_disconnect
from mirror.harness.sample_data import ensure, parse_size

MODEL_REPO = "demo/tiny-tokenizer"
DATASET_REPO = "demo/tiny-text"
LAST_MODIFIED = "2024-01-01T00:00:00.000Z"
_WORDS = (
    "mirror cache blob shard token batch tensor stream parquet arrow hub model dataset commit revision range "
    "byte fast slow warm cold local remote gpu cpu host device pinned memory queue worker loader train test "
    "the a of to and in is it that for on with as at by from this we they data load read write time rate"
).split()
_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass
class RepoFile:
    path: str
    data: bytes = b""
    lfs: bool = False
    # the bench's gigabytes are served from disk, with the size and sha256 its manifest recorded at generation
    disk: Path | None = None
    known_size: int | None = None
    known_sha256: str | None = None

    @property
    def size(self) -> int:
        return self.known_size if self.known_size is not None else len(self.data)

    def content(self) -> bytes:
        return self.disk.read_bytes() if self.disk is not None else self.data

    @cached_property
    def sha1(self) -> str:  # git blob id of the content (the tree oid of a regular file)
        return hashlib.sha1(b"blob %d\0" % self.size + self.content()).hexdigest()

    @cached_property
    def sha256(self) -> str:
        return self.known_sha256 or hashlib.sha256(self.content()).hexdigest()

    @property
    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.sha1

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "file", "size": self.size, "path": self.path}
        if self.lfs:
            ptr = self.pointer
            out["oid"] = hashlib.sha1(b"blob %d\0" % len(ptr) + ptr).hexdigest()
            out["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(ptr)}
        else:
            out["oid"] = self.sha1
        return out


@dataclass
class Repo:
    repo_id: str
    kind: str  # "model" | "dataset"
    files: dict[str, RepoFile] = field(default_factory=dict)

    @property
    def sha(self) -> str:
        h = hashlib.sha1(self.repo_id.encode())
        for path in sorted(self.files):
            h.update(f"{path}\0{self.files[path].etag}\n".encode())
        return h.hexdigest()

    def dirs(self) -> set[str]:
        return {"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)}

    def info(self) -> dict[str, Any]:
        siblings = [{"rfilename": p, "size": f.size, "blobId": f.entry()["oid"],
                     **({"lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": len(f.pointer)}}
                        if f.lfs else {})} for p, f in sorted(self.files.items())]
        return {"id": self.repo_id, "_id": self.sha[:24], "sha": self.sha, "author": self.repo_id.split("/")[0],
                "private": False, "gated": False, "disabled": False, "tags": [], "downloads": 0, "likes": 0,
                "lastModified": LAST_MODIFIED, "createdAt": LAST_MODIFIED, "siblings": siblings}

    def tree(self, base: str, recursive: bool) -> list[dict[str, Any]] | None:
        prefix = base + "/" if base else ""
        if base and base not in self.dirs():
            return None
        depth = prefix.count("/")
        dirs = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
                for d in sorted(self.dirs()) if d.startswith(prefix) and (recursive or d.count("/") == depth)]
        files = [f.entry() for p, f in sorted(self.files.items())
                 if p.startswith(prefix) and (recursive or p.count("/") == depth)]
        return dirs + files


def sample_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"text": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 40))).capitalize() + ".",
             "label": rng.randint(0, 1)} for _ in range(n)]


def _parquet(rows: list[dict[str, Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=1000)
    return buf.getvalue()


def _tokenizer_json(texts: list[str]) -> bytes:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=500, special_tokens=_SPECIALS))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")])
    return tok.to_str().encode()


def build_repos(rows: int = 4000) -> dict[tuple[str, str], Repo]:
    """The two demo repos, keyed by (kind, repo_id). Deterministic for a given ``rows``."""
    train, test = sample_rows(rows, seed=0), sample_rows(max(rows // 10, 1), seed=1)
    specials = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), _SPECIALS, strict=True))
    model = Repo(MODEL_REPO, "model")
    for path, data in {
        "tokenizer.json": _tokenizer_json([r["text"] for r in train]),
        "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
                                             "do_lower_case": True, **specials}, indent=2).encode(),
        "special_tokens_map.json": json.dumps(specials, indent=2).encode(),
        "config.json": json.dumps({"model_type": "bert", "vocab_size": 500, "hidden_size": 32}).encode(),
        "README.md": b"# demo/tiny-tokenizer\n\nA WordPiece tokenizer trained on demo/tiny-text.\n",
    }.items():
        model.files[path] = RepoFile(path, data)
    dataset = Repo(DATASET_REPO, "dataset")
    readme = ("---\nconfigs:\n- config_name: default\n  data_files:\n"
              "  - split: train\n    path: data/train-00000-of-00001.parquet\n"
              "  - split: test\n    path: data/test-00000-of-00001.parquet\n---\n"
              f"# demo/tiny-text\n\nGenerated text: {len(train)} train rows, {len(test)} test rows.\n")
    dataset.files["README.md"] = RepoFile("README.md", readme.encode())
    for split, split_rows in (("train", train), ("test", test)):
        path = f"data/{split}-00000-of-00001.parquet"
        dataset.files[path] = RepoFile(path, _parquet(split_rows), lfs=True)
    return {("model", MODEL_REPO): model, ("dataset", DATASET_REPO): dataset}


def write_local(repo: Repo, directory: Path) -> None:
    """Write a repo's files to ``directory`` (what ``--compare-local`` streams)."""
    for path, f in repo.files.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_bytes(f.content())


BENCH_DATASET = "demo/bench-text"
BENCH_TOKENIZER = "demo/bench-tokenizer"


def bench_repos(size: int, seed: int, cache_root: Path | None = None,
                shards: int | None = None) -> dict[tuple[str, str], Repo]:
    """The bench's repos (``demo/bench-text`` of ``size`` bytes of parquet, ``demo/bench-tokenizer``), served from the
    generated folder (:mod:`mirror.harness.sample_data`, generated on first use)."""
    data = ensure(size, seed, cache_root, shards=shards)
    out: dict[tuple[str, str], Repo] = {}
    for kind, repo_id, directory, files in (
            ("dataset", BENCH_DATASET, data.dataset_dir, data.manifest["dataset_files"]),
            ("model", BENCH_TOKENIZER, data.tokenizer_dir, data.manifest["tokenizer_files"])):
        repo = Repo(repo_id, kind)
        for path, meta in files.items():
            repo.files[path] = RepoFile(path, lfs=meta["lfs"], disk=directory / path, known_size=meta["size"],
                                        known_sha256=meta["sha256"])
        out[(kind, repo_id)] = repo
    return out


STATS_PATH = "/_sample_hub/stats"


class SampleHub:
    """The ASGI app. Routes on ``raw_path`` so that a ``%2F``-encoded revision stays one segment.

    It counts what it is asked (``GET /_sample_hub/stats``): requests and body bytes sent, split into *data*
    (resolves of LFS files: the parquet shards) and *metadata* (everything else), so that a bench can say what a
    pass asked of upstream, and its process's CPU seconds (``cpu_s``). Health checks and the stats route are not
    counted."""

    def __init__(self, repos: dict[tuple[str, str], Repo]) -> None:
        self.repos = repos
        self.stats = {"requests": 0, "bytes": 0, "data_requests": 0, "data_bytes": 0, "metadata_requests": 0,
                      "metadata_bytes": 0}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await answer_lifespan(scope, receive, send):
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        raw = scope["raw_path"].decode()
        if raw == STATS_PATH:
            # with its CPU seconds so far: what serving a pass cost the upstream side
            await send_response(send, scope["method"], *_json(200, {**self.stats, "cpu_s": time.process_time()}))
            return
        status, out_headers, payload = self.handle(scope["method"], raw, scope.get("query_string", b"").decode(),
                                                   headers, body)
        kind = "data" if "x-linked-size" in out_headers else "metadata"
        counted = raw != "/healthz"

        def count(n: int) -> None:
            if counted:
                self.stats["bytes"] += n
                self.stats[f"{kind}_bytes"] += n

        if counted:
            self.stats["requests"] += 1
            self.stats[f"{kind}_requests"] += 1
        if isinstance(payload, FileSlice):
            # the client hanging up ends the body (uvicorn's send would take the rest silently): what is counted
            # is what a client could have read, not the rest of a window a hedge or a cancel left behind
            gone = asyncio.Event()
            watcher = asyncio.create_task(watch_disconnect(receive, gone))
            try:
                await _send_file(send, scope["method"], status, out_headers, payload, count, gone)
            finally:
                watcher.cancel()
            return
        await send_response(send, scope["method"], status, out_headers, payload)
        count(0 if scope["method"] == "HEAD" else len(payload))

    def handle(self, method: str, raw: str, query: str, headers: dict[str, str],
               body: bytes) -> tuple[int, dict[str, str], bytes | FileSlice]:
        parts = raw.strip("/").split("/")
        if raw == "/healthz":
            return _json(200, {"status": "ok"})
        if parts[0] == "api" and len(parts) >= 4 and parts[1] in ("models", "datasets"):
            kind, repo_id, rest = parts[1][:-1], "/".join(parts[2:4]), parts[4:]
            repo = self.repos.get((kind, repo_id))
            if repo is None:
                return _error(404, "RepoNotFound", "Repository not found")
            if not rest:
                return _json(200, repo.info())
            if len(rest) < 2 or not self._rev_ok(repo, unquote(rest[1])):
                return _error(404, "RevisionNotFound", "Invalid rev id") if len(rest) >= 2 else _json(404, {})
            q = {k: v[-1] for k, v in parse_qs(query).items()}
            if rest[0] == "revision":
                return _json(200, repo.info())
            if rest[0] == "tree":
                entries = repo.tree(unquote("/".join(rest[2:])).strip("/"), q.get("recursive", "").lower() == "true")
                if entries is None:
                    return _error(404, "EntryNotFound", "Entry not found", repo.sha)
                return _json(200, entries)
            if rest[0] == "paths-info" and method == "POST":
                paths = parse_qs(body.decode()).get("paths", [])
                dirs = repo.dirs()
                return _json(200, [repo.files[p].entry() if p in repo.files else
                                   {"type": "directory", "oid": hashlib.sha1(p.encode()).hexdigest(), "size": 0,
                                    "path": p} for p in paths if p in repo.files or p in dirs])
            if rest[0] == "refs":
                return _json(200, {"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": repo.sha}],
                                   "tags": [], "converts": [], "pullRequests": []})
            return _json(404, {"error": "Not found"})
        kind = "dataset" if parts[0] == "datasets" else "model"
        parts = parts[1:] if kind == "dataset" else parts
        if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            repo = self.repos.get((kind, "/".join(parts[:2])))
            if repo is None:
                return _error(404, "RepoNotFound", "Repository not found")
            if not self._rev_ok(repo, unquote(parts[3])):
                return _error(404, "RevisionNotFound", "Invalid rev id")
            f = repo.files.get(unquote("/".join(parts[4:])))
            if f is None:
                return _error(404, "EntryNotFound", "Entry not found", repo.sha)
            return _serve(f, repo.sha, headers.get("range"))
        return _json(404, {"error": "Not found"})

    @staticmethod
    def _rev_ok(repo: Repo, rev: str) -> bool:
        return rev in ("main", "refs/heads/main", repo.sha)


def _json(status: int, obj: Any, extra: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    return status, {"content-type": "application/json", **(extra or {})}, json.dumps(obj).encode()


def _error(status: int, code: str, message: str, commit: str | None = None) -> tuple[int, dict[str, str], bytes]:
    extra = {"x-error-code": code, "x-error-message": message, **({"x-repo-commit": commit} if commit else {})}
    return _json(status, {"error": message}, extra)


@dataclass(frozen=True)
class FileSlice:
    """Bytes ``start..end`` (inclusive) of a file on disk: a body streamed in chunks, never held whole."""

    path: Path
    start: int
    end: int


def _serve(f: RepoFile, commit: str, range_header: str | None) -> tuple[int, dict[str, str], bytes | FileSlice]:
    size = f.size
    headers = {"content-type": "application/octet-stream", "accept-ranges": "bytes", "etag": f'"{f.etag}"',
               "x-repo-commit": commit, "content-disposition": f'inline; filename="{f.path.rsplit("/", 1)[-1]}"'}
    if f.lfs:
        headers.update({"x-linked-etag": f'"{f.sha256}"', "x-linked-size": str(size)})

    def body(start: int, end: int) -> bytes | FileSlice:
        return FileSlice(f.disk, start, end) if f.disk is not None else f.data[start:end + 1]

    if not range_header or not range_header.startswith("bytes=") or "," in range_header:
        return 200, headers, body(0, size - 1)
    first, _, last = range_header[6:].strip().partition("-")
    try:
        start, end = (size - int(last), size - 1) if not first else (int(first), int(last) if last else size - 1)
    except ValueError:
        return 200, headers, body(0, size - 1)
    start, end = max(start, 0), min(end, size - 1)
    if start >= size or start > end:
        return 416, {**headers, "content-range": f"bytes */{size}"}, b""
    return 206, {**headers, "content-range": f"bytes {start}-{end}/{size}"}, body(start, end)


async def _send_file(send: Send, method: str, status: int, headers: dict[str, str], body: FileSlice,
                     counted: Callable[[int], None], gone: asyncio.Event) -> None:
    length = body.end - body.start + 1
    headers["content-length"] = str(length)
    await send({"type": "http.response.start", "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()]})
    if method == "HEAD":
        await send({"type": "http.response.body", "body": b""})
        return
    with open(body.path, "rb") as f:
        f.seek(body.start)
        left = length
        while left > 0 and not gone.is_set():
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            left -= len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})
            counted(len(chunk))
    if left > 0:  # the file shrank under us: end the body rather than hang the client
        await send({"type": "http.response.body", "body": b""})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mirror.demo.sample_hub", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--rows", type=int, default=4000, help="train rows of demo/tiny-text (test: a tenth)")
    parser.add_argument("--write-local", type=Path, help="also write demo/tiny-text's files into this folder")
    parser.add_argument("--size", default=None,
                        help=f"also serve {BENCH_DATASET} with this much parquet (e.g. 256M, 2G) and "
                             f"{BENCH_TOKENIZER}, generated once into --data-dir")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --size dataset (default 0)")
    parser.add_argument("--shards", type=int, default=None,
                        help="parquet shards of the --size dataset (default max(16, size / 500 MB))")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where generated datasets are kept (default ~/.cache/hf-mirror/sample-data)")
    args = parser.parse_args(argv)
    repos = build_repos(args.rows)
    if args.size:
        repos.update(bench_repos(parse_size(args.size), args.seed, args.data_dir, args.shards))
    if args.write_local:
        write_local(repos[("dataset", DATASET_REPO)], args.write_local)
    import uvicorn

    uvicorn.run(SampleHub(repos), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
