"""``hf-mirror demo`` and ``hf-mirror bench`` end to end in subprocesses, offline (CPU; GPU when CUDA is there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mirror_proc import REPO_ROOT, free_port


def _run(*argv: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mirror", *argv], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _has_cuda() -> bool:
    if not Path("/dev/nvidiactl").exists():  # no NVIDIA driver: skip without paying for a torch import
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.timeout(120)
def test_demo_cold_warm_direct_local(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = _run("demo", "--max-rows", "500", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    passes = {p["name"]: p for p in report["passes"]}
    assert set(passes) == {"endpoint-cold", "endpoint-warm", "direct-cold", "direct-warm", "local"}
    for p in passes.values():
        assert p["rows"] == 500, p
        assert p["tokens"] > p["rows"], p  # every row has [CLS] text [SEP]
        assert 0 < p["ttfb_s"] <= p["total_s"], p
        assert p["rows_per_s"] > 0 and p["tokens_per_s"] > 0, p
        assert 0 <= p["starvation_ratio"] <= 1, p
        assert p["read_bytes"] is None or p["read_bytes"] > 0, p
    for name in ("endpoint-cold", "endpoint-warm", "direct-cold", "direct-warm"):
        # the rows came over HTTP: at least one data file's worth of bytes (the train parquet is > 100 kB)
        assert passes[name]["read_method"] == "socket_recv"
        assert passes[name]["read_bytes"] > 100_000, passes[name]
        assert passes[name]["read_mb_per_s"] > 0
    for name in ("endpoint-cold", "endpoint-warm"):
        served = passes[name]["endpoint_bytes_served"]
        # the mirror's own counter (bodies) is a little below what the client received (bodies + headers)
        assert served is not None and 0 < served <= passes[name]["read_bytes"], passes[name]
    assert passes["direct-cold"]["endpoint_bytes_served"] is None  # the sample hub is no mirror: no /metrics
    assert "table" not in proc.stderr.lower()
    assert "mirror warm" in proc.stdout and "rows/s" in proc.stdout


def test_bench_unreachable_endpoint_fails_clearly(tmp_path: Path) -> None:
    proc = _run("bench", "--endpoint", f"http://127.0.0.1:{free_port()}", "--dataset", "demo/tiny-text",
                "--tokenizer", "demo/tiny-tokenizer", "--json", str(tmp_path / "x.json"), timeout=30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unreachable_endpoint" in proc.stderr and "cannot reach" in proc.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs torch with a CUDA device")
@pytest.mark.timeout(120)
def test_demo_on_gpu_measures_h2d(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = _run("demo", "--max-rows", "500", "--device", "cuda", "--no-direct", "--no-local", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for p in json.loads(out.read_text())["passes"]:
        assert p["device"] == "cuda" and p["pinned_memory"] is True
        assert p["h2d_bytes"] > 0 and p["h2d_gb_per_s"] > 0
