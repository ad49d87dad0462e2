"""Intranet users upgrade slowly: huggingface_hub 1.33 (httpx) and 0.36 (requests) must work through the mirror,
each with its own hf_xet, with the mirror serving Xet (the default) and with ``--no-serve-xet``.

Each runs in its own venv under ``.venvs/`` (tests.support.client_venvs: made on first use from the package
registry, reused after)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.client_venvs import hub_venv
from tests.support.hub_emulator.runner import EmulatorHandle
from tests.support.mirror_proc import MirrorProcess, metric, run_client

pytestmark = pytest.mark.e2e
MODEL = "acme/tiny-model"


client_venv = hub_venv  # (tests/e2e/test_xet.py imports it from here)


CODE = """
import hashlib, json, os
import huggingface_hub as h
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
try:
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RevisionNotFoundError
except ImportError:
    from huggingface_hub.utils import EntryNotFoundError, GatedRepoError, RevisionNotFoundError

def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()

out = {"version": h.__version__}
out["config"] = sha(hf_hub_download("acme/tiny-model", "config.json"))
out["lfs"] = sha(hf_hub_download("acme/tiny-model", "model.safetensors"))
out["tag"] = sha(hf_hub_download("acme/tiny-model", "config.json", revision="v1.0"))
out["pr"] = sha(hf_hub_download("acme/tiny-model", "config.json", revision="refs/pr/1"))
out["dataset"] = sha(hf_hub_download("acme/tiny-parquet", "data/train-00000-of-00001.parquet", repo_type="dataset"))
out["big"] = sha(hf_hub_download("acme/big-data", "big.bin", repo_type="dataset"))
import subprocess, sys
hf = os.path.join(os.path.dirname(sys.executable), "hf")
proc = subprocess.run([hf, "download", "acme/tiny-parquet", "data/test-00000-of-00001.parquet", "--repo-type",
                       "dataset", "--local-dir", "cli"], capture_output=True, text=True)
assert proc.returncode == 0, proc.stderr
out["cli"] = sha("cli/data/test-00000-of-00001.parquet")
from huggingface_hub import HfFileSystem
HfFileSystem().get_file("acme/tiny-model/model.safetensors", os.path.abspath("fs.bin"))  # 0.36: a bare name fails
out["fs"] = sha("fs.bin")
root = snapshot_download("acme/tiny-model", allow_patterns=["*.json", "sub/*"])
out["snapshot"] = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
api = HfApi()
out["sha"] = api.model_info("acme/tiny-model").sha
out["files"] = sorted(api.list_repo_files("acme/tiny-model"))
errors = {}
for name, kw, exc in [("entry", dict(filename="nope.txt"), EntryNotFoundError),
                      ("rev", dict(filename="config.json", revision="nope"), RevisionNotFoundError)]:
    try:
        hf_hub_download("acme/tiny-model", **kw)
        errors[name] = "ok"
    except exc:
        errors[name] = name
try:
    hf_hub_download("acme/gated-model", "config.json")
    errors["gated"] = "ok"
except GatedRepoError:
    errors["gated"] = "gated"
out["errors"] = errors
print(json.dumps(out))
"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def plain_mirror(emulator: EmulatorHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MirrorProcess]:
    """Xet turned off: every Xet hint stripped, so these clients download over plain HTTP with hf_xet installed."""
    with MirrorProcess(emulator.url, tmp_path_factory.mktemp("plain") / "cache", "--no-serve-xet") as proc:
        yield proc


XET_ROUTES = ("xet-token", "xet-reconstruction", "xet-xorb")


def xet_requests(mirror: MirrorProcess) -> dict[str, float]:
    return {route: metric(mirror, "hf_mirror_requests_total", route=route) for route in XET_ROUTES}


@pytest.mark.parametrize("xet", ["xet", "plain"])
@pytest.mark.parametrize("version", ["1.33.0", "0.36.2"])
def test_old_huggingface_hub_through_the_mirror(emulator, mirror, plain_mirror, tmp_path: Path, version: str,
                                                xet: str) -> None:
    python = client_venv(version)
    # hf_xet installed and enabled in the client. "xet": the mirror serves Xet (the default), and the client takes
    # the mirror's token route and CAS; "plain": --no-serve-xet strips every hint, and the client stays on HTTP.
    target = mirror if xet == "xet" else plain_mirror
    before = xet_requests(target)
    emulator.reset_stats()
    out = run_client(CODE, target.url, tmp_path / "home", python=python, HF_HUB_DISABLE_XET="0")
    after = xet_requests(target)
    if xet == "xet":
        assert all(after[route] > before[route] for route in XET_ROUTES), (before, after)
    else:
        assert after == before == dict.fromkeys(XET_ROUTES, 0.0)
    # Only the mirror reached upstream (its User-Agents), and nothing Xet of upstream's was asked for.
    records = emulator.requests()
    agents = {r.get("ua") or "" for r in records}
    assert all(ua.startswith("hf-mirror/") for ua in agents), agents
    assert not [r["path"] for r in records if "xet-" in r["path"] or "reconstructions" in r["path"]]
    files = emulator.files
    assert out["big"] == sha256(files.file_bytes("dataset", "acme/big-data", "main", "big.bin"))
    assert out["cli"] == sha256(files.file_bytes("dataset", "acme/tiny-parquet", "main",
                                                 "data/test-00000-of-00001.parquet"))
    assert out["fs"] == sha256(files.file_bytes("model", MODEL, "main", "model.safetensors"))
    assert out["version"] == version
    assert out["config"] == sha256(files.file_bytes("model", MODEL, "main", "config.json"))
    assert out["lfs"] == sha256(files.file_bytes("model", MODEL, "main", "model.safetensors"))
    assert out["tag"] == sha256(files.file_bytes("model", MODEL, "v1.0", "config.json"))
    assert out["pr"] == sha256(files.file_bytes("model", MODEL, "refs/pr/1", "config.json"))
    assert out["dataset"] == sha256(files.file_bytes("dataset", "acme/tiny-parquet", "main",
                                                     "data/train-00000-of-00001.parquet"))
    # (model.safetensors is in the snapshot folder from the hf_hub_download above)
    assert out["snapshot"] == sorted(p for p in files.paths("model", MODEL, "main")
                                     if p.endswith(".json") or p.startswith("sub/") or p == "model.safetensors")
    assert out["sha"] == files.commit("model", MODEL, "main")
    assert out["files"] == files.paths("model", MODEL, "main")
    assert out["errors"] == {"entry": "entry", "rev": "rev", "gated": "gated"}
