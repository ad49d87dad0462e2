"""The bill of materials of one cached revision: a CycloneDX ML-BOM (``hf-mirror sbom REPO@REV``).

What the mirror holds of the revision, from its index and store (no upstream request: the BOM describes what was
admitted): the repo as the BOM's subject (``machine-learning-model``, or ``data`` for a dataset) at its commit, with
the licence of its card (``cardData.license`` of the cached info, else the README's front matter); each file as a
``file`` component with its hashes (SHA-256: the LFS etag, or computed from the cached blob of a small file; the git
blob id as a property), its size, whether the blob is cached, and the Hub's scan verdict where a cached answer
carried it (``securityRepoStatus`` of the info, ``securityFileStatus`` of paths-info or tree entries), and the
mirror's own admission decision where the audit log recorded a refusal or a quarantine (``hf-mirror:admission``,
``hf-mirror:rule``). Written by
cyclonedx-python-lib (the CycloneDX project's own Python library), checked against the schema before it is printed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from cyclonedx.factory.license import LicenseFactory
from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from mirror import __version__, hf
from mirror.errors import NotCached
from mirror.index import ApiEntry, FileEntry, MetadataIndex
from mirror.storage.base import BlobStore

_HASH_MAX = 64 * 1024**2  # a non-LFS file (a git blob id, not a content hash) is hashed from its blob up to this size
_FRONT_MATTER = re.compile(rb"\A---\s*\n(.*?)\n---\s*(\n|\Z)", re.S)
_LICENSE_LINE = re.compile(r"^license:\s*(.+?)\s*$", re.M)
_PROP = "huggingface:"  # the Hub's facts
_OURS = "hf-mirror:"  # the mirror's


@dataclass
class RevisionFacts:
    """What the cache knows of a revision besides its files: the info JSON and the Hub's per-file verdicts."""

    info: dict[str, Any] = field(default_factory=dict)
    file_status: dict[str, Any] = field(default_factory=dict)  # path -> securityFileStatus


Decisions = dict[str, tuple[str, str | None]]  # path -> (refused | quarantined, rule), from the audit log


Scan = Callable[[str], tuple[bool, str] | None]  # etag -> (passed, summary) of the mirror's own scan, if it ran


async def build_sbom(index: MetadataIndex, store: BlobStore, repo: hf.RepoRef, revision: str,
                     decisions: Callable[[str], Decisions] | None = None, scan: Scan | None = None) -> Bom:
    """``decisions(commit)``: the admission policy's refusals of the commit's files, as the audit log recorded them;
    ``scan(etag)``: the verdict of the mirror's own scan of a file (the admission ledger's), where it ran."""
    commit = revision if hf.is_commit(revision) else (ref.commit if (ref := index.get_ref(repo, revision)) else None)
    if commit is None:
        raise NotCached(f"{repo.key}: revision {revision!r} is not known to the mirror")
    entries = sorted((e for e in index.files_at(repo, commit) if not e.missing), key=lambda e: e.path)
    if not entries:
        raise NotCached(f"{repo.key}@{revision}: no file of commit {commit} is known to the mirror")
    facts = _facts(index, repo, commit, revision)
    refused = decisions(commit) if decisions is not None else {}
    licence = _card_licence(facts.info) or _readme_licence(store, entries)

    purl = PackageURL(type="huggingface", namespace=repo.repo_id.rpartition("/")[0] or None,
                      name=repo.repo_id.rpartition("/")[2], version=commit,
                      qualifiers={"repository_type": repo.type.value} if repo.type is not hf.RepoType.MODEL else None)
    subject = Component(
        type=ComponentType.DATA if repo.type is hf.RepoType.DATASET else ComponentType.MACHINE_LEARNING_MODEL,
        name=repo.repo_id, version=commit, bom_ref=f"{repo.key}@{commit}", purl=purl,
        licenses=[LicenseFactory().make_from_string(licence)] if licence else [],
        properties=_subject_properties(repo, revision, facts))
    bom = Bom()
    bom.metadata.component = subject
    bom.metadata.properties.add(Property(name=f"{_OURS}version", value=__version__))
    for entry in entries:
        component = await _file_component(store, repo, entry, facts.file_status.get(entry.path),
                                          refused.get(entry.path), scan(entry.etag) if scan is not None else None)
        bom.components.add(component)
        bom.register_dependency(subject, [component])
    return bom


def render(bom: Bom) -> str:
    """The BOM as CycloneDX 1.6 JSON, validated against the schema (a ValueError names what is wrong)."""
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise ValueError(f"the bill of materials does not validate against CycloneDX 1.6: {error}")
    return text


def _subject_properties(repo: hf.RepoRef, revision: str, facts: RevisionFacts) -> list[Property]:
    props = [Property(name=f"{_PROP}repo_type", value=repo.type.value),
             Property(name=f"{_PROP}revision", value=revision)]
    status = facts.info.get("securityRepoStatus")
    if status is not None:
        props.append(Property(name=f"{_PROP}securityRepoStatus", value=json.dumps(status, sort_keys=True)))
    for key in ("author", "pipeline_tag", "library_name", "gated"):
        value = facts.info.get(key)
        if value not in (None, ""):
            props.append(Property(name=f"{_PROP}{key}", value=str(value)))
    return props


async def _file_component(store: BlobStore, repo: hf.RepoRef, entry: FileEntry, status: Any,
                          refused: tuple[str, str | None] | None, scanned: tuple[bool, str] | None) -> Component:
    hashes = []
    if entry.lfs and re.fullmatch(r"[0-9a-f]{64}", entry.etag):
        hashes.append(HashType(alg=HashAlgorithm.SHA_256, content=entry.etag))  # an LFS etag is the content's SHA-256
    # This node's copy only (cached_path never fetches: a BOM of a fleet's bucket downloads nothing).
    local = store.cached_path(entry.etag)
    if local is not None and not entry.lfs and entry.size <= _HASH_MAX:
        hashes.append(HashType(alg=HashAlgorithm.SHA_256, content=hashlib.sha256(local.read_bytes()).hexdigest()))
    cached = local is not None or await store.stat(entry.etag) is not None
    props = [Property(name=f"{_PROP}etag", value=entry.etag), Property(name=f"{_PROP}size", value=str(entry.size)),
             Property(name=f"{_PROP}lfs", value=str(entry.lfs).lower()),
             Property(name=f"{_OURS}cached", value=str(cached).lower())]
    if not entry.lfs:
        props.append(Property(name=f"{_PROP}git_blob_sha1", value=entry.etag))
    if status is not None:
        props.append(Property(name=f"{_PROP}securityFileStatus",
                              value=status if isinstance(status, str) else json.dumps(status, sort_keys=True)))
    if scanned is not None:  # the mirror's own scan of the bytes (allowlist-first): its verdict and what it found
        props.append(Property(name=f"{_OURS}scan", value="passed" if scanned[0] else "failed"))
        props.append(Property(name=f"{_OURS}scan_summary", value=scanned[1]))
    if refused is not None:  # the mirror's own decision: refused or quarantined, and the rule (the audit log's)
        props.append(Property(name=f"{_OURS}admission", value=refused[0]))
        if refused[1]:
            props.append(Property(name=f"{_OURS}rule", value=refused[1]))
    return Component(type=ComponentType.FILE, name=entry.path, version=entry.commit,
                     bom_ref=f"{repo.key}@{entry.commit}/{quote(entry.path)}", hashes=hashes, properties=props)


def _facts(index: MetadataIndex, repo: hf.RepoRef, commit: str, revision: str) -> RevisionFacts:
    """The cached info of the commit (the one with the most fields, e.g. with securityStatus) and the Hub's
    per-file verdicts from cached paths-info and tree answers of the same revision."""
    facts = RevisionFacts()
    for key_revision, entry in index.api_entries(repo):
        data = _json(entry)
        if isinstance(data, dict) and data.get("sha") == commit and len(data) > len(facts.info):
            facts.info = data
        elif isinstance(data, list) and key_revision in (commit, revision):
            for item in data:
                if isinstance(item, dict) and isinstance(item.get("path"), str) and "securityFileStatus" in item:
                    facts.file_status[item["path"]] = item["securityFileStatus"]
    return facts


def _json(entry: ApiEntry) -> Any:
    if entry.status != 200 or entry.body[:1] not in (b"{", b"["):
        return None
    try:
        return json.loads(entry.body)
    except ValueError:
        return None


def _card_licence(info: dict[str, Any]) -> str | None:
    card = info.get("cardData")
    value = card.get("license") if isinstance(card, dict) else None
    if isinstance(value, list):  # several licences on the card: any of them (the Hub's list reads as OR)
        value = " OR ".join(str(v) for v in value if v)
    return str(value) if value else None


def _readme_licence(store: BlobStore, entries: list[FileEntry]) -> str | None:
    readme = next((e for e in entries if e.path == "README.md"), None)
    if readme is None or readme.size > _HASH_MAX:
        return None
    path = store.cached_path(readme.etag)
    if path is None:
        return None
    match = _FRONT_MATTER.match(path.read_bytes())
    line = _LICENSE_LINE.search(match.group(1).decode(errors="replace")) if match else None
    return line.group(1).strip("'\"") if line else None
