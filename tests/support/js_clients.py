"""The JavaScript clients the tests drive: @huggingface/hub under Node (tests/support/js, installed from its lock
file on first use) and transformers.js's browser bundle (one file of the npm package, unpacked on first use).

Both come from the npm registry, as client venvs come from PyPI (tests/support/client_venvs.py); .ci/run installs
them before the suite so no test waits for a download.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.support.mirror_proc import REPO_ROOT

JS_DIR = REPO_ROOT / "tests" / "support" / "js"
TRANSFORMERS_JS = "4.3.2"  # @huggingface/transformers, whose dist/transformers.min.js runs in a browser as is


def _npm() -> str:
    npm = shutil.which("npm")
    assert npm and shutil.which("node"), "node and npm are needed for the JavaScript clients (.ci/run installs them)"
    return npm


def hub_client() -> list[str]:
    """The command that runs tests/support/js/hub_client.mjs (``node ... HUB_URL REPO PATH [TOKEN]``)."""
    if not (JS_DIR / "node_modules" / "@huggingface" / "hub").is_dir():
        # --ignore-scripts: nothing of the tree needs a build step, and none may reach the network
        subprocess.run([_npm(), "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=JS_DIR, check=True,
                       capture_output=True, timeout=300)
    return [shutil.which("node") or "node", str(JS_DIR / "hub_client.mjs")]


def hub_client_version() -> str:
    return json.loads((JS_DIR / "node_modules" / "@huggingface" / "hub" / "package.json").read_text())["version"]


def transformers_bundle() -> Path:
    """transformers.js's self-contained browser build (``import { AutoTokenizer } from "./transformers.min.js"``)."""
    target = JS_DIR / ".cache" / f"transformers-{TRANSFORMERS_JS}" / "transformers.min.js"
    if not target.is_file():
        pack = target.parent / "pack"
        pack.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([_npm(), "pack", f"@huggingface/transformers@{TRANSFORMERS_JS}", "--json",
                               "--pack-destination", str(pack)], check=True, capture_output=True, text=True,
                              timeout=300)
        tarball = pack / json.loads(done.stdout)[0]["filename"]
        with tarfile.open(tarball) as archive:
            member = archive.extractfile("package/dist/transformers.min.js")
            assert member is not None
            target.write_bytes(member.read())
        shutil.rmtree(pack)
    return target
