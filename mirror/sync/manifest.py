"""The sync manifest (``sync.toml``): which repos, revisions and files to pre-fetch, read and checked.

``[[repo]]`` tables name one repo each; ``[[select]]`` tables select repos by author and type (optionally a name
glob, the Hub's list ``filter`` values and ``search``), listed upstream at every run (:mod:`mirror.sync.expand`)."""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, StringConstraints, ValidationError

from mirror import hf
from mirror.errors import BadRequest, ManifestError

PARQUET_REF = "refs/convert/parquet"  # the Hub's parquet conversion of a dataset (``parquet_branch = true``)


_M = TypeVar("_M", bound="BaseModel")


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


# What each key must be, said once: the message of any value pydantic refuses for it.
_RULES = {
    "type": "type must be model, dataset or space",
    "id": "id (\"namespace/name\") is required",
    "revisions": "revisions must be a non-empty list of branches, tags or commit shas",
    "allow": "allow must be a list of glob patterns",
    "ignore": "ignore must be a list of glob patterns",
    "token_env": "token_env must be the name of an environment variable",
    "parquet_branch": "parquet_branch must be true or false",
    "author": "author (an organisation or user name) is required",
    "name": "name must be a glob (or a list of globs) matched against the repo name after author/, e.g. \"bert-*\"",
    "filter": "filter must be a list of the Hub's list filters (tags such as \"transformers\" or \"license:mit\")",
    "search": "search must be a non-empty string (the Hub's search= substring)",
    "concurrency": "concurrency must be a positive integer",
    "repo": "repo entries are [[repo]] tables",
    "select": "select entries are [[select]] tables",
}

_Text = Annotated[str, StringConstraints(min_length=1), Strict()]
_Texts = Annotated[list[_Text], Field(min_length=1)]


def _listed(value: Any) -> Any:
    return [value] if isinstance(value, str) else value  # one string where a list is expected


class _Table(BaseModel):
    """The keys [[repo]] and [[select]] share."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    type: Literal["model", "dataset", "space"] = "model"
    revisions: Annotated[list[Annotated[str, Strict()]], Field(min_length=1), BeforeValidator(_listed)] = ["main"]
    allow: Annotated[_Texts | None, BeforeValidator(_listed)] = None
    ignore: Annotated[_Texts | None, BeforeValidator(_listed)] = None
    token_env: _Text | None = None
    parquet_branch: bool = False

    def options(self, where: str) -> dict[str, Any]:
        for revision in self.revisions:
            try:
                hf.validate_revision(revision)
            except BadRequest as exc:
                raise ManifestError(f"{where}: {exc.message}") from None
        if self.parquet_branch and self.type != "dataset":
            raise ManifestError(f"{where}: parquet_branch ({PARQUET_REF}) exists only for datasets "
                                "(type = \"dataset\")")
        return {"revisions": tuple(dict.fromkeys(self.revisions)), "token_env": self.token_env,
                "allow": None if self.allow is None else tuple(self.allow),
                "ignore": None if self.ignore is None else tuple(self.ignore), "parquet_branch": self.parquet_branch}


class _RepoTable(_Table):
    id: str


class _SelectTable(_Table):
    author: _Text
    name: Annotated[_Texts | None, BeforeValidator(_listed)] = None
    filter: Annotated[_Texts | None, BeforeValidator(lambda v: _listed(v) or None)] = None
    search: _Text | None = None


class _ManifestFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    concurrency: Annotated[int, Field(ge=1)] | None = None
    repo: list[dict[str, Any]] = []
    select: list[dict[str, Any]] = []


def _read(model: type[_M], data: Any, where: str) -> _M:
    """``data`` as ``model``, or a :class:`ManifestError` naming the place and the key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
        if unknown:
            hint = ""
            if model is _SelectTable and "id" in unknown:
                hint = " (a [[select]] lists repos by author; name one repo with a [[repo]] table)"
            elif model is _ManifestFile:
                hint = " (expected concurrency, [[repo]] and [[select]] tables)"
            raise ManifestError(f"{where}: unknown key(s) {', '.join(unknown)}{hint}") from None
        key = str(errors[0]["loc"][0]) if errors[0]["loc"] else ""
        raise ManifestError(f"{where}: {_RULES.get(key, errors[0]['msg'])}") from None


def _select(table: dict[str, Any], number: int, path: Path) -> SelectSpec:
    where = f"{path}: [[select]] #{number}"
    rule = _read(_SelectTable, table, where)
    try:
        hf.validate_repo_id(rule.author)
    except BadRequest:
        raise ManifestError(f"{where}: author must be one organisation or user name, not {rule.author!r}") from None
    if "/" in rule.author:
        raise ManifestError(f"{where}: author must be one organisation or user name, not {rule.author!r}")
    if rule.name is not None and any("/" in n for n in rule.name):
        raise ManifestError(f"{where}: name globs match the repo name without its author: no \"/\"")
    return SelectSpec(number, hf.RepoType(rule.type), rule.author, None if rule.name is None else tuple(rule.name),
                      tuple(rule.filter or ()), rule.search, **rule.options(where))


def _repo(table: dict[str, Any], number: int, path: Path) -> RepoSpec:
    entry = _read(_RepoTable, table, f"{path}: [[repo]] #{number}")
    try:
        hf.validate_repo_id(entry.id)
    except BadRequest as exc:
        raise ManifestError(f"{path}: [[repo]] #{number}: {exc.message}") from None
    return RepoSpec(hf.RepoRef(hf.RepoType(entry.type), entry.id),
                    **entry.options(f"{path}: {entry.type}:{entry.id}"))


def parse_manifest(data: dict[str, Any], path: Path) -> Manifest:
    top = _read(_ManifestFile, data, str(path))
    repos = [_repo(table, number, path) for number, table in enumerate(top.repo, 1)]
    seen: set[str] = set()
    for spec in repos:
        if spec.label in seen:
            raise ManifestError(f"{path}: {spec.label} is listed twice; put all its revisions in one table")
        seen.add(spec.label)
    selects = tuple(_select(table, number, path) for number, table in enumerate(top.select, 1))
    keys: dict[str, int] = {}
    for rule in selects:
        if rule.key in keys:
            raise ManifestError(f"{path}: [[select]] #{rule.number} repeats [[select]] #{keys[rule.key]} "
                                f"({rule.key})")
        keys[rule.key] = rule.number
    return Manifest(path, tuple(repos), top.concurrency, selects)


def load_manifest(path: Path) -> Manifest:
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"manifest {path} is not valid TOML: {exc}") from None
    return parse_manifest(data, Path(path))
