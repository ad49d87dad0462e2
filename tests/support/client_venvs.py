"""Venvs of older client generations under ``.venvs/`` (git-ignored), made on first use from the package registry with
pip and reused after: each is checked to hold exactly the pinned versions, and (re)installed when it does not.

- ``hub_venv("1.33.0")``: huggingface_hub with the hf_xet it was released with (tests/e2e/test_old_clients.py).
- ``datasets_venv("4.5.0")``: datasets with the huggingface_hub and pyarrow it resolves to by itself
  (tests/e2e/test_viewer.py). A first install takes about 40 s (pip, from the registry).
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from tests.support.mirror_proc import REPO_ROOT

# Each huggingface_hub generation with the hf_xet it was released with (its metadata accepts it: 0.36 asks >=1.1.3,
# 1.33 >=1.6.0): hf_xet 1.6 asks v2 reconstructions in 256 MB windows plus a speculative next window (416 past the
# end); hf_xet 1.2 asks ``{casUrl}/reconstructions/{hash}`` with no version prefix, in 1 GiB windows.
HF_XET = {"1.33.0": "1.6.0", "0.36.2": "1.2.0"}

# Each datasets generation with what ``pip install datasets==X`` resolved to (huggingface-hub<2.0 for 4.5.0: the
# newest 1.x, httpx-based), pinned so that the venv stays the same when the registry moves on.
DATASETS_PINS = {"4.5.0": {"huggingface_hub": "1.33.0", "pyarrow": "26.0.1"}}


def client_venv(name: str, pins: dict[str, str]) -> str:
    """The python of ``.venvs/{name}``, holding exactly ``pins`` ({distribution: version}); made or repaired here."""
    root = REPO_ROOT / ".venvs" / name
    root.parent.mkdir(exist_ok=True)
    # The suite runs on several processes (pytest -n): two test files may want the same venv at once, and a venv
    # made twice over itself is broken. One lock file per venv: the second waits, then finds it made.
    with open(root.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _made(root, pins)


def _made(root: Path, pins: dict[str, str]) -> str:
    python = root / "bin" / "python"
    check = [str(python), "-c", "import importlib.metadata as m, sys; pins = dict(a.split('==') for a in sys.argv[1:]);"
             " bad = {d: m.version(d) for d in pins if m.version(d) != pins[d]}; assert not bad, bad",
             *(f"{dist}=={version}" for dist, version in pins.items())]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
    install = subprocess.run([str(python), "-m", "pip", "install", "-q",
                              *(f"{dist}=={version}" for dist, version in pins.items())],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    return str(python)


def hub_venv(version: str) -> str:
    return client_venv(f"huggingface_hub-{version}", {"huggingface_hub": version, "hf_xet": HF_XET[version]})


def datasets_venv(version: str) -> str:
    return client_venv(f"datasets-{version}", {"datasets": version, **DATASETS_PINS[version]})
