"""The sync manifest (``sync.toml``): which repos, revisions and files to pre-fetch, read and checked.

``[[repo]]`` tables name one repo each; ``[[select]]`` tables select repos by author and type (optionally a name
glob, the Hub's list ``filter`` values and ``search``), listed upstream at every run (:mod:`mirror.sync.expand`)."""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirror import hf
from mirror.config import ConfigError
from mirror.errors import BadRequest

SHARED_KEYS = frozenset({"type", "revisions", "allow", "ignore", "token_env", "parquet_branch"})
REPO_KEYS = SHARED_KEYS | {"id"}
SELECT_KEYS = SHARED_KEYS | {"author", "name", "filter", "search"}
TOP_KEYS = frozenset({"concurrency", "repo", "select"})
PARQUET_REF = "refs/convert/parquet"  # the Hub's parquet conversion of a dataset (``parquet_branch = true``)


class ManifestError(ConfigError):
    """The manifest cannot be used; the message says where and why."""


@dataclass(frozen=True)
class RepoSpec:
    repo: hf.RepoRef
    revisions: tuple[str, ...]
    allow: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    token_env: str | None = None
    parquet_branch: bool = False  # also sync refs/convert/parquet (datasets), whole: allow/ignore do not apply
    selected_by: str | None = None  # the [[select]] rule that listed it (None: a [[repo]] table)

    @property
    def label(self) -> str:
        return f"{self.repo.type.value}:{self.repo.repo_id}"

    @property
    def all_revisions(self) -> tuple[str, ...]:
        """The revisions a run syncs: ``revisions``, plus the parquet conversion branch when asked for."""
        if self.parquet_branch and PARQUET_REF not in self.revisions:
            return (*self.revisions, PARQUET_REF)
        return self.revisions


@dataclass(frozen=True)
class SelectSpec:
    """A ``[[select]]`` table: every repo of ``type`` by ``author`` that upstream's list API returns for
    ``filter`` (each value must match, as the Hub's ``filter=``) and ``search``, whose name matches one of the
    ``names`` globs; each synced like a ``[[repo]]`` with the same options."""

    number: int
    type: hf.RepoType
    author: str
    names: tuple[str, ...] | None = None
    filters: tuple[str, ...] = ()
    search: str | None = None
    revisions: tuple[str, ...] = ("main",)
    allow: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    token_env: str | None = None
    parquet_branch: bool = False

    @property
    def key(self) -> str:
        """The rule's identity in the state file (stable when tables are reordered)."""
        parts = [f"{self.type.value}s", f"author={self.author}"]
        if self.names is not None:
            parts.append("name=" + ",".join(self.names))
        parts += [f"filter={f}" for f in self.filters]
        if self.search is not None:
            parts.append(f"search={self.search}")
        return " ".join(parts)

    @property
    def label(self) -> str:
        return f"[[select]] #{self.number} ({self.key})"

    def query(self) -> list[tuple[str, str]]:
        """The list API's query (``/api/{type}s?author=...&filter=...&search=...``), as huggingface_hub sends it."""
        query = [("author", self.author), *(("filter", f) for f in self.filters)]
        if self.search is not None:
            query.append(("search", self.search))
        return query

    def matches(self, repo_id: str) -> bool:
        """Listed by this author (the Hub's ``author=`` is exact) and, with ``names``, a name glob matches (the
        part after ``author/``; fnmatch, case-sensitive)."""
        author, _, name = repo_id.rpartition("/")
        if author != self.author:
            return False
        return self.names is None or any(fnmatch.fnmatchcase(name, glob) for glob in self.names)

    def spec(self, repo_id: str) -> RepoSpec:
        return RepoSpec(hf.RepoRef(self.type, repo_id), self.revisions, self.allow, self.ignore, self.token_env,
                        self.parquet_branch, selected_by=self.label)


@dataclass(frozen=True)
class Manifest:
    path: Path
    repos: tuple[RepoSpec, ...]
    concurrency: int | None = None
    selects: tuple[SelectSpec, ...] = ()

    @property
    def selections(self) -> tuple[SelectSpec, ...]:
        """The [[select]] rules (another name for ``selects``, as tests/e2e/test_deploy.py reads it)."""
        return self.selects

    @property
    def source(self) -> str:
        """The name pins are recorded under (the manifest's absolute path)."""
        return str(self.path.resolve())


def _patterns(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise ManifestError(f"{where}: must be a list of glob patterns")
    return tuple(value)


def _strings(value: Any, where: str, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ManifestError(f"{where}: {what}")
    return tuple(value)


def _kind(table: dict[str, Any], where: str) -> hf.RepoType:
    repo_type = table.get("type", "model")
    try:
        return hf.RepoType(repo_type)
    except ValueError:
        raise ManifestError(f"{where}: type must be model, dataset or space, not {repo_type!r}") from None


def _options(table: dict[str, Any], kind: hf.RepoType, where: str) -> dict[str, Any]:
    """The keys [[repo]] and [[select]] share: revisions, allow, ignore, token_env, parquet_branch."""
    revisions = table.get("revisions", ["main"])
    if isinstance(revisions, str):
        revisions = [revisions]
    if not isinstance(revisions, list) or not revisions or not all(isinstance(r, str) for r in revisions):
        raise ManifestError(f"{where}: revisions must be a non-empty list of branches, tags or commit shas")
    for revision in revisions:
        try:
            hf.validate_revision(revision)
        except BadRequest as exc:
            raise ManifestError(f"{where}: {exc.message}") from None
    token_env = table.get("token_env")
    if token_env is not None and (not isinstance(token_env, str) or not token_env):
        raise ManifestError(f"{where}: token_env must be the name of an environment variable")
    parquet_branch = table.get("parquet_branch", False)
    if not isinstance(parquet_branch, bool):
        raise ManifestError(f"{where}: parquet_branch must be true or false")
    if parquet_branch and kind is not hf.RepoType.DATASET:
        raise ManifestError(f"{where}: parquet_branch ({PARQUET_REF}) exists only for datasets (type = \"dataset\")")
    return {"revisions": tuple(dict.fromkeys(revisions)), "allow": _patterns(table.get("allow"), f"{where}: allow"),
            "ignore": _patterns(table.get("ignore"), f"{where}: ignore"), "token_env": token_env,
            "parquet_branch": parquet_branch}


def _tables(data: dict[str, Any], key: str, path: Path) -> list[dict[str, Any]]:
    tables = data.get(key, [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ManifestError(f"{path}: {key} entries are [[{key}]] tables")
    return tables


def _select(table: dict[str, Any], number: int, path: Path) -> SelectSpec:
    where = f"{path}: [[select]] #{number}"
    unknown = sorted(set(table) - SELECT_KEYS)
    if unknown:
        hint = " (a [[select]] lists repos by author; name one repo with a [[repo]] table)" if "id" in unknown else ""
        raise ManifestError(f"{where}: unknown key(s) {', '.join(unknown)}{hint}")
    kind = _kind(table, where)
    author = table.get("author")
    if not isinstance(author, str) or not author:
        raise ManifestError(f"{where}: author (an organisation or user name) is required")
    try:
        hf.validate_repo_id(author)
    except BadRequest:
        raise ManifestError(f"{where}: author must be one organisation or user name, not {author!r}") from None
    if "/" in author:
        raise ManifestError(f"{where}: author must be one organisation or user name, not {author!r}")
    names = _strings(table.get("name"), where, "name must be a glob (or a list of globs) matched against the "
                                              "repo name after author/, e.g. \"bert-*\"")
    if names is not None and any("/" in n for n in names):
        raise ManifestError(f"{where}: name globs match the repo name without its author: no \"/\"")
    filters = _strings(table.get("filter") or None, where, "filter must be a list of the Hub's list filters "
                                                           "(tags such as \"transformers\" or \"license:mit\")")
    search = table.get("search")
    if search is not None and (not isinstance(search, str) or not search):
        raise ManifestError(f"{where}: search must be a non-empty string (the Hub's search= substring)")
    return SelectSpec(number, kind, author, names, filters or (), search, **_options(table, kind, f"{where}"))


def parse_manifest(data: dict[str, Any], path: Path) -> Manifest:
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ManifestError(f"{path}: unknown key(s) {', '.join(unknown)} (expected concurrency, [[repo]] and "
                            "[[select]] tables)")
    concurrency = data.get("concurrency")
    if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                    or concurrency < 1):
        raise ManifestError(f"{path}: concurrency must be a positive integer")
    repos: list[RepoSpec] = []
    for number, table in enumerate(_tables(data, "repo", path), 1):
        where = f"{path}: [[repo]] #{number}"
        unknown = sorted(set(table) - REPO_KEYS)
        if unknown:
            raise ManifestError(f"{where}: unknown key(s) {', '.join(unknown)}")
        kind = _kind(table, where)
        repo_id = table.get("id")
        if not isinstance(repo_id, str):
            raise ManifestError(f"{where}: id (\"namespace/name\") is required")
        try:
            hf.validate_repo_id(repo_id)
        except BadRequest as exc:
            raise ManifestError(f"{where}: {exc.message}") from None
        repos.append(RepoSpec(hf.RepoRef(kind, repo_id), **_options(table, kind, f"{path}: {kind.value}:{repo_id}")))
    seen: set[str] = set()
    for spec in repos:
        if spec.label in seen:
            raise ManifestError(f"{path}: {spec.label} is listed twice; put all its revisions in one table")
        seen.add(spec.label)
    selects = tuple(_select(table, number, path) for number, table in enumerate(_tables(data, "select", path), 1))
    keys: dict[str, int] = {}
    for rule in selects:
        if rule.key in keys:
            raise ManifestError(f"{path}: [[select]] #{rule.number} repeats [[select]] #{keys[rule.key]} "
                                f"({rule.key})")
        keys[rule.key] = rule.number
    return Manifest(path, tuple(repos), concurrency, selects)


def load_manifest(path: Path) -> Manifest:
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"manifest {path} is not valid TOML: {exc}") from None
    return parse_manifest(data, Path(path))
