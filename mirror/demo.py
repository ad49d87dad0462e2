"""``hf-mirror demo``: the whole path, offline, in under a minute.

Starts the built-in sample Hub (:mod:`mirror.sample_hub`: model ``demo/tiny-tokenizer``, dataset ``demo/tiny-text``)
and a mirror in front of it, as subprocesses on free 127.0.0.1 ports with a temporary cache, then runs
``hf-mirror bench`` cold and warm through the mirror, ``--compare-direct`` against the sample Hub and
``--compare-local`` against the same parquet files on disk, and prints the table. Both servers are stopped by PID
in a ``finally``, on Ctrl-C as well.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mirror.harness.bench import run_bench
from mirror.harness.protocol import EXIT_USER_ERROR, HarnessError

REPO_ROOT = Path(__file__).resolve().parent.parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--max-rows", type=int, default=None, help="rows per pass (default: the whole split)")
    add("--rows", type=int, default=4000, help="train rows in the sample dataset (default 4000)")
    add("--batch-size", type=int, default=64, help="rows per batch (default 64)")
    add("--num-workers", type=int, default=0, help="DataLoader workers (default 0)")
    add("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where batches go (default auto)")
    add("--no-direct", action="store_true", help="skip the passes straight against the sample Hub")
    add("--no-local", action="store_true", help="skip the pass from local disk")
    add("--json", metavar="FILE", type=Path, default=None, help="write all figures to this JSON file")
    add("--plot", metavar="FILE.png", type=Path, default=None, help="plot throughput over time (needs matplotlib)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy in {timeout:.0f}s:\n{log.read_text(errors='replace')}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def run(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="hf-mirror-demo-"))
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    try:
        hub_port, mirror_port = free_port(), free_port()
        hub_url, mirror_url = f"http://127.0.0.1:{hub_port}", f"http://127.0.0.1:{mirror_port}"
        local_dir = root / "local" / "demo-tiny-text"
        commands = [
            ("sample hub", hub_url, [sys.executable, "-m", "mirror.sample_hub", "--host", "127.0.0.1", "--port",
                                     str(hub_port), "--rows", str(args.rows), "--write-local", str(local_dir)]),
            ("mirror", mirror_url, [sys.executable, "-m", "mirror", "serve", "--host", "127.0.0.1", "--port",
                                    str(mirror_port), "--upstream", hub_url, "--cache-dir", str(root / "cache"),
                                    "--log-level", "warning"]),
        ]
        for name, url, cmd in commands:
            print(f"[demo] starting {name} at {url}", flush=True)
            log = root / f"{name.replace(' ', '-')}.log"
            logs.append(log)
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT))
            _wait_healthy(procs[-1], url, log)
        bench_args = argparse.Namespace(
            endpoint=mirror_url, dataset="demo/tiny-text", config=None, split="train", text_column="text",
            tokenizer="demo/tiny-tokenizer", batch_size=args.batch_size, max_length=128,
            num_workers=args.num_workers, shuffle_buffer=0, max_rows=args.max_rows, max_seconds=None, step_ms=0.0,
            device=args.device, compare_direct=None if args.no_direct else hub_url,
            compare_local=None if args.no_local else local_dir, json=args.json, plot=args.plot, timeout=120.0)
        labels = {"endpoint-cold": "mirror cold", "endpoint-warm": "mirror warm", "direct-cold": "sample hub cold",
                  "direct-warm": "sample hub warm", "local": "local disk"}
        start = time.monotonic()
        try:
            report = run_bench(bench_args, labels=labels)
        except HarnessError as exc:
            print(f"hf-mirror demo: error ({exc.kind}): {exc.message}", file=sys.stderr)
            return EXIT_USER_ERROR
        print(f"[demo] done in {time.monotonic() - start:.1f}s; the same against your own mirror:\n"
              f"  hf-mirror bench --endpoint http://127.0.0.1:8090 --dataset <repo> --tokenizer <repo>")
        return 0 if report["passes"] else 1
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)
