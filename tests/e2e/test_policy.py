"""The admission policy (issue 27 items 1-3), real processes: the Hub emulator's ``acme/pickle-zoo`` (benign
torch.save state dicts, malicious pickles, safetensors, gguf, code; the Hub's scan marks two files), a mirror with a
strict policy in front of it, and the real client.

Every rule refuses what it should and admits the benign; every route to bytes (resolve GET and HEAD, the Xet CAS by
hash, the warm, the sync, offline) refuses the refused file; a quarantined file is stored, listed and served only
after ``policy release``; dry-run logs and serves; with no policy nothing changes; a blob cached before the policy
is held to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import REPO_ROOT, MirrorProcess, blob, run_client, wait_for

pytestmark = pytest.mark.e2e

ZOO = "acme/pickle-zoo"
STRICT = ("--policy-scan", "--policy-hub-unsafe", "block", "--policy-hub-caution", "quarantine",
          "--policy-block-files", "*.py", "--policy-deny-publishers", "gplco", "--policy-license-unknown", "block")
# (repo, path, the rule that refuses it under STRICT; None: admitted)
CASES = [
    (ZOO, "model.safetensors", None), (ZOO, "model.gguf", None), (ZOO, "config.json", None),
    (ZOO, "pytorch_model.bin", None), (ZOO, "benign/ckpt.pt", None), (ZOO, "benign/plain.pkl", None),
    (ZOO, "evil/os_system.bin", "hub-scan-unsafe"), (ZOO, "evil/exec.pt", "hub-scan-caution"),
    (ZOO, "evil/os_system_p0.pkl", "mirror-scan"), (ZOO, "evil/os_system_p5.pkl", "mirror-scan"),
    (ZOO, "evil/nested.pkl", "mirror-scan"), (ZOO, "evil/hidden.pth", "mirror-scan"),
    (ZOO, "modeling_zoo.py", "file-type"),
    ("gplco/copyleft-model", "model.safetensors", "publisher"),
    ("acme/fresh-upload", "model.safetensors", "license-unknown"),
]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_MIRROR_", "HF_TOKEN"))}
    return subprocess.run([sys.executable, "-m", "mirror", *args], cwd=REPO_ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)


def url(mirror: MirrorProcess, repo: str, path: str) -> str:
    return f"{mirror.url}/{repo}/resolve/main/{path}"


def assert_refused(answer: httpx.Response, rule: str, path: str) -> None:
    assert answer.status_code == 403, (answer.status_code, answer.text[:300])
    assert answer.headers["x-error-code"] == "PolicyBlocked"
    message = answer.headers["x-error-message"]
    assert f"rule {rule}" in message and path in message, message


@pytest.fixture(scope="module")
def strict(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    cache = tmp_path_factory.mktemp("policy-strict") / "cache"
    with MirrorProcess(emulator.url, cache, *STRICT) as proc:
        yield proc


def test_each_rule_refuses_what_it_should_and_admits_the_benign(emulator: EmulatorHandle,
                                                                strict: MirrorProcess) -> None:
    # A HEAD first: a pickle-class file is fetched and scanned before the HEAD answers (a client learns the refusal
    # before it takes the Xet path).
    assert_refused(httpx.head(url(strict, ZOO, "evil/os_system_p5.pkl"), timeout=60), "mirror-scan",
                   "evil/os_system_p5.pkl")
    for repo, path, rule in CASES:
        got = httpx.get(url(strict, repo, path), timeout=60)
        if rule is None:
            assert got.status_code == 200, (path, got.status_code, got.text[:300])
            assert got.content == emulator.files.file_bytes("model", repo, "main", path), path
            assert httpx.head(url(strict, repo, path)).status_code == 200
        else:
            assert_refused(got, rule, path)
            assert_refused(httpx.head(url(strict, repo, path)), rule, path)  # the verdict known, HEAD says it too
    # A file the policy blocks outright is never fetched; a quarantined one is stored, never served.
    etag = emulator.files.etag
    for path in ("evil/os_system.bin", "modeling_zoo.py"):
        assert emulator.fetch_count("model", ZOO, path) == 0, path
        assert not blob(strict.cache_dir, etag("model", ZOO, "main", path)).exists(), path
    for path in ("evil/nested.pkl", "evil/hidden.pth", "evil/exec.pt"):
        assert blob(strict.cache_dir, etag("model", ZOO, "main", path)).exists(), path
    held = {q["etag"]: q for q in httpx.get(strict.url + "/api/mirror/status").json()["quarantine"]}
    nested = held[etag("model", ZOO, "main", "evil/nested.pkl")]
    assert nested["path"] == "evil/nested.pkl" and nested["rule"] == "mirror-scan"
    assert "pickle.loads" in nested["verdict"]
    hidden = held[etag("model", ZOO, "main", "evil/hidden.pth")]["verdict"]
    assert "builtins.exec" in hidden and "notes.txt: posix.system" in hidden
    assert held[etag("model", ZOO, "main", "evil/exec.pt")]["rule"] == "hub-scan-caution"


def test_the_client_sees_an_error_and_the_listing_is_unchanged(strict: MirrorProcess, hf_home: Path) -> None:
    code = f"""
import json
from huggingface_hub import HfApi, hf_hub_download, list_repo_files
api = HfApi()
out = {{"files": sorted(list_repo_files({ZOO!r})),
        "repo_status": api.model_info({ZOO!r}, securityStatus=True).security_repo_status,
        "file_status": api.get_paths_info({ZOO!r}, ["evil/os_system.bin"], expand=True)[0].security}}
for path in ("modeling_zoo.py", "evil/os_system.bin", "model.safetensors"):
    try:
        hf_hub_download({ZOO!r}, path)
        out[path] = "ok"
    except Exception as exc:
        cause = exc.__cause__ or exc
        out[path] = [type(exc).__name__, type(cause).__name__, str(cause)]
print(json.dumps(out))
"""
    before = strict.log().count("/resolve/main/modeling_zoo.py")
    out = run_client(code, strict.url, hf_home)
    assert isinstance(out, dict)
    assert "modeling_zoo.py" in out["files"] and "evil/os_system.bin" in out["files"]  # metadata stays visible
    assert out["model.safetensors"] == "ok"
    # The Hub's scan fields, as huggingface_hub reads them (through the mirror, from the emulator).
    assert out["repo_status"]["scansDone"] is True
    assert {"path": "evil/os_system.bin", "level": "unsafe"} in out["repo_status"]["filesWithIssues"]
    assert out["file_status"]["status"] == "unsafe"
    for path, rule in (("modeling_zoo.py", "file-type"), ("evil/os_system.bin", "hub-scan-unsafe")):
        outer, cause, message = out[path]
        assert cause == "HfHubHTTPError" and "403" in message and f"rule {rule}" in message, out[path]
    # The client is done: every request it sent is in the access log once the log catches up (one, no retry).
    wait_for(lambda: strict.log().count("/resolve/main/modeling_zoo.py") > before)
    assert strict.log().count("/resolve/main/modeling_zoo.py") == before + 1, "one refusal, no retry"


def test_xet_by_hash_is_held_to_the_policy(emulator: EmulatorHandle, strict: MirrorProcess) -> None:
    token = httpx.get(f"{strict.url}/api/models/{ZOO}/xet-read-token/main").json()["accessToken"]

    def reconstruction(path: str) -> httpx.Response:
        xet_hash = emulator.files._file("model", ZOO, "main", path).xet_hash  # noqa: SLF001
        return httpx.get(f"{strict.url}/_xet/v2/reconstructions/{xet_hash}", timeout=60,
                         headers={"authorization": f"Bearer {token}"})

    assert reconstruction("pytorch_model.bin").status_code == 200
    assert_refused(reconstruction("evil/os_system_p0.pkl"), "mirror-scan", "evil/os_system_p0.pkl")
    assert_refused(reconstruction("evil/os_system.bin"), "hub-scan-unsafe", "evil/os_system.bin")


def test_quarantine_then_release(emulator: EmulatorHandle, strict: MirrorProcess) -> None:
    path = "evil/nested.pkl"
    etag = emulator.files.etag("model", ZOO, "main", path)
    assert_refused(httpx.get(url(strict, ZOO, path)), "mirror-scan", path)
    base = ["policy", "release", etag, "--cache-dir", str(strict.cache_dir)]
    assert cli(*base).returncode == 2  # --why is required
    assert cli(*base[:2], "0" * 64, "--why", "x", "--cache-dir", str(strict.cache_dir)).returncode == 1
    done = cli(*base, "--why", "reviewed: test fixture, never loaded")
    assert done.returncode == 0, done.stderr
    got = httpx.get(url(strict, ZOO, path))
    assert got.status_code == 200 and got.content == emulator.files.file_bytes("model", ZOO, "main", path)
    record = json.loads((strict.cache_dir / "admission" / "releases.jsonl").read_text().splitlines()[-1])
    assert record["etag"] == etag and record["why"] == "reviewed: test fixture, never loaded"
    assert record["quarantine"]["rule"] == "mirror-scan"
    held = {q["etag"]: q for q in httpx.get(strict.url + "/api/mirror/status").json()["quarantine"]}
    assert held[etag]["released"]["why"] == "reviewed: test fixture, never loaded"


def test_warm_refuses_the_refused_files(emulator: EmulatorHandle, strict: MirrorProcess) -> None:
    with httpx.Client(base_url=strict.url, timeout=30) as client:
        job = client.post("/api/mirror/warm", json={"repo": ZOO}).json()
        deadline = time.monotonic() + 60
        while (state := client.get(f"/api/mirror/warm/{job['id']}").json())["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
    assert "PolicyBlocked" in json.dumps(state) or "admission policy" in json.dumps(state), state
    etag = emulator.files.etag
    assert not blob(strict.cache_dir, etag("model", ZOO, "main", "evil/os_system.bin")).exists()
    assert not blob(strict.cache_dir, etag("model", ZOO, "main", "modeling_zoo.py")).exists()
    assert blob(strict.cache_dir, etag("model", ZOO, "main", "model.gguf")).exists()


def test_offline_answers_hold_the_policy(emulator: EmulatorHandle, strict: MirrorProcess) -> None:
    # A second process on the same cache, offline: the verdicts and the Hub's facts it learned still decide.
    with MirrorProcess(emulator.url, strict.cache_dir, *STRICT, "--offline") as offline:
        assert_refused(httpx.get(url(offline, ZOO, "evil/hidden.pth")), "mirror-scan", "evil/hidden.pth")
        assert_refused(httpx.get(url(offline, ZOO, "evil/os_system.bin")), "hub-scan-unsafe", "evil/os_system.bin")
        assert_refused(httpx.get(url(offline, "acme/fresh-upload", "model.safetensors")), "license-unknown",
                       "model.safetensors")
        got = httpx.get(url(offline, ZOO, "pytorch_model.bin"))
        assert got.status_code == 200
        assert got.content == emulator.files.file_bytes("model", ZOO, "main", "pytorch_model.bin")


def test_stale_answers_hold_the_policy(emulator: EmulatorHandle, strict: MirrorProcess) -> None:
    # The Hub down, the branch's commit past its TTL: the cached files are served stale, and held to the policy.
    env = {"HF_MIRROR_UPSTREAM_RETRIES": "0"}
    with MirrorProcess(emulator.url, strict.cache_dir, *STRICT, "--revision-ttl", "0", env=env) as stale:
        emulator.set_faults(down=True)
        try:
            got = httpx.get(url(stale, ZOO, "pytorch_model.bin"), timeout=60)
            assert got.status_code == 200 and got.headers["x-mirror-cache"] == "stale", got.headers
            assert_refused(httpx.get(url(stale, ZOO, "evil/hidden.pth"), timeout=60), "mirror-scan",
                           "evil/hidden.pth")
            assert_refused(httpx.get(url(stale, ZOO, "modeling_zoo.py"), timeout=60), "file-type",
                           "modeling_zoo.py")
        finally:
            emulator.clear_faults()


def test_no_policy_dry_run_then_policy_on_blobs_already_cached(emulator: EmulatorHandle, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    paths = ("evil/os_system_p0.pkl", "modeling_zoo.py")
    with MirrorProcess(emulator.url, cache) as plain:  # no policy: every file served, nothing else changes
        for path in paths:
            got = httpx.get(url(plain, ZOO, path))
            assert got.status_code == 200 and got.content == emulator.files.file_bytes("model", ZOO, "main", path)
        assert "quarantine" not in httpx.get(plain.url + "/api/mirror/status").json()
        assert not (cache / "admission").exists()
    policy = ("--policy-scan", "--policy-block-files", "*.py")
    with MirrorProcess(emulator.url, cache, *policy, "--policy-dry-run") as dry:
        for path in paths:
            assert httpx.get(url(dry, ZOO, path)).status_code == 200
        wait_for(lambda: dry.log().count("policy dry-run: would refuse") >= 2)
        assert "rule file-type" in dry.log() and "rule mirror-scan" in dry.log()
    with MirrorProcess(emulator.url, cache, *policy) as enforced:  # the same cached blobs, held to the new policy
        assert_refused(httpx.get(url(enforced, ZOO, "modeling_zoo.py")), "file-type", "modeling_zoo.py")
        assert_refused(httpx.get(url(enforced, ZOO, paths[0])), "mirror-scan", paths[0])


def test_sync_refuses_the_refused_files(emulator: EmulatorHandle, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    manifest = tmp_path / "sync.toml"
    manifest.write_text(f'[[repo]]\ntype = "model"\nid = "{ZOO}"\nrevisions = ["main"]\n')
    run = cli("sync", "--manifest", str(manifest), "--cache-dir", str(cache), "--upstream", emulator.url,
              "--progress", "plain", *STRICT)
    output = run.stdout + run.stderr
    assert run.returncode != 0 and "admission policy" in output, output
    etag = emulator.files.etag
    assert not blob(cache, etag("model", ZOO, "main", "evil/os_system.bin")).exists()
    assert not blob(cache, etag("model", ZOO, "main", "modeling_zoo.py")).exists()
    assert blob(cache, etag("model", ZOO, "main", "pytorch_model.bin")).exists()
    listed = cli("policy", "quarantined", "--cache-dir", str(cache))
    held = {json.loads(line)["path"] for line in listed.stdout.splitlines()}
    assert {"evil/nested.pkl", "evil/hidden.pth", "evil/os_system_p0.pkl", "evil/exec.pt"} <= held, held


def test_policy_check_prints_each_file_and_its_rule(emulator: EmulatorHandle, tmp_path: Path) -> None:
    config = tmp_path / "mirror.toml"
    config.write_text('[policy]\nscan = true\nhub_unsafe = "block"\nblock_files = ["*.py"]\n')
    run = cli("policy", "check", ZOO, "--config", str(config), "--upstream", emulator.url,
              "--cache-dir", str(tmp_path / "cache"))
    assert run.returncode == 1, run.stdout + run.stderr
    lines = {line.split()[2]: line.split()[:2] for line in run.stdout.splitlines() if line.count(" ") > 2
             and not line.startswith("model:")}
    assert lines["modeling_zoo.py"] == ["BLOCK", "file-type"]
    assert lines["evil/os_system.bin"] == ["BLOCK", "hub-scan-unsafe"]
    assert lines["evil/nested.pkl"] == ["SCAN", "mirror-scan"]
    assert lines["model.safetensors"] == ["ALLOW", "-"]
    commit = emulator.files.commit("model", ZOO, "main")
    assert f"model:{ZOO}@{commit[:12]}: 2 file(s) refused" in run.stdout
    tagged = cli("policy", "check", f"{ZOO}@{commit}", "--json", "--upstream", emulator.url,
                 "--cache-dir", str(tmp_path / "cache"))
    assert tagged.returncode == 0 and all(json.loads(line)["decision"] == "allow"
                                          for line in tagged.stdout.splitlines())


def test_refusals_are_in_the_audit_log_with_their_rule(emulator: EmulatorHandle, tmp_path: Path) -> None:
    """Issue 27 item 4: each refusal is an audit event naming the rule; a quarantine is its own outcome."""
    cache = tmp_path / "cache"
    with MirrorProcess(emulator.url, cache, *STRICT) as mirror:
        assert_refused(httpx.get(url(mirror, ZOO, "modeling_zoo.py")), "file-type", "modeling_zoo.py")
        assert_refused(httpx.get(url(mirror, ZOO, "evil/exec.pt")), "hub-scan-caution", "evil/exec.pt")
        assert httpx.get(url(mirror, ZOO, "config.json")).status_code == 200
        assert_refused(httpx.get(url(mirror, ZOO, "evil/nested.pkl")), "mirror-scan", "evil/nested.pkl")
        assert httpx.get(url(mirror, ZOO, "benign/ckpt.pt")).status_code == 200
        # A HEAD refused is an event too (an admitted HEAD is none: no file went out).
        assert_refused(httpx.head(url(mirror, ZOO, "evil/os_system.bin")), "hub-scan-unsafe", "evil/os_system.bin")
    # The bill of materials carries the mirror's own scan and its decisions (issue 27 item 5).
    bom = cli("sbom", f"{ZOO}@main", "--cache-dir", str(cache))
    assert bom.returncode == 0, bom.stderr
    props = {c["name"]: {p["name"]: p["value"] for p in c.get("properties", [])}
             for c in json.loads(bom.stdout)["components"]}
    assert props["benign/ckpt.pt"]["hf-mirror:scan"] == "passed"
    assert props["evil/nested.pkl"]["hf-mirror:scan"] == "failed"
    assert props["evil/nested.pkl"]["hf-mirror:admission"] == "quarantined"
    assert props["modeling_zoo.py"]["hf-mirror:admission"] == "refused"
    done = cli("audit", "--cache-dir", str(cache), "--repo", ZOO, "--json")
    assert done.returncode == 0, done.stderr
    events = {e["path"]: e for e in map(json.loads, done.stdout.splitlines())}
    assert events["modeling_zoo.py"]["outcome"] == "refused" and events["modeling_zoo.py"]["rule"] == "file-type"
    assert events["evil/exec.pt"]["outcome"] == "quarantined"
    assert events["evil/exec.pt"]["rule"] == "hub-scan-caution"
    assert events["config.json"]["outcome"] in ("miss", "hit")
    assert events["evil/os_system.bin"]["outcome"] == "refused"
    assert events["evil/os_system.bin"]["rule"] == "hub-scan-unsafe"
