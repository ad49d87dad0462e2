"""The admission rules as values: what the settings say (:class:`Rules`), what is known of a repo at a commit
(:class:`RepoFacts`), and the decision for one file (:func:`decide`), pure and in a fixed order:

    publisher -> licence -> the Hub's scan -> file type -> the mirror's own scan

The first rule that refuses decides. Every decision names its rule, so a refusal, a dry-run log line and ``policy
check`` all say the same thing.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from mirror import hf
from mirror.config import Settings

Action = Literal["allow", "block", "quarantine"]

# Formats that load by unpickling (torch.load, joblib, numpy with allow_pickle): the mirror's own scan reads them.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib", ".npy", ".npz", ".dill", ".mar",
                   ".pt2", ".zip")
# Formats that never unpickle whatever their bytes: nothing for the scan to read.
DATA_SUFFIXES = (".safetensors", ".gguf", ".json", ".txt", ".md", ".parquet", ".arrow", ".csv", ".tsv", ".jsonl",
                 ".model", ".tiktoken", ".png", ".jpg", ".jpeg", ".gif", ".webp", ".wav", ".mp3", ".flac", ".onnx",
                 ".msgpack", ".h5", ".yaml", ".yml", ".gitattributes", ".gitignore", ".py", ".ipynb", ".sh", ".cfg",
                 ".toml", ".ini", ".xml", ".html", ".vocab", ".spm", ".bpe", ".merges")


@dataclass(frozen=True)
class Rules:
    """The ``policy_*`` settings, read once."""

    dry_run: bool = False
    hub_unsafe: Action = "allow"
    hub_caution: Action = "allow"
    hub_unscanned: Action = "allow"
    allow_files: tuple[str, ...] = ()
    block_files: tuple[str, ...] = ()
    allow_licenses: tuple[str, ...] = ()
    deny_licenses: tuple[str, ...] = ()
    license_unknown: Action = "allow"
    license_other: Action = "allow"
    allow_publishers: tuple[str, ...] = ()
    deny_publishers: tuple[str, ...] = ()
    scan: bool = False
    scan_allow_globals: tuple[str, ...] = ()
    facts_ttl: float = 3600.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Rules:
        return cls(**{name: getattr(settings, f"policy_{name}") for name in cls.__dataclass_fields__})

    @property
    def needs_hub_scan(self) -> bool:
        return (self.hub_unsafe, self.hub_caution, self.hub_unscanned) != ("allow", "allow", "allow")

    @property
    def needs_license(self) -> bool:
        return bool(self.allow_licenses or self.deny_licenses) or (self.license_unknown, self.license_other) != (
            "allow", "allow")

    @property
    def needs_facts(self) -> bool:
        """The rules that read the repo's info upstream (its card's licence, the Hub's verdict)."""
        return self.needs_hub_scan or self.needs_license


@dataclass(frozen=True)
class RepoFacts:
    """What the Hub says of a repo at a commit. ``scans_done`` None: no verdict could be learned."""

    license: tuple[str, ...] | None = None  # cardData.license (a string or a list), None: none given
    scans_done: bool | None = None
    files_with_issues: dict[str, str] = field(default_factory=dict)  # path -> level (unsafe, caution)
    file_status: dict[str, str] = field(default_factory=dict)  # path -> securityFileStatus.status
    known: bool = False  # False: upstream could not be asked and nothing was remembered

    def as_json(self) -> dict[str, Any]:
        return {"license": list(self.license) if self.license is not None else None, "scans_done": self.scans_done,
                "files_with_issues": self.files_with_issues, "file_status": self.file_status, "known": self.known}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RepoFacts:
        lic = data.get("license")
        return cls(tuple(lic) if isinstance(lic, list) else None, data.get("scans_done"),
                   dict(data.get("files_with_issues") or {}), dict(data.get("file_status") or {}),
                   bool(data.get("known")))

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> RepoFacts:
        """From the Hub's repo info JSON (asked with ``securityStatus=true``)."""
        card = info.get("cardData") if isinstance(info.get("cardData"), dict) else {}
        raw = card.get("license") if card else None
        lic: tuple[str, ...] | None = None
        if isinstance(raw, str) and raw.strip():
            lic = (raw.strip(),)
        elif isinstance(raw, list):
            lic = tuple(str(x).strip() for x in raw if str(x).strip()) or None
        status = info.get("securityRepoStatus")
        scans_done: bool | None = None
        issues: dict[str, str] = {}
        if isinstance(status, dict):
            scans_done = bool(status.get("scansDone"))
            for item in status.get("filesWithIssues") or ():
                if isinstance(item, dict) and isinstance(item.get("path"), str):
                    issues[item["path"]] = str(item.get("level", "unsafe")).lower()
        return cls(lic, scans_done, issues, {}, True)


@dataclass(frozen=True)
class Decision:
    """One file's fate: ``action`` allow | block | quarantine | scan (admitted by every rule that needs no bytes;
    its bytes are scanned before the first serve), the rule that decided, and why."""

    action: Literal["allow", "block", "quarantine", "scan"]
    rule: str
    reason: str

    @property
    def refused(self) -> bool:
        return self.action in ("block", "quarantine")


ALLOW = Decision("allow", "-", "admitted")


def _suffix(path: str) -> str:
    name = path.rsplit("/", 1)[-1].lower()
    return "." + name.rsplit(".", 1)[-1] if "." in name else ""


def needs_scan(path: str) -> bool:
    """Files the mirror's own scan reads: pickle-class suffixes, and any suffix that is no known data format (a
    pickle can be named anything; ``torch.load`` does not care)."""
    suffix = _suffix(path)
    return suffix in PICKLE_SUFFIXES or suffix not in DATA_SUFFIXES


def _glob_match(patterns: tuple[str, ...], path: str) -> str | None:
    name = path.rsplit("/", 1)[-1]
    for pattern in patterns:
        target = path if "/" in pattern else name
        if fnmatch.fnmatchcase(target.lower(), pattern.lower()):
            return pattern
    return None


def _publisher_match(patterns: tuple[str, ...], repo: hf.RepoRef) -> str | None:
    namespace = repo.repo_id.split("/", 1)[0] if "/" in repo.repo_id else ""
    for pattern in patterns:
        kind, _, name = pattern.rpartition(":")
        if kind and kind.rstrip("s") != repo.type.value:
            continue
        if fnmatch.fnmatchcase(namespace.lower(), name.lower()):
            return pattern
    return None


_SPDX_SPLIT = re.compile(r"\s+OR\s+", re.I)
_SPDX_AND = re.compile(r"\s+(?:AND|WITH)\s+", re.I)


def _license(rules: Rules, licenses: tuple[str, ...] | None) -> Decision | None:
    """The licence rules over an SPDX expression (or the card's list): ``a OR b`` passes when one alternative
    does; in ``a AND b`` every part must."""
    if licenses is None or all(x.lower() in ("unknown", "") for x in licenses):
        if rules.license_unknown != "allow":
            return Decision(rules.license_unknown, "license-unknown", "the repo's card declares no licence")
        return None
    alternatives = [alt for lic in licenses for alt in _SPDX_SPLIT.split(lic.strip("() "))]
    reasons = []
    for alt in alternatives:
        parts = [p.strip("() ").lower() for p in _SPDX_AND.split(alt) if p.strip("() ")]
        if "other" in parts and rules.license_other != "allow":
            reasons.append(("license-other", rules.license_other, "the card's licence is 'other'"))
            continue
        denied = [p for p in parts if p in {d.lower() for d in rules.deny_licenses}]
        if denied:
            reasons.append(("license", "block", f"licence {denied[0]} is on the deny list"))
            continue
        allowed = {a.lower() for a in rules.allow_licenses} | {"other"}
        unlisted = [p for p in parts if p not in allowed] if rules.allow_licenses else []
        if unlisted:
            reasons.append(("license", "block", f"licence {unlisted[0]} is not on the allow list"))
            continue
        return None  # this alternative passes
    rule, action, reason = reasons[0]
    return Decision(action, rule, reason)  # type: ignore[arg-type]


def _hub_scan(rules: Rules, facts: RepoFacts, path: str) -> Decision | None:
    level = facts.file_status.get(path) or facts.files_with_issues.get(path)
    level = (level or "").lower()
    if level in ("unsafe", "caution"):
        action = rules.hub_unsafe if level == "unsafe" else rules.hub_caution
        if action != "allow":
            return Decision(action, f"hub-scan-{level}", f"the Hub's scan marks the file {level}")
        return None
    if not facts.known or not facts.scans_done:
        if rules.hub_unscanned != "allow":
            why = "no verdict of the Hub's scan could be learned" if not facts.known else "the Hub has not scanned it"
            return Decision(rules.hub_unscanned, "hub-scan-unscanned", why)
    return None


def decide(rules: Rules, repo: hf.RepoRef, path: str, facts: RepoFacts | None) -> Decision:
    """The decision for ``path`` of ``repo`` from every rule that needs no bytes (``scan``: the mirror's own scan
    is still to come)."""
    matched = _publisher_match(rules.deny_publishers, repo)
    if matched:
        return Decision("block", "publisher", f"publisher {repo.repo_id.split('/')[0]!r} matches deny {matched!r}")
    if rules.allow_publishers and not _publisher_match(rules.allow_publishers, repo):
        return Decision("block", "publisher", f"{repo.type.value} publisher {repo.repo_id.split('/')[0]!r} is not "
                        "on the allow list")
    if rules.needs_license:
        found = _license(rules, facts.license if facts is not None and facts.known else None)
        if found is not None:
            return found
    if rules.needs_hub_scan:
        found = _hub_scan(rules, facts or RepoFacts(), path)
        if found is not None:
            return found
    matched = _glob_match(rules.block_files, path)
    if matched:
        return Decision("block", "file-type", f"matches block pattern {matched!r}")
    if rules.allow_files and not _glob_match(rules.allow_files, path):
        return Decision("block", "file-type", "matches no allowed file pattern")
    if rules.scan and needs_scan(path):
        return Decision("scan", "mirror-scan", "pickle-class: scanned before the first serve")
    return ALLOW
