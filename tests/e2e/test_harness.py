"""``hf-mirror demo`` and ``hf-mirror bench`` end to end in subprocesses, offline (CPU; GPU when CUDA is there), at
tiny sizes: the figures' shape and what each pass asks of upstream, never their speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mirror.harness.sample_data import ensure, parse_size
from tests.support.mirror_proc import REPO_ROOT, free_port

FIELDS = ("rows_per_s", "tokens_per_s", "mb_per_s", "stall_fraction", "first_batch_s", "upstream_requests",
          "upstream_bytes", "upstream_data_requests", "workers", "step_ms", "batch_size", "max_length", "device",
          "streaming", "total_s", "rows", "tokens")


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
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


@pytest.mark.timeout(180)
def test_demo_local_direct_cold_warm(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = _run("demo", "--size", "1M", "--max-rows", "500", "--data-dir", str(tmp_path / "data"), "--json",
                str(out), timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    passes = {p["name"]: p for p in report["passes"]}
    assert set(passes) == {"local-w0", "direct-w0", "mirror-cold-w0", "mirror-warm-w0"}
    for p in passes.values():
        assert all(k in p for k in FIELDS), sorted(set(FIELDS) - set(p))
        assert p["rows"] == 500, p
        assert p["tokens"] > p["rows"], p  # every row has [CLS] text [SEP]
        assert 0 < p["first_batch_s"] <= p["total_s"], p
        assert p["rows_per_s"] > 0 and p["tokens_per_s"] > 0 and p["mb_per_s"] > 0, p
        assert 0 <= p["stall_fraction"] <= 1, p
    for name in ("direct-w0", "mirror-cold-w0", "mirror-warm-w0"):
        assert passes[name]["read_method"] == "socket_recv" and passes[name]["read_bytes"] > 10_000
    assert passes["local-w0"]["upstream_requests"] == 0  # data and tokenizer from disk
    assert passes["direct-w0"]["upstream_data_requests"] > 0
    assert passes["mirror-cold-w0"]["upstream_data_requests"] > 0
    assert passes["mirror-warm-w0"]["upstream_data_requests"] == 0  # the warm mirror serves every shard itself
    served = passes["mirror-warm-w0"]["endpoint_bytes_served"]
    assert served is not None and 0 < served <= passes["mirror-warm-w0"]["read_bytes"]
    assert report["dataset"]["repo"] == "demo/bench-text" and report["dataset"]["files"] > 300
    assert "mirror warm" in proc.stdout and "rows/s" in proc.stdout


@pytest.mark.timeout(240)
def test_bench_workers_upstream_and_stall(tmp_path: Path) -> None:
    """The whole (tiny) dataset at 1 and 4 workers: a cold mirror asks upstream no more with more workers, the
    warm one asks nothing for data, and a step that takes time leaves a stall below 1."""
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = _run("bench", "--size", "1M", "--workers", "1,4", "--passes", "local,cold,warm", "--step-ms", "5",
                "--batch-size", "64", "--data-dir", str(tmp_path / "data"), "--json", str(out), "--plot", str(plot),
                timeout=230)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    passes = {p["name"]: p for p in report["passes"]}
    assert set(passes) == {f"{k}-w{w}" for k in ("local", "mirror-cold", "mirror-warm") for w in (1, 4)}
    rows = report["dataset"]["rows"]
    for p in passes.values():
        assert all(k in p for k in FIELDS), sorted(set(FIELDS) - set(p))
        assert p["rows"] == rows and p["step_ms"] == 5, p  # every row, once, whatever the worker count
        assert 0 <= p["stall_fraction"] < 1, p
    assert passes["mirror-cold-w4"]["active_workers"] == 4
    cold1, cold4 = passes["mirror-cold-w1"]["upstream_requests"], passes["mirror-cold-w4"]["upstream_requests"]
    assert 0 < cold4 <= cold1 * 1.1 + 2, (cold1, cold4)
    assert passes["mirror-cold-w4"]["upstream_data_requests"] <= passes["mirror-cold-w1"]["upstream_data_requests"]
    for w in (1, 4):
        assert passes[f"mirror-warm-w{w}"]["upstream_data_requests"] == 0
        assert report["summary"][f"workers={w}"]["warm_upstream_data_requests"] == 0
    assert report["config"]["workers"] == [1, 4] and report["timelines"]["mirror-warm-w4"]
    assert plot.exists() or "matplotlib is not installed" in proc.stdout


def test_sample_data_is_deterministic(tmp_path: Path) -> None:
    size = parse_size("512K")
    a, b = ensure(size, 7, tmp_path / "a", log=lambda _: None), ensure(size, 7, tmp_path / "b", log=lambda _: None)
    for key in ("dataset_files", "tokenizer_files", "rows", "shards"):
        assert a.manifest[key] == b.manifest[key], key
    shard = a.data_files[0]
    assert (a.dataset_dir / shard).read_bytes() == (b.dataset_dir / shard).read_bytes()
    assert a.manifest["shards"] == 16 and len(a.manifest["dataset_files"]) > 300
    total = sum(m["size"] for m in a.manifest["dataset_files"].values() if m["lfs"])
    assert size * 0.8 < total < size * 1.5, total
    c = ensure(size, 8, tmp_path / "a", log=lambda _: None)  # another seed: other bytes, its own folder
    assert c.root != a.root and c.manifest["dataset_files"][shard]["sha256"] != a.manifest["dataset_files"][shard][
        "sha256"]


def test_sample_data_shards(tmp_path: Path) -> None:
    """``--shards N``: the same size in N shards, in its own folder; the default count keeps the usual folder."""
    size = parse_size("512K")
    default = ensure(size, 7, tmp_path, log=lambda _: None)
    same = ensure(size, 7, tmp_path, log=lambda _: None, shards=16)  # the default count: the same folder
    five = ensure(size, 7, tmp_path, log=lambda _: None, shards=5)
    assert same.root == default.root and five.root != default.root
    assert five.manifest["shards"] == 5 and len(five.data_files) == 5
    total = sum(m["size"] for m in five.manifest["dataset_files"].values() if m["lfs"])
    assert size * 0.8 < total < size * 1.5, total
    with pytest.raises(ValueError):
        ensure(size, 7, tmp_path, log=lambda _: None, shards=0)


@pytest.mark.timeout(180)
def test_bench_shards_gives_every_worker_a_shard(tmp_path: Path) -> None:
    """With ``--shards 8`` all 8 workers stream (16 default shards would leave none idle either, so 8 of 8 here and
    the shard count read back from the pass), and the warm mirror still asks upstream nothing for data."""
    out = tmp_path / "shards.json"
    proc = _run("bench", "--size", "512K", "--shards", "8", "--workers", "8", "--passes", "cold,warm",
                "--data-dir", str(tmp_path / "data"), "--json", str(out), timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["dataset"]["shards"] == 8 and report["config"]["shards"] == 8
    passes = {p["name"]: p for p in report["passes"]}
    for p in passes.values():
        assert p["n_shards"] == 8 and p["active_workers"] == 8 and p["rows"] == report["dataset"]["rows"], p
    assert passes["mirror-cold-w8"]["upstream_data_requests"] >= 8
    assert passes["mirror-warm-w8"]["upstream_data_requests"] == 0
    bad = _run("bench", "--size", "512K", "--shards", "0", "--data-dir", str(tmp_path / "data"), timeout=60)
    assert bad.returncode == 2 and "bad_argument" in bad.stderr, bad.stdout + bad.stderr


def test_early_truncation_gives_the_same_batches(tmp_path: Path) -> None:
    """Collate tokenizes each row's head, not the whole row: the batches are those of whole rows, for the sample
    WordPiece tokenizer, at lengths that cut most rows and none, with spaces, tabs and long words around the cut."""
    np = pytest.importorskip("numpy")
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from mirror.harness.worker import Collate

    data = ensure(parse_size("512K"), 7, tmp_path, log=lambda _: None)
    texts = pq.read_table(data.dataset_dir / data.data_files[0], columns=["text"])["text"].to_pylist()[:256]
    texts += ["a  b   c " * 300, "x" * 3000, "word\tword " * 400, "Ünïcödé  straße " * 200, " lead " * 500]
    tokenizer = AutoTokenizer.from_pretrained(str(data.tokenizer_dir))
    for max_length in (8, 128, 1024):
        early, whole = Collate(tokenizer, "text", max_length, "np"), Collate(tokenizer, "text", max_length, "np")
        whole.budget = 0  # no early truncation
        assert early.budget
        for i in range(0, len(texts), 32):
            rows = [{"text": t} for t in texts[i:i + 32]]
            a, b = early(rows), whole(rows)
            for key in ("input_ids", "attention_mask"):
                assert np.array_equal(a[key], b[key]), (max_length, i, key)


@pytest.mark.timeout(120)
def test_local_pass_stopped_early_counts_its_workers_reads(tmp_path: Path) -> None:
    """Workers stopped by --max-rows are terminated: what they read still counts in the local pass's MB/s."""
    out = tmp_path / "local.json"
    proc = _run("bench", "--size", "512K", "--workers", "2", "--passes", "local", "--max-rows", "100",
                "--data-dir", str(tmp_path / "data"), "--json", str(out), timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (p,) = json.loads(out.read_text())["passes"]
    # measured: 585 kB with the workers' reads, 282 kB (the parent's: tokenizer, card, parquet footers) without
    assert p["stopped_early"] and p["read_method"] == "proc_rchar" and p["read_bytes"] > 400_000, p


@pytest.mark.timeout(200)
def test_parquet_batch_rows_keeps_rows_and_tokens_and_reports_cpu(tmp_path: Path) -> None:
    """--parquet-batch-rows changes how far pyarrow reads ahead, never what a pass reads: the same rows and tokens
    as datasets' default batches; every pass says what CPU it and the servers spent."""
    reports = {}
    for rows in ("0", "256"):
        out = tmp_path / f"b{rows}.json"
        proc = _run("bench", "--size", "1M", "--workers", "0", "--passes", "local,warm", "--max-rows", "300",
                    "--parquet-batch-rows", rows, "--data-dir", str(tmp_path / "data"), "--json", str(out),
                    timeout=95)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reports[rows] = {p["name"]: p for p in json.loads(out.read_text())["passes"]}
    for name in ("local-w0", "mirror-warm-w0"):
        default, bounded = reports["0"][name], reports["256"][name]
        assert (default["rows"], default["tokens"]) == (bounded["rows"], bounded["tokens"]), (default, bounded)
        assert default["parquet_batch_rows"] is None and bounded["parquet_batch_rows"] == 256
        assert bounded["cpu_s"] > 0, bounded
    warm = reports["256"]["mirror-warm-w0"]
    assert warm["endpoint_cpu_s"] is not None and warm["endpoint_cpu_s"] >= 0, warm  # the bench runs the mirror
    assert warm["upstream_cpu_s"] is not None and reports["256"]["local-w0"]["endpoint_cpu_s"] is None


def test_bench_unreachable_endpoint_fails_clearly(tmp_path: Path) -> None:
    proc = _run("bench", "--endpoint", f"http://127.0.0.1:{free_port()}", "--dataset", "demo/tiny-text",
                "--tokenizer", "demo/tiny-tokenizer", "--json", str(tmp_path / "x.json"), timeout=30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unreachable_endpoint" in proc.stderr and "cannot reach" in proc.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs torch with a CUDA device")
@pytest.mark.timeout(180)
def test_demo_on_gpu_measures_h2d(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = _run("demo", "--size", "1M", "--max-rows", "500", "--device", "cuda", "--step-ms", "5", "--no-direct",
                "--no-local", "--data-dir", str(tmp_path / "data"), "--json", str(out), timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for p in json.loads(out.read_text())["passes"]:
        assert p["device"] == "cuda" and p["pinned_memory"] is True and p["step_kind"] == "matmul"
        assert p["h2d_bytes"] > 0 and p["h2d_gb_per_s"] > 0
