"""Where the CPU of one cold GET goes: CPU-seconds of the emulator, the mirror (its event loop and its other
threads) and curl for one unthrottled cold download through the mirror, against a direct download from the
emulator, to /dev/null and to a file on the same disk that is then hashed (the work a mirror cannot skip).

    python -m bench.cpu --size 1G --runs 3 [--perf DIR] [--py-spy DIR]

CPU-seconds come from /proc (utime + stime) and need nothing else. ``--perf DIR`` records ``perf record -g`` of
the mirror and the emulator during each cold download and prints what their CPU did (kernel frames included:
page-cache writes, socket copies, sendfile); ``--py-spy DIR`` keeps py-spy samples of both (collapsed stacks, for
flame graphs). Both need ptrace/perf events, and slow the run down: read their shares, not their throughput.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import BIG_PATH, cpu_seconds, curl, emulator, finish, mirror, parse_size, thread_cpu_seconds

_TICK = os.sysconf("SC_CLK_TCK")

# What a sample's CPU did: the first rule that matches a frame, from the leaf up (kernel frames included).
_CATEGORIES = [
    ("sha256 (libcrypto)", ("libcrypto", "sha256", "SHA256")),
    ("sendfile to the client (kernel)", ("do_sendfile", "__x64_sys_sendfile")),
    ("write into the page cache (kernel)", ("__x64_sys_pwrite", "ksys_pwrite", "do_pwritev")),
    ("read back from the page cache (kernel)", ("__x64_sys_pread", "ksys_pread", "do_preadv")),
    ("socket receive (kernel)", ("tcp_recvmsg", "sock_recvmsg", "__x64_sys_recvfrom")),
    ("socket send (kernel)", ("tcp_sendmsg", "__x64_sys_sendto", "__x64_sys_writev")),
    ("futex: thread handoffs (kernel)", ("futex",)),
    ("epoll/select (kernel)", ("epoll", "do_select", "do_sys_poll")),
    ("page faults, mmap (kernel)", ("exc_page_fault", "__x64_sys_munmap", "__x64_sys_mmap", "__x64_sys_madvise")),
    ("other syscalls (kernel)", ("entry_SYSCALL_64", "do_syscall_64")),
    ("network softirq (kernel)", ("net_rx_action", "__do_softirq", "handle_softirqs")),
    ("malloc/free, memcpy (user)", ("malloc", "free", "_int_", "memcpy", "memmove", "PyObject_Malloc")),
    ("Python interpreter (user)", ("libpython", "python3")),
]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _download(url: str, pids: dict[str, int], follow: bool, store: Path | None = None) -> dict[str, float]:
    """One curl download; with ``store``, curl writes the file there and it is then hashed (sha256) here."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    curl_before = _children_cpu()
    began = time.monotonic()
    if store is None:
        size = finish(curl(url, follow=follow)).bytes
    else:
        subprocess.run(["curl", "-sfL", "-o", str(store), url], check=True)
        size = store.stat().st_size
    wall = time.monotonic() - began
    out = {f"{name} cpu_s": cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    out["curl cpu_s"] = _children_cpu() - curl_before
    out["wall_s"] = wall
    out["mb_s"] = size / wall / 1e6
    if store is not None:
        hashed = time.thread_time()
        hasher = hashlib.sha256()
        with open(store, "rb") as f:
            while block := f.read(8 << 20):
                hasher.update(block)
        out["sha256 here cpu_s"] = time.thread_time() - hashed
        store.unlink()
    return out


def _start_samplers(args: argparse.Namespace, run: int, roles: dict[str, int]) -> list[subprocess.Popen[bytes]]:
    samplers = []
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if args.py_spy:
        out = Path(args.py_spy)
        out.mkdir(parents=True, exist_ok=True)
        py_spy = str(Path(sys.executable).with_name("py-spy"))
        for name, pid in roles.items():
            samplers.append(subprocess.Popen([py_spy, "record", "--pid", str(pid), "--threads", "--native", "--rate",
                                              "200", "--format", "raw", "-o", str(out / f"{name}-{run}.txt")], **quiet))
    if args.perf:
        out = Path(args.perf)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"pids-{run}.txt").write_text("".join(f"{name} {pid}\n" for name, pid in roles.items()))
        samplers.append(subprocess.Popen(["perf", "record", "-p", ",".join(str(p) for p in roles.values()), "-g",
                                          "-F", "499", "-o", str(out / f"perf-{run}.data")], **quiet))
    if samplers:
        time.sleep(1.5)  # attached
    return samplers


def perf_breakdown(data: Path, roles: dict[str, int]) -> dict[str, collections.Counter[str]]:
    """Samples of ``perf record -g`` per role (process) and category (see ``_CATEGORIES``)."""
    by_pid = {pid: name for name, pid in roles.items()}
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym,dso"],
                            capture_output=True, text=True, check=True).stdout
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for block in script.split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
        if not lines:
            continue
        pid = int(lines[0].split()[1].split("/")[0])
        category = next((name for frame in lines[1:] for name, keys in _CATEGORIES if any(k in frame for k in keys)),
                        "other")
        out[by_pid.get(pid, "other")][category] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1G")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--perf", help="record perf samples of each cold run into this folder and break them down")
    parser.add_argument("--py-spy", help="record py-spy samples (collapsed stacks) of each cold run into this folder")
    args = parser.parse_args()
    size = parse_size(args.size)
    direct, stored, cold, threads = [], [], [], []
    breakdown: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with emulator(size) as emu:
        assert emu.proc is not None
        for _ in range(args.runs):
            direct.append(_download(emu.url + BIG_PATH, {"emulator": emu.proc.pid}, follow=True))
        with tempfile.TemporaryDirectory(prefix="hf-bench-disk-") as tmp:
            for _ in range(args.runs):
                stored.append(_download(emu.url + BIG_PATH, {"emulator": emu.proc.pid}, follow=True,
                                        store=Path(tmp) / "big.bin"))
        for run in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="hf-bench-cache-") as tmp, \
                    mirror(emu.url, Path(tmp) / "cache") as proc:
                assert proc.proc is not None
                roles = {"mirror": proc.proc.pid, "emulator": emu.proc.pid}
                samplers = _start_samplers(args, run, roles)
                before = thread_cpu_seconds(proc.proc.pid)
                cold.append(_download(proc.url + BIG_PATH, roles, follow=False))
                after = thread_cpu_seconds(proc.proc.pid)
                loop = after.pop(proc.proc.pid) - before.get(proc.proc.pid, 0.0)
                threads.append((loop, sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)))
                for sampler in samplers:
                    sampler.send_signal(signal.SIGINT)
                    sampler.wait(timeout=60)
            if args.perf:
                for role, counts in perf_breakdown(Path(args.perf) / f"perf-{run}.data", roles).items():
                    breakdown[role] += counts

    for label, runs in (("direct", direct), ("direct to disk (curl -o), then sha256 of the file", stored),
                        ("cold through the mirror", cold)):
        print(f"\n{label} (median of {len(runs)}; CPU-seconds also scaled to 1 GiB)")
        for key in runs[0]:
            values = [r[key] for r in runs]
            per_gib = f"  ({statistics.median(values) * 2**30 / size:.2f} per GiB)" if key.endswith("cpu_s") else ""
            print(f"  {key:18} {statistics.median(values):9.3f}   runs: {[round(v, 3) for v in values]}{per_gib}")
    print("\nmirror threads, CPU-seconds of each cold run: the event loop's, then the others' (> 0.01 s)")
    for loop, others in threads:
        print(f"   loop {loop:.2f}  others {sum(others):.2f}:", [round(t, 2) for t in others if t > 0.01])
    for role, counts in sorted(breakdown.items()):
        total = sum(counts.values())
        print(f"\nperf, {role}: {total} samples over {args.runs} cold runs")
        for category, n in counts.most_common():
            print(f"  {100 * n / total:5.1f}%  {category}")


if __name__ == "__main__":
    main()
