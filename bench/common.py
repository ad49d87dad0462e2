"""What every benchmark shares: the emulator, the mirror and nginx started side by side in one run, the load
tools (curl for bytes, ab for request rates), peak-RSS sampling, medians and the result table."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirror.config import parse_size as _parse_config_size
from mirror.harness.services import stat_cpu_s
from mirror.layout import CacheLayout
from tests.support.hub_emulator.runner import EmulatorHandle, run_emulator
from tests.support.mirror_proc import MirrorProcess, free_port
from tests.support.nginx_front import BLOBS_PREFIX, NginxFront, render_nginx_conf  # noqa: F401 - for serve.py

REPO_ROOT = Path(__file__).resolve().parent.parent

BIG_REPO = "acme/big-data"
BIG_PATH = f"/datasets/{BIG_REPO}/resolve/main/big.bin"


# --- command line ----------------------------------------------------------------------------------------------


def add_common_arguments(parser: argparse.ArgumentParser, *, workers_help: str | None = None,
                         head_seconds: bool = False) -> None:
    """``--size``, ``--runs``, ``--workers``, (``--head-seconds``), ``--json``: what every benchmark takes."""
    parser.add_argument("--size", default="1G", help="file size, e.g. 1G, 64M (default 1G)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help=workers_help)
    if head_seconds:
        parser.add_argument("--head-seconds", type=int, default=10)
    parser.add_argument("--json")


def parse_size(text: str) -> int:
    """``--size``: a bare ``1G``/``64M``/``512K`` means GiB/MiB/KiB (file sizes); ``1GB``, ``1GiB`` are as written."""
    short = re.fullmatch(r"\s*([\d.]+)\s*([KMGT])\s*", text, flags=re.IGNORECASE)
    if short:
        text = f"{short.group(1)}{short.group(2).upper()}iB"
    return _parse_config_size(text) or 0


def ensure_tools() -> None:
    """nginx, ab and curl, installed with apt-get when missing (the bench machine may be fresh)."""
    missing = [pkg for tool, pkg in (("nginx", "nginx"), ("ab", "apache2-utils"), ("curl", "curl"))
               if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()]
    if missing:
        subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, capture_output=True)


# --- processes -------------------------------------------------------------------------------------------------


class Nginx:
    """nginx with sendfile serving ``root`` at ``/`` on a free port: the reference for serving from disk."""

    def __init__(self, root: Path, workdir: Path, workers: int) -> None:
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.conf = workdir / "nginx.conf"
        user = "user root;" if os.geteuid() == 0 else ""  # as root, workers would drop to nobody and get 403s
        self.conf.write_text(f"""
{user}
worker_processes {workers};
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on; tcp_nopush on; keepalive_requests 100000;
    client_body_temp_path {workdir}/body; proxy_temp_path {workdir}/proxy; fastcgi_temp_path {workdir}/fcgi;
    uwsgi_temp_path {workdir}/uwsgi; scgi_temp_path {workdir}/scgi;
    server {{ listen 127.0.0.1:{self.port}; root {root}; }}
}}
""")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Nginx:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen([binary, "-c", str(self.conf), "-p", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.CalledProcessError):
                subprocess.run(["curl", "-sf", "-o", "/dev/null", self.url + "/"], check=False, timeout=2)
                if (self.workdir / "nginx.pid").exists():
                    return self
            time.sleep(0.05)
        raise RuntimeError("nginx did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def emulator(size: int) -> Iterator[EmulatorHandle]:
    with tempfile.TemporaryDirectory(prefix="hf-bench-emu-") as tmp, run_emulator(Path(tmp), big_file_size=size) as emu:
        yield emu


@contextlib.contextmanager
def mirror(upstream: str, cache: Path, *extra: str) -> Iterator[MirrorProcess]:
    with MirrorProcess(upstream, cache, *extra) as proc:
        yield proc


def blob_path(cache: Path, etag: str, wait: float = 0.0) -> Path:
    """Where the local store keeps a blob; with ``wait``, once it is committed (clients get their last byte once
    it is verified, a moment before the fsync and rename that commit it)."""
    path = CacheLayout(cache).blob(etag)
    deadline = time.monotonic() + wait
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path


# --- measuring -------------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU-seconds a process used (every thread, user + system)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat"))


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU-seconds of each thread of a process (user + system), by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = stat_cpu_s(task / "stat")
        except OSError:
            continue
    return out


class PeakRss:
    """Samples the peak resident memory of a process and its children (the mirror's workers) every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _tree(pid: int) -> list[int]:
        pids = [pid]
        with contextlib.suppress(OSError):
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                pids += PeakRss._tree(int(child))
        return pids

    def _rss(self) -> int:
        total = 0
        for pid in self._tree(self.pid):
            with contextlib.suppress(OSError):
                match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
                total += int(match.group(1)) * 1024 if match else 0
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.02)

    def __enter__(self) -> PeakRss:
        self.peak = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class CurlResult:
    bytes: int
    seconds: float
    ttfb: float
    status: int


def curl(url: str, *, range_spec: str | None = None, follow: bool = False) -> subprocess.Popen[str]:
    args = ["curl", "-s", "-o", "/dev/null", "-w", "%{size_download} %{time_total} %{time_starttransfer} %{http_code}"]
    if range_spec:
        args += ["-r", range_spec]
    if follow:
        args.append("-L")
    return subprocess.Popen([*args, url], stdout=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> CurlResult:
    out, _ = proc.communicate(timeout=600)
    size, total, ttfb, status = out.split()
    return CurlResult(int(size), float(total), float(ttfb), int(status))


def parallel_get(url: str, clients: int, *, range_spec: str | None = None, follow: bool = False) -> dict[str, float]:
    """``clients`` concurrent downloads: aggregate MB/s over the wall time, and the slowest first byte."""
    began = time.monotonic()
    results = [finish(p) for p in [curl(url, range_spec=range_spec, follow=follow) for _ in range(clients)]]
    wall = time.monotonic() - began
    if any(r.status not in (200, 206) for r in results):
        raise RuntimeError(f"bad status from {url}: {[r.status for r in results]}")
    return {"mb_s": sum(r.bytes for r in results) / wall / 1e6, "wall_s": wall, "ttfb_s": max(r.ttfb for r in results),
            "bytes": sum(r.bytes for r in results)}


def ab_head(url: str, seconds: int, concurrency: int) -> dict[str, float]:
    """HEAD requests per second with keep-alive (wrk hangs on HEAD answers that carry a Content-Length)."""
    out = subprocess.run(["ab", "-i", "-k", "-q", "-c", str(concurrency), "-t", str(seconds), "-n", "10000000", url],
                         capture_output=True, text=True, timeout=seconds + 60).stdout
    rps = float(re.search(r"Requests per second:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    failed = int(re.search(r"Failed requests:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx responses:\s+(\d+)", out)
    pct = dict(re.findall(r"^\s+(\d+)%\s+(\d+)", out, flags=re.MULTILINE))
    complete = int(re.search(r"Complete requests:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    return {"rps": rps, "p50_ms": float(pct.get("50", "nan")), "p99_ms": float(pct.get("99", "nan")),
            "failed": failed + (int(non2xx.group(1)) if non2xx else 0), "requests": complete}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


# --- reporting -------------------------------------------------------------------------------------------------


@dataclass
class Report:
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, mirror: float, reference: float, unit: str, reference_name: str,
            higher_is_better: bool = True, **extra: Any) -> None:
        ratio = (mirror / reference if higher_is_better else reference / mirror) if mirror and reference else None
        self.rows.append({"measure": name, "mirror": round(mirror, 3), "reference": round(reference, 3),
                          "reference_is": reference_name, "unit": unit,
                          "ratio": None if ratio is None else round(ratio, 3), **extra})

    def print(self) -> None:
        print(f"\n## {self.title}\n")
        print("| measure | mirror | reference | unit | ratio (1 = as good as the reference) | notes |")
        print("|---|---|---|---|---|---|")
        for row in self.rows:
            notes = ", ".join(f"{k}={v}" for k, v in row.items()
                              if k not in ("measure", "mirror", "reference", "reference_is", "unit", "ratio"))
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
            reference = "-" if row["reference_is"] == "-" else f"{row['reference']:,} ({row['reference_is']})"
            print(f"| {row['measure']} | {row['mirror']:,} | {reference} | {row['unit']} | {ratio} | {notes} |")
        sys.stdout.flush()

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "rows": self.rows}


def write_json(path: str | None, reports: list[Report], meta: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps({"meta": meta, "reports": [r.to_json() for r in reports]}, indent=2))


def report_run(reports: list[Report], began: float, json_path: str | None, meta: dict[str, Any],
               details: dict[str, Any] | None = None) -> None:
    """The tail of a one-off bench: its tables; then each of ``details`` as a ``- key: value`` line and the whole
    run's seconds (or, without details, the wall seconds alone); with ``--json``, the tables and ``meta`` written."""
    for report in reports:
        report.print()
    if details is None:
        print(f"\n(wall {time.monotonic() - began:.0f} s)")
    else:
        for key, value in details.items():
            print(f"- {key}: {value}")
        print(f"- whole run: {time.monotonic() - began:.0f} s")
    write_json(json_path, reports, meta)


def print_and_save(reports: list[Report], args: argparse.Namespace, size: int) -> None:
    """Print every table; with ``--json``, write them and the run's parameters."""
    for report in reports:
        report.print()
    write_json(args.json, reports, {**machine(), "size": size, "runs": args.runs, "workers": args.workers})


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M")}
