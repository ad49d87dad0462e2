"""Intranet users upgrade slowly: huggingface_hub 1.33 (httpx) and 0.36 (requests) must work through the mirror.

Each runs in its own venv under ``.venvs/`` (made on first use from the package registry, reused after)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mirror_proc import REPO_ROOT, run_client

pytestmark = pytest.mark.e2e
MODEL = "acme/tiny-model"


def client_venv(version: str) -> str:
    root = REPO_ROOT / ".venvs" / f"huggingface_hub-{version}"
    python = root / "bin" / "python"
    check = [str(python), "-c", f"import huggingface_hub as h; assert h.__version__ == '{version}'"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", f"huggingface_hub=={version}"],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    return str(python)


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


@pytest.mark.parametrize("version", ["1.33.0", "0.36.2"])
def test_old_huggingface_hub_through_the_mirror(emulator, mirror, tmp_path: Path, version: str) -> None:
    python = client_venv(version)
    # With Xet left enabled: the mirror must strip every Xet hint, or these versions leave for the CAS.
    out = run_client(CODE, mirror.url, tmp_path / "home", python=python, HF_HUB_DISABLE_XET="0")
    files = emulator.files
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
