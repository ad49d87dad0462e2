"""The sync manifest (``sync.toml``): which repos, revisions and files to pre-fetch, read and checked."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirror import hf
from mirror.config import ConfigError
from mirror.errors import BadRequest

REPO_KEYS = frozenset({"type", "id", "revisions", "allow", "ignore", "token_env"})
TOP_KEYS = frozenset({"concurrency", "repo"})


class ManifestError(ConfigError):
    """The manifest cannot be used; the message says where and why."""


@dataclass(frozen=True)
class RepoSpec:
    repo: hf.RepoRef
    revisions: tuple[str, ...]
    allow: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    token_env: str | None = None

    @property
    def label(self) -> str:
        return f"{self.repo.type.value}:{self.repo.repo_id}"


@dataclass(frozen=True)
class Manifest:
    path: Path
    repos: tuple[RepoSpec, ...]
    concurrency: int | None = None

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


def parse_manifest(data: dict[str, Any], path: Path) -> Manifest:
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ManifestError(f"{path}: unknown key(s) {', '.join(unknown)} (expected concurrency and [[repo]] tables)")
    concurrency = data.get("concurrency")
    if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                    or concurrency < 1):
        raise ManifestError(f"{path}: concurrency must be a positive integer")
    tables = data.get("repo", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ManifestError(f"{path}: repos are [[repo]] tables")
    repos: list[RepoSpec] = []
    for number, table in enumerate(tables, 1):
        where = f"{path}: [[repo]] #{number}"
        unknown = sorted(set(table) - REPO_KEYS)
        if unknown:
            raise ManifestError(f"{where}: unknown key(s) {', '.join(unknown)}")
        repo_type = table.get("type", "model")
        try:
            kind = hf.RepoType(repo_type)
        except ValueError:
            raise ManifestError(f"{where}: type must be model, dataset or space, not {repo_type!r}") from None
        repo_id = table.get("id")
        if not isinstance(repo_id, str):
            raise ManifestError(f"{where}: id (\"namespace/name\") is required")
        try:
            hf.validate_repo_id(repo_id)
        except BadRequest as exc:
            raise ManifestError(f"{where}: {exc.message}") from None
        where = f"{path}: {kind.value}:{repo_id}"
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
        repos.append(RepoSpec(hf.RepoRef(kind, repo_id), tuple(dict.fromkeys(revisions)),
                              _patterns(table.get("allow"), f"{where}: allow"),
                              _patterns(table.get("ignore"), f"{where}: ignore"), token_env))
    seen: set[str] = set()
    for spec in repos:
        if spec.label in seen:
            raise ManifestError(f"{path}: {spec.label} is listed twice; put all its revisions in one table")
        seen.add(spec.label)
    return Manifest(path, tuple(repos), concurrency)


def load_manifest(path: Path) -> Manifest:
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"manifest {path} is not valid TOML: {exc}") from None
    return parse_manifest(data, Path(path))
