"""The emulator's repos: deterministic content, git-style ids, and the ground truth that tests compare against.

Every process that builds :class:`Fixtures` from the same arguments gets the same repos, commits and bytes, so the
test process (``EmulatorHandle.files``) and the emulator process agree without talking. The one large file
(``acme/big-data`` ``big.bin``) lives on disk in the work dir and is generated once; ``acme/huge-data`` ``huge.bin``
(only when a size is given) is computed from the offset on every read, so it can be over 50 GB.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import pickle_samples

LAST_MODIFIED = "2024-05-01T12:00:00.000Z"
CREATED_AT = "2023-01-01T00:00:00.000Z"
GOOD_TOKEN = "hf_good_token"  # may read every repo, gated and private included
DENIED_TOKEN = "hf_denied_token"  # a valid user who did not accept the gate and is no member of the private org
VALID_TOKENS = (GOOD_TOKEN, DENIED_TOKEN)
_WORDS = ("alpha beta gamma delta mirror cache blob token batch tensor stream parquet arrow hub model dataset "
          "commit revision range byte fast slow warm cold local remote gpu cpu").split()


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class RepoFile:
    path: str
    size: int
    sha256: str
    lfs: bool
    data: bytes | None = None  # None: on disk at ``disk_path``, or generated from the offset (``generated``)
    disk_path: Path | None = None
    blob_sha1: str = ""
    generated: bool = False  # content computed from the offset (generated_bytes): nothing stored, any size

    @property
    def pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @property
    def etag(self) -> str:
        """What the Hub sends as (X-Linked-)ETag: sha256 for LFS files, the git blob sha1 otherwise."""
        return self.sha256 if self.lfs else self.blob_sha1

    @property
    def oid(self) -> str:
        return git_sha1(self.pointer) if self.lfs else self.blob_sha1

    def read(self, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)``."""
        end = self.size if end is None else end
        if self.generated:
            return generated_bytes(start, min(end, self.size))
        if self.data is not None:
            return self.data[start:end]
        assert self.disk_path is not None
        with open(self.disk_path, "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def entry(self, *, xet: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "file", "oid": self.oid, "size": self.size, "path": self.path}
        if self.lfs:
            out["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(self.pointer)}
            if xet:  # the real Hub lists the Xet hash of Xet-backed LFS files
                out["xetHash"] = self.xet_hash
        return out

    @property
    def xet_hash(self) -> str:
        """The file's real Xet hash (hf_xet's ``hash_files``, as the Hub computes it on upload); a stand-in digest
        where hf_xet is not installed."""
        known = _XET_HASHES.get(self.sha256)
        if known is None:
            known = _XET_HASHES[self.sha256] = _xet_hash(self)
        return known


_XET_HASHES: dict[str, str] = {}


def _xet_hash(file: RepoFile) -> str:
    if file.generated:
        # A real Xet hash of tens of GB takes too long to compute for a test: the generated file advertises a
        # stand-in of the right form (64 hex). hf_xet checks sizes, not hashes, and the mirror only ever names a
        # file by the hash upstream gave it, so the flow is the same as for a real one.
        return hashlib.sha256(b"hf-mirror emulator generated xet|" + file.sha256.encode()).hexdigest()
    try:
        import hf_xet
    except ImportError:
        return hashlib.sha256(b"xet" + file.sha256.encode()).hexdigest()
    if file.disk_path is not None and file.data is None:
        return hf_xet.hash_files([str(file.disk_path)])[0].hash
    import os
    import tempfile

    fd, name = tempfile.mkstemp(prefix="xet-hash-")
    try:
        os.write(fd, file.data or b"")
        os.close(fd)
        return hf_xet.hash_files([name])[0].hash
    finally:
        os.unlink(name)


def make_file(path: str, data: bytes, lfs: bool = False) -> RepoFile:
    return RepoFile(path, len(data), hashlib.sha256(data).hexdigest(), lfs, data=data, blob_sha1=git_sha1(data))


@dataclass
class Commit:
    sha: str
    files: dict[str, RepoFile]
    title: str = "update"

    def dirs(self) -> set[str]:
        return {"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)}


@dataclass
class Repo:
    repo_type: str  # model | dataset | space
    repo_id: str
    gated: bool = False
    private: bool = False
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    prs: dict[str, str] = field(default_factory=dict)  # "refs/pr/1" -> sha
    converts: dict[str, str] = field(default_factory=dict)  # "parquet" -> sha (refs/convert/parquet)
    hub_tags: list[str] = field(default_factory=list)  # what the list API's ``filter=`` matches (library, license...)
    # The Hub's scan (securityRepoStatus / securityFileStatus): path -> level ("unsafe", "caution"; others are
    # "safe"), and whether the scans are done ("not scanned yet" otherwise). ``card_license``: cardData.license
    # ("" for a card without one; None: "mit" when the repo has a README, as before).
    security: dict[str, str] = field(default_factory=dict)
    scans_done: bool = True
    card_license: str | None = None

    def add_commit(self, files: dict[str, RepoFile], title: str) -> Commit:
        digest = hashlib.sha1(f"{self.repo_type}/{self.repo_id}/{len(self.commits)}/{title}".encode())
        for path in sorted(files):
            digest.update(f"{path}\0{files[path].etag}\n".encode())
        commit = Commit(digest.hexdigest(), dict(files), title)
        self.commits[commit.sha] = commit
        return commit

    def resolve(self, rev: str) -> Commit | None:
        """A branch, tag, ``refs/pr/N``, full sha or unambiguous short sha (>= 7 hex) to its commit; ``HEAD`` is the
        default branch (huggingface.js asks ``/api/models/{repo}/revision/HEAD`` for ``modelInfo``)."""
        if rev == "HEAD":
            rev = "main"
        for refs in (self.branches, self.tags, self.prs):
            if rev in refs:
                return self.commits[refs[rev]]
        if rev.startswith("refs/convert/") and rev.removeprefix("refs/convert/") in self.converts:
            return self.commits[self.converts[rev.removeprefix("refs/convert/")]]
        if rev in self.commits:
            return self.commits[rev]
        if len(rev) >= 7 and all(c in "0123456789abcdef" for c in rev):
            hits = [c for sha, c in self.commits.items() if sha.startswith(rev)]
            if len(hits) == 1:
                return hits[0]
        return None

    def visible_to(self, token: str | None) -> bool:
        return not self.private or token == GOOD_TOKEN

    def readable_by(self, token: str | None) -> bool:
        return self.visible_to(token) and (not self.gated or token == GOOD_TOKEN)


def _safetensors(n_floats: int, seed: int) -> bytes:
    """A valid safetensors file with one F32 tensor."""
    header = json.dumps({"weight": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]},
                         "__metadata__": {"format": "pt"}}).encode()
    header += b" " * (-len(header) % 8)
    rng = random.Random(seed)
    return struct.pack("<Q", len(header)) + header + rng.randbytes(4 * n_floats)


def _rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"id": i, "text": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))),
             "label": rng.randint(0, 1)} for i in range(n)]


ROW_FEATURES = {"id": {"dtype": "int64", "_type": "Value"}, "text": {"dtype": "string", "_type": "Value"},
                "label": {"dtype": "int64", "_type": "Value"}}


def _parquet(rows: list[dict[str, Any]], hf_meta: bool = False) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    table = pa.Table.from_pylist(rows)
    if hf_meta:  # what datasets (and the Hub's conversion) writes: the features, in the schema's metadata
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": ROW_FEATURES}})})
    pq.write_table(table, buf, row_group_size=64)
    return buf.getvalue()


def _parquet_dataset(repo_id: str, n_train: int, n_test: int, seed: int, *, gated: bool = False,
                     private: bool = False) -> Repo:
    """A parquet dataset under data/ with a README whose YAML names its splits, and the Hub's parquet conversion of
    it (issue 20): refs/convert/parquet, {config}/{split}/NNNN.parquet, with the ``huggingface`` schema metadata that
    datasets writes."""
    repo = Repo("dataset", repo_id, gated=gated, private=private)
    name = repo_id.split("/")[1]
    readme = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n"
              f"  - split: test\n    path: data/test-*\n---\n# {name}\n")
    train, test = _rows(n_train, seed), _rows(n_test, seed + 1)
    commit = repo.add_commit({
        ".gitattributes": make_file(".gitattributes", GITATTRIBUTES),
        "README.md": make_file("README.md", readme.encode()),
        "data/train-00000-of-00001.parquet": make_file("data/train-00000-of-00001.parquet", _parquet(train), lfs=True),
        "data/test-00000-of-00001.parquet": make_file("data/test-00000-of-00001.parquet", _parquet(test), lfs=True),
    }, "init")
    repo.branches["main"] = commit.sha
    convert = repo.add_commit({
        ".gitattributes": make_file(".gitattributes", GITATTRIBUTES),
        "default/train/0000.parquet": make_file("default/train/0000.parquet", _parquet(train, hf_meta=True),
                                                lfs=True),
        "default/test/0000.parquet": make_file("default/test/0000.parquet", _parquet(test, hf_meta=True), lfs=True),
    }, "Update parquet files")
    repo.converts["parquet"] = convert.sha
    return repo


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _tokenizer_files() -> dict[str, bytes]:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", *_WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128, "pad_token": "[PAD]",
              "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
    return {"tokenizer.json": tok.to_str().encode(), "tokenizer_config.json": json.dumps(config).encode()}


def _big_file(workdir: Path, size: int) -> RepoFile:
    """``size`` deterministic pseudo-random bytes on disk, generated once per work dir."""
    path = workdir / f"big-{size}.bin"
    meta = workdir / f"big-{size}.sha256"
    if not (path.exists() and meta.exists() and path.stat().st_size == size):
        digest, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        rng = random.Random(4242)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            left = size
            while left:
                chunk = rng.randbytes(min(left, 8 << 20))
                digest.update(chunk)
                sha1.update(chunk)
                f.write(chunk)
                left -= len(chunk)
        tmp.replace(path)
        meta.write_text(f"{digest.hexdigest()} {sha1.hexdigest()}")
    sha256, sha1_hex = meta.read_text().split()
    return RepoFile("big.bin", size, sha256, True, disk_path=path, blob_sha1=sha1_hex)


_GEN_BLOCK = 1 << 20
_GEN_BASE = random.Random(5150).randbytes(_GEN_BLOCK)
_GEN_STAMP = 4096  # every 4 KiB page starts with its own offset (u64 LE): a byte out of place is a wrong byte


def generated_bytes(start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the generated file: a fixed random MiB, each 4 KiB page stamped with its offset."""
    if end <= start:
        return b""
    first_block, last_block = start // _GEN_BLOCK, (end - 1) // _GEN_BLOCK
    out = bytearray(_GEN_BASE * (last_block - first_block + 1))
    view = memoryview(out).cast("Q")  # native order: little-endian on every platform these tests run on
    base = first_block * _GEN_BLOCK
    pages = len(out) // _GEN_STAMP
    step = _GEN_STAMP // 8
    for i in range(pages):
        view[i * step] = base + i * _GEN_STAMP
    view.release()
    lo = start - base
    with memoryview(out) as whole:
        return bytes(whole[lo:lo + end - start])


def generated_sha256(size: int) -> str:
    """sha256 of the generated file of ``size`` bytes, computed once per machine (it takes ~2 s per GB) and kept
    under the temp dir."""
    import tempfile

    cache = Path(tempfile.gettempdir()) / "hf-mirror-emulator-generated"
    known = cache / f"{size}.sha256"
    try:
        return known.read_text().strip()
    except FileNotFoundError:
        pass
    digest = hashlib.sha256()
    step = 64 * _GEN_BLOCK
    for offset in range(0, size, step):
        digest.update(generated_bytes(offset, min(size, offset + step)))
    cache.mkdir(parents=True, exist_ok=True)
    tmp = known.with_suffix(f".{os.getpid()}")
    tmp.write_text(digest.hexdigest())
    tmp.replace(known)
    return digest.hexdigest()


def generated_file(path: str, size: int) -> RepoFile:
    return RepoFile(path, size, generated_sha256(size), True, generated=True)


GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.parquet filter=lfs diff=lfs merge=lfs -text\n"


def build_repos(workdir: Path, big_file_size: int, huge_file_size: int = 0) -> dict[tuple[str, str], Repo]:
    repos: dict[tuple[str, str], Repo] = {}

    def add(repo: Repo) -> Repo:
        repos[(repo.repo_type, repo.repo_id)] = repo
        return repo

    # acme/tiny-model: four revisions, nested folders, LFS weights, a tokenizer.
    tiny = add(Repo("model", "acme/tiny-model"))
    base = {
        ".gitattributes": make_file(".gitattributes", GITATTRIBUTES),
        "README.md": make_file("README.md", b"---\nlicense: mit\n---\n# tiny-model\n"),
        "config.json": make_file("config.json", json.dumps({"model_type": "bert", "vocab_size": 40,
                                                            "hidden_size": 8, "version": 1}).encode()),
        "sub/nested.txt": make_file("sub/nested.txt", b"nested file v1\n"),
        "sub/deeper/leaf.json": make_file("sub/deeper/leaf.json", b'{"leaf": true}\n'),
        "model.safetensors": make_file("model.safetensors", _safetensors(75_000, seed=1), lfs=True),
        **{p: make_file(p, d) for p, d in _tokenizer_files().items()},
    }
    v1 = tiny.add_commit(base, "v1.0")
    main_files = dict(base)
    main_files["config.json"] = make_file("config.json", json.dumps({"model_type": "bert", "vocab_size": 40,
                                                                     "hidden_size": 8, "version": 2}).encode())
    main_files["sub/nested.txt"] = make_file("sub/nested.txt", b"nested file v2\n")
    main = tiny.add_commit(main_files, "main")
    dev = tiny.add_commit({**main_files, "dev.txt": make_file("dev.txt", b"dev only\n")}, "dev")
    pr = tiny.add_commit({**main_files, "config.json": make_file("config.json", b'{"model_type": "bert", "pr": 1}')},
                         "pr1")
    tiny.branches.update(main=main.sha, dev=dev.sha)
    tiny.tags["v1.0"] = v1.sha
    tiny.prs["refs/pr/1"] = pr.sha
    tiny.hub_tags[:] = ["transformers", "safetensors", "bert", "license:mit"]

    # Repo ids without an org, as the Hub still serves them.
    for repo_id in ("gpt2", "openai-community/gpt2"):
        gpt2 = add(Repo("model", repo_id))
        commit = gpt2.add_commit({"config.json": make_file("config.json", b'{"model_type": "gpt2", "n_layer": 1}'),
                                  "README.md": make_file("README.md", b"# gpt2\n")}, "init")
        gpt2.branches["main"] = commit.sha

    # Gated and private repos.
    for repo_id, gated, private in (("acme/gated-model", True, False), ("acme/private-model", False, True)):
        repo = add(Repo("model", repo_id, gated=gated, private=private))
        commit = repo.add_commit({
            "config.json": make_file("config.json", json.dumps({"model_type": "bert", "secret": repo_id}).encode()),
            "model.safetensors": make_file("model.safetensors", _safetensors(4096, seed=len(repo_id)), lfs=True),
        }, "init")
        repo.branches["main"] = commit.sha

    # Datasets: parquet under data/ with a README (and the Hub's parquet conversion of it), jsonl at the root
    # without one; the same parquet layout private and gated, for the viewer's access rules.
    parquet = add(_parquet_dataset("acme/tiny-parquet", 200, 50, seed=1))
    parquet.hub_tags[:] = ["format:parquet", "modality:tabular", "license:mit"]
    add(_parquet_dataset("acme/private-parquet", 40, 12, seed=5, private=True))
    add(_parquet_dataset("acme/gated-parquet", 36, 10, seed=7, gated=True))
    jsonl = add(Repo("dataset", "acme/tiny-jsonl"))
    commit = jsonl.add_commit({"train.jsonl": make_file("train.jsonl", _jsonl(_rows(30, 3))),
                               "test.jsonl": make_file("test.jsonl", _jsonl(_rows(10, 4)))}, "init")
    jsonl.branches["main"] = commit.sha
    jsonl.hub_tags[:] = ["format:json", "license:apache-2.0"]

    big = add(Repo("dataset", "acme/big-data"))
    commit = big.add_commit({"README.md": make_file("README.md", b"# big-data\n"),
                             "big.bin": _big_file(workdir, big_file_size)}, "init")
    big.branches["main"] = commit.sha

    if huge_file_size:  # acme/huge-data huge.bin: any size (over 50 GB too), generated from the offset, never stored
        huge = add(Repo("dataset", "acme/huge-data"))
        commit = huge.add_commit({"README.md": make_file("README.md", b"# huge-data\n"),
                                  "huge.bin": generated_file("huge.bin", huge_file_size)}, "init")
        huge.branches["main"] = commit.sha

    # The admission policy's samples (tests/support/pickle_samples.py): benign torch.save state dicts, malicious
    # pickles, safetensors, gguf, code; the Hub's scan marks two of them.
    benign, malicious = pickle_samples.samples()
    zoo_files = {"README.md": b"---\nlicense: mit\n---\n# pickle zoo\n", "config.json": b'{"model_type": "bert"}',
                 "model.safetensors": pickle_samples.safetensors_file(), "model.gguf": pickle_samples.gguf_file(),
                 "modeling_zoo.py": b"print('remote code')\n", **benign, **malicious}
    zoo = add(Repo("model", "acme/pickle-zoo", security={"evil/os_system.bin": "unsafe", "evil/exec.pt": "caution"}))
    commit = zoo.add_commit({p: make_file(p, d, lfs=_weights(p)) for p, d in zoo_files.items()}, "init")
    zoo.branches["main"] = commit.sha
    fresh = add(Repo("model", "acme/fresh-upload", scans_done=False, card_license=""))
    commit = fresh.add_commit({"README.md": make_file("README.md", b"# fresh\n"),
                               "model.safetensors": make_file("model.safetensors", _safetensors(64, seed=9), lfs=True)},
                              "init")
    fresh.branches["main"] = commit.sha
    copyleft = add(Repo("model", "gplco/copyleft-model", card_license="gpl-3.0"))
    commit = copyleft.add_commit({"README.md": make_file("README.md", b"---\nlicense: gpl-3.0\n---\n"),
                                  "model.safetensors": make_file("model.safetensors", _safetensors(64, seed=11),
                                                                 lfs=True)}, "init")
    copyleft.branches["main"] = commit.sha

    space = add(Repo("space", "acme/tiny-space"))
    commit = space.add_commit({"app.py": make_file("app.py", b"print('hello from a space')\n"),
                               "README.md": make_file("README.md", b"---\nsdk: gradio\n---\n")}, "init")
    space.branches["main"] = commit.sha
    return repos


def _weights(path: str) -> bool:
    return path.endswith((".safetensors", ".gguf", ".bin", ".pt", ".pth", ".pkl"))


class Fixtures:
    """The ground truth, read by tests: ``emulator.files.file_bytes("model", "acme/tiny-model", "main", path)``."""

    def __init__(self, workdir: Path, big_file_size: int, huge_file_size: int = 0) -> None:
        self.repos = build_repos(workdir, big_file_size, huge_file_size)
        self.rows = {("acme/tiny-parquet", "train"): 200, ("acme/tiny-parquet", "test"): 50,
                     ("acme/private-parquet", "train"): 40, ("acme/private-parquet", "test"): 12,
                     ("acme/gated-parquet", "train"): 36, ("acme/gated-parquet", "test"): 10,
                     ("acme/tiny-jsonl", "train"): 30, ("acme/tiny-jsonl", "test"): 10}

    def repo(self, repo_type: str, repo_id: str) -> Repo:
        return self.repos[(repo_type, repo_id)]

    def _file(self, repo_type: str, repo_id: str, rev: str, path: str) -> RepoFile:
        commit = self.repo(repo_type, repo_id).resolve(rev)
        assert commit is not None, rev
        return commit.files[path]

    def commit(self, repo_type: str, repo_id: str, rev: str) -> str:
        commit = self.repo(repo_type, repo_id).resolve(rev)
        assert commit is not None, rev
        return commit.sha

    def file_bytes(self, repo_type: str, repo_id: str, rev: str, path: str) -> bytes:
        return self._file(repo_type, repo_id, rev, path).read()

    def etag(self, repo_type: str, repo_id: str, rev: str, path: str) -> str:
        return self._file(repo_type, repo_id, rev, path).etag

    def size(self, repo_type: str, repo_id: str, rev: str, path: str) -> int:
        return self._file(repo_type, repo_id, rev, path).size

    def disk_path(self, repo_type: str, repo_id: str, rev: str, path: str) -> Path | None:
        return self._file(repo_type, repo_id, rev, path).disk_path

    def paths(self, repo_type: str, repo_id: str, rev: str) -> list[str]:
        commit = self.repo(repo_type, repo_id).resolve(rev)
        assert commit is not None, rev
        return sorted(commit.files)

    def row_count(self, repo_id: str, split: str) -> int:
        return self.rows[(repo_id, split)]

    def create_repo(self, repo_type: str, repo_id: str, files: dict[str, bytes], tags: list[str] | None = None,
                    private: bool = False) -> str:
        """A new repo upstream with one commit on ``main`` (what ``EmulatorHandle.create_repo`` mirrors remotely);
        returns the commit sha."""
        if (repo_type, repo_id) in self.repos:
            raise ValueError(f"{repo_type}:{repo_id} exists")
        repo = Repo(repo_type, repo_id, private=private, hub_tags=list(tags or []))
        commit = repo.add_commit({p: make_file(p, d, lfs=p.endswith((".safetensors", ".parquet", ".bin")))
                                  for p, d in files.items()}, "initial commit")
        repo.branches["main"] = commit.sha
        self.repos[(repo_type, repo_id)] = repo
        return commit.sha

    def delete_repo(self, repo_type: str, repo_id: str) -> None:
        del self.repos[(repo_type, repo_id)]

    def push(self, repo_type: str, repo_id: str, branch: str, changes: dict[str, bytes]) -> str:
        """A new commit on ``branch`` with ``changes`` applied (what ``EmulatorHandle.push`` mirrors remotely)."""
        repo = self.repo(repo_type, repo_id)
        files = dict(repo.commits[repo.branches[branch]].files)
        files.update({p: make_file(p, d, lfs=p.endswith((".safetensors", ".parquet", ".bin")))
                      for p, d in changes.items()})
        commit = repo.add_commit(files, f"push {len(repo.commits)}")
        repo.branches[branch] = commit.sha
        return commit.sha
