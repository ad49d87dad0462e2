"""The admission policy's pure parts: the mirror's own scan on the generated samples (benign ones pass, every
malicious one fails, naming the global), the rules' decisions, and the ``[policy]`` table of the settings file."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from mirror import hf
from mirror.admission import Ledger, RepoFacts, Rules, decide, scan_bytes
from mirror.config import ConfigError, Settings
from mirror.layout import CacheLayout
from tests.support import pickle_samples

BENIGN, MALICIOUS = pickle_samples.samples()
MODEL = hf.RepoRef(hf.RepoType.MODEL, "acme/m")


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_benign_state_dicts_pass(name: str) -> None:
    verdict = scan_bytes(BENIGN[name])
    assert verdict.passed and verdict.pickles >= 1, verdict


@pytest.mark.parametrize(("name", "global_name"), [
    ("evil/os_system.bin", "posix.system"), ("evil/os_system_p0.pkl", "posix.system"),
    ("evil/os_system_p5.pkl", "posix.system"), ("evil/exec.pt", "exec"), ("evil/nested.pkl", "pickle.loads"),
    ("evil/hidden.pth", "archive/notes.txt: posix.system"),
])
def test_malicious_pickles_fail_naming_the_global(name: str, global_name: str) -> None:
    verdict = scan_bytes(MALICIOUS[name])
    assert not verdict.passed and global_name in verdict.summary, verdict


def test_formats_without_pickles_pass_and_an_unknown_global_fails() -> None:
    for data in (pickle_samples.safetensors_file(), pickle_samples.gguf_file(), b"plain text\n"):
        assert scan_bytes(data).passed
    # Allowlist-first: a global on no deny list (a team's own class) fails until the operator admits it.
    own = b"\x80\x02cmylib.layers\nCustom\n)R."
    assert not scan_bytes(own).passed
    assert scan_bytes(own, extra_globals=("mylib.layers.Custom",)).passed
    # A zip inside the zip is opened too.
    nested = pickle_samples.torch_zip(pickle_samples.state_dict_pickle({"w": (1,)}), [struct.pack("<f", 1)],
                                      extra={"inner.zip": MALICIOUS["evil/hidden.pth"]})
    assert "builtins.exec" in scan_bytes(nested).summary


def test_the_scan_is_bounded_and_fails_closed() -> None:
    # A length field in tensor bytes past the end: no pickle loads from there, and nothing is read into memory.
    assert scan_bytes(b"\x8e" + struct.pack("<Q", 2**40) + bytes(1000)).passed
    # A protocol 0 argument line too long to scan, hiding a payload behind it: the file fails.
    hidden = b"S'" + b"a" * (2 * 1024 * 1024) + b"'\n0cposix\nsystem\n(S'id'\ntR."
    assert "not scanned" in scan_bytes(hidden).summary


def test_rules_in_order_and_their_cases() -> None:
    rules = Rules(allow_publishers=("acme", "dataset:hf*"), allow_licenses=("mit", "apache-2.0"),
                  license_other="quarantine", block_files=("*.py",), scan=True)
    facts = RepoFacts(("mit",), True, {}, {}, True)
    assert decide(rules, hf.RepoRef(hf.RepoType.MODEL, "evil/m"), "a.safetensors", facts).rule == "publisher"
    assert decide(rules, hf.RepoRef(hf.RepoType.DATASET, "hfdata/d"), "a.parquet", facts).action == "allow"
    assert decide(rules, hf.RepoRef(hf.RepoType.MODEL, "hfdata/m"), "a.parquet", facts).rule == "publisher"
    assert decide(rules, MODEL, "modeling.py", facts).rule == "file-type"
    assert decide(rules, MODEL, "pytorch_model.bin", facts).action == "scan"
    assert decide(rules, MODEL, "model.safetensors", facts).action == "allow"
    gpl = RepoFacts(("gpl-3.0 OR mit",), True, {}, {}, True)  # one side of an OR passes
    assert decide(rules, MODEL, "a.json", gpl).action == "allow"
    both = RepoFacts(("mit AND gpl-3.0",), True, {}, {}, True)  # every side of an AND must
    assert decide(rules, MODEL, "a.json", both).reason == "licence gpl-3.0 is not on the allow list"
    other = decide(rules, MODEL, "a.json", RepoFacts(("other",), True, {}, {}, True))
    assert (other.action, other.rule) == ("quarantine", "license-other")
    unknown = Rules(license_unknown="block", deny_licenses=("cc-by-nc-4.0",))
    assert decide(unknown, MODEL, "a.json", RepoFacts((), True, {}, {}, True)).rule == "license-unknown"
    assert decide(unknown, MODEL, "a.json", RepoFacts()).rule == "license-unknown"  # nothing learned: unknown
    assert decide(unknown, MODEL, "a.json", RepoFacts(("CC-BY-NC-4.0",), known=True)).rule == "license"


def test_the_hub_scan_cases() -> None:
    rules = Rules(hub_unsafe="block", hub_caution="quarantine", hub_unscanned="block")
    scanned = RepoFacts(None, True, {"a.bin": "unsafe"}, {"b.pt": "caution", "c.pt": "safe"}, True)
    assert decide(rules, MODEL, "a.bin", scanned).rule == "hub-scan-unsafe"
    assert decide(rules, MODEL, "b.pt", scanned).action == "quarantine"
    assert decide(rules, MODEL, "c.pt", scanned).action == "allow"
    # scansDone false: an empty list of issues means nothing.
    assert decide(rules, MODEL, "c.pt", RepoFacts(None, False, {}, {}, True)).rule == "hub-scan-unscanned"
    assert decide(rules, MODEL, "c.pt", RepoFacts()).rule == "hub-scan-unscanned"


def test_the_policy_table_of_the_settings_file(tmp_path: Path, settings_env: pytest.MonkeyPatch) -> None:
    assert not Settings().policy_active  # nothing configured: the mirror admits every file, as before
    config = tmp_path / "mirror.toml"
    config.write_text('port = 9000\n[policy]\ndry_run = true\nscan = true\nallow_files = ["*.safetensors"]\n'
                      'hub_unsafe = "quarantine"\n')
    settings = Settings(_config_file=config)
    assert settings.port == 9000 and settings.policy_dry_run and settings.policy_active
    assert settings.policy_allow_files == ("*.safetensors",) and settings.policy_hub_unsafe == "quarantine"
    assert Settings(_config_file=config, policy_dry_run=False).policy_dry_run is False  # a flag wins
    settings_env.setenv("HF_MIRROR_POLICY_BLOCK_FILES", "*.bin, *.py")
    assert Settings().policy_block_files == ("*.bin", "*.py")
    config.write_text('[mirror]\nport = 9001\n[policy]\nhub_caution = "block"\n')
    assert Settings(_config_file=config).policy_hub_caution == "block"
    config.write_text('[policy]\nhub_unsafe = "maybe"\n')
    with pytest.raises(ConfigError, match="policy_hub_unsafe"):
        Settings(_config_file=config)
    config.write_text('[policy]\nno_such_rule = 1\n')
    with pytest.raises(ConfigError, match="policy_no_such_rule"):
        Settings(_config_file=config)


def test_the_ledger_keeps_verdicts_quarantine_and_releases(tmp_path: Path) -> None:
    ledger = Ledger(CacheLayout(tmp_path))
    verdict = scan_bytes(MALICIOUS["evil/nested.pkl"])
    ledger.put_verdict("e1", verdict)
    ledger.quarantine("e1", {"repo": "model:acme/m", "path": "x.pkl", "rule": "mirror-scan", "verdict": "v"})
    assert ledger.verdict("e1") == verdict and ledger.quarantined()[0]["released"] is None
    ledger.release("e1", "reviewed", "ops")
    assert ledger.release_of("e1")["why"] == "reviewed"
    assert '"why": "reviewed"' in (tmp_path / "admission" / "releases.jsonl").read_text()
    ledger.close()
