"""A cold, unthrottled file through the mirror against the download a cache is held to: ``curl -o FILE`` of the
same file straight from the emulator (a download that also writes the file, onto the same disk as the cache).

    python -m bench.cold --size 1G --runs 5 [--single-stream] [--compare DIR] [--json out.json]

Each round runs both, back to back and in alternating order (the machine may be shared: a paired ratio per round
says more than two medians taken minutes apart): a fresh mirror and one ``curl`` of the file through it (to
``/dev/null``: the mirror writes the file), and ``curl -o`` of the file from the emulator into the same temporary
folder. Printed: medians of MB/s, the ratio (target >= 0.7) and CPU-seconds per GiB of every process (a machine
shared with other work bends MB/s, far less CPU-seconds). Where the mirror's CPU goes: ``bench.cpu --perf``.
``--single-stream`` sets ``HF_MIRROR_PARALLEL_FILL_THRESHOLD=0`` (one upstream connection, hashed in line).
``--compare DIR`` adds, to every round, the same cold GET through the mirror of another checkout (e.g.
``git worktree add DIR <commit>``): a before/after in one run.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import BIG_PATH, Report, cpu_seconds, emulator, machine, parse_size, write_json
from tests.support.mirror_proc import MirrorProcess


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed_curl(args: list[str], pids: dict[str, int]) -> dict[str, float]:
    """One curl; its wall time, MB/s, and the CPU-seconds of curl and of each process in ``pids`` meanwhile."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    curl_before = _children_cpu()
    began = time.monotonic()
    out = subprocess.run(["curl", "-sf", "-w", "%{size_download}", *args], check=True, capture_output=True,
                         text=True, timeout=600).stdout
    wall = time.monotonic() - began
    result = {f"{name} cpu_s": cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    result["curl cpu_s"] = _children_cpu() - curl_before
    result["wall_s"] = wall
    result["mb_s"] = int(out) / wall / 1e6
    return result


def _to_file(url: str, folder: Path, emulator_pid: int) -> dict[str, float]:
    target = folder / "big.bin"
    result = _timed_curl(["-L", "-o", str(target), url], {"emulator": emulator_pid})
    target.unlink()
    return result


def _through_mirror(upstream: str, cache: Path, emulator_pid: int, env: dict[str, str],
                    tree: Path | None = None) -> dict[str, float]:
    with MirrorProcess(upstream, cache, env=env, **({"cwd": tree} if tree else {})) as proc:  # type: ignore[arg-type]
        assert proc.proc is not None
        result = _timed_curl(["-o", "/dev/null", proc.url + BIG_PATH], {"mirror": proc.proc.pid,
                                                                          "emulator": emulator_pid})
    shutil.rmtree(cache)
    return result


def run(size: int, runs: int, single_stream: bool,
        compare: Path | None = None) -> tuple[list[Report], dict[str, list[dict[str, float]]]]:
    env = {"HF_MIRROR_PARALLEL_FILL_THRESHOLD": "0"} if single_stream else {}
    direct, cold, other = [], [], []
    with emulator(size) as emu, tempfile.TemporaryDirectory(prefix="hf-bench-cold-") as tmp:
        assert emu.proc is not None
        pid, folder = emu.proc.pid, Path(tmp)
        for round_ in range(runs):
            if round_ % 2:
                cold.append(_through_mirror(emu.url, folder / "cache", pid, env))
            direct.append(_to_file(emu.url + BIG_PATH, folder, pid))
            if not round_ % 2:
                cold.append(_through_mirror(emu.url, folder / "cache", pid, env))
            if compare is not None:
                other.append(_through_mirror(emu.url, folder / "cache", pid, env, compare))
    mode = "one upstream stream" if single_stream else "parallel windows"
    reports = [_report(f"Cold GET of a {size / 2**20:.0f} MiB file, unthrottled ({mode}), against curl -o FILE",
                       size, cold, direct)]
    rounds = {"curl -o FILE, direct": direct, "cold through the mirror": cold}
    if compare is not None:
        reports.append(_report(f"The same, the mirror of {compare}", size, other, direct))
        rounds[f"cold through the mirror of {compare}"] = other
    return reports, rounds


def _report(title: str, size: int, cold: list[dict[str, float]], direct: list[dict[str, float]]) -> Report:
    paired = [c["mb_s"] / d["mb_s"] for c, d in zip(cold, direct, strict=True)]
    report = Report(title)
    report.add("throughput", statistics.median(c["mb_s"] for c in cold),
               statistics.median(d["mb_s"] for d in direct), "MB/s", "curl -o FILE from the emulator",
               mirror_runs=[round(c["mb_s"]) for c in cold], direct_runs=[round(d["mb_s"]) for d in direct],
               paired_ratios=[round(r, 2) for r in paired], median_paired_ratio=round(statistics.median(paired), 3))
    per_gib = 2**30 / size
    report.add("CPU-seconds per GiB: the mirror vs curl -o", statistics.median(c["mirror cpu_s"] for c in cold)
               * per_gib, statistics.median(d["curl cpu_s"] for d in direct) * per_gib, "CPU-s",
               "curl writing the file", higher_is_better=False)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1G")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--single-stream", action="store_true")
    parser.add_argument("--compare", type=Path, help="also the mirror of this checkout, in every round")
    parser.add_argument("--json")
    args = parser.parse_args()
    size = parse_size(args.size)
    reports, all_rounds = run(size, args.runs, args.single_stream, args.compare)
    for report in reports:
        report.print()
    per_gib = 2**30 / size
    for label, rounds in all_rounds.items():
        print(f"\n{label}: CPU-seconds per GiB, median of {len(rounds)}")
        for key in (k for k in rounds[0] if k.endswith("cpu_s")):
            values = [r[key] * per_gib for r in rounds]
            print(f"  {key:16} {statistics.median(values):6.2f}   runs: {[round(v, 2) for v in values]}")
    write_json(args.json, reports, {**machine(), "size": size, "runs": args.runs,
                                     "single_stream": args.single_stream})


if __name__ == "__main__":
    main()
