"""Ranged reads of a cold large file fetch their windows (issue 28 item 1): upstream bytes against the ideal.

Three 8 MiB ranges (the start, the middle, the end) of the emulator's generated ``acme/huge-data`` ``huge.bin``
(computed from its offset, never stored upstream) through a cold mirror's Xet CAS, as hf_xet asks them (a
reconstruction of the Range, then its xorb ranges), then the same three again, then (unless ``--no-full``) a full
download of the file over plain HTTP. Upstream bytes are counted at the emulator; every byte read is checked against
the generated one. The mirror runs with its defaults (``--fill-window 32M``, ``--sparse-read-ahead 32M``), the
sparse threshold lowered to the file's size when it is under the default 1G.

- the three ranges: upstream bytes against the 24 MiB read (the ideal) and against the bound
  3 x (range + window + read-ahead); the sparse partial file's disk usage;
- the same ranges again: upstream bytes (ideal 0) and X-Mirror-Cache;
- the full download: upstream bytes against the rest of the file (the ideal: each byte once).

    python -m bench.ranges --no-full                 # a 51 GB file: the ranges only (its sha256 takes ~2 min once)
    python -m bench.ranges --size 2G                 # the ranges, then the full download
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Report, curl, finish, machine, parse_size, report_run
from tests.support.hub_emulator.fixtures import generated_bytes
from tests.support.hub_emulator.runner import run_emulator
from tests.support.mirror_proc import MirrorProcess, blob, wait_for
from tests.support.xet_ranges import CasReader

REPO, FILE = "acme/huge-data", "huge.bin"
MIB = 2**20
RANGE = 8 * MIB
WINDOW = READ_AHEAD = 32 * MIB  # the mirror's defaults


@dataclass
class Round:
    seconds: float
    outcomes: list[str]
    upstream: int  # bytes the emulator sent


def run(size: int, workdir: Path, full: bool) -> tuple[Report, dict[str, object]]:
    three = ((0, RANGE - 1), (size // 2, size // 2 + RANGE - 1), (size - RANGE, size - 1))
    flags = ["--sparse-fill-threshold", str(min(size, 2**30))]
    details: dict[str, object] = {"size": size, "flags": " ".join(flags)}
    with run_emulator(workdir / "emulator", huge_file_size=size) as emu, \
            MirrorProcess(emu.url, workdir / "cache", *flags) as mirror:
        etag = emu.files.etag("dataset", REPO, "main", FILE)
        xet_hash = emu.files._file("dataset", REPO, "main", FILE).xet_hash  # noqa: SLF001
        cas = CasReader(mirror.url, "dataset", REPO, emu.files.commit("dataset", REPO, "main"), xet_hash)
        emu.reset_stats()
        rounds: list[Round] = []
        for _ in ("cold", "again"):
            before, began, outcomes = emu.stats().get("bytes_served", 0), time.monotonic(), []
            for start, end in three:
                data, answers = cas.read(start, end)
                if data != generated_bytes(start, end + 1):
                    raise RuntimeError(f"wrong bytes through the mirror at {start}-{end}")
                outcomes += answers
            rounds.append(Round(time.monotonic() - began, outcomes, emu.stats().get("bytes_served", 0) - before))
        partial = workdir / "cache" / "partials" / f"{etag}.part"
        on_disk = partial.stat().st_blocks * 512 if partial.exists() else 0
        details["partial_on_disk_bytes"] = on_disk
        full_seconds = 0.0
        held = emu.stats().get("bytes_served", 0)
        if full:
            began = time.monotonic()
            result = finish(curl(f"{mirror.url}/datasets/{REPO}/resolve/main/{FILE}"))
            if result.status != 200 or result.bytes != size:
                raise RuntimeError(f"full download: HTTP {result.status}, {result.bytes} bytes")
            wait_for(lambda: blob(workdir / "cache", etag).exists(), timeout=600)
            full_seconds = details["full_download_seconds"] = round(time.monotonic() - began, 1)
        total = emu.stats().get("bytes_served", 0)
    cold, again = rounds
    read = 3 * RANGE
    report = Report(f"Three 8 MiB ranges of a cold {size / 1e9:.2f} GB file through the mirror's Xet CAS, upstream "
                    f"bytes against the ideal")
    report.add("upstream bytes for the three ranges (cold)", cold.upstream / MIB, read / MIB, "MiB",
               "the 24 MiB read", higher_is_better=False, bound_mib=3 * (RANGE + WINDOW + READ_AHEAD) // MIB,
               outcomes="/".join(cold.outcomes), seconds=round(cold.seconds, 2))
    report.add("disk taken by the sparse partial file", on_disk / MIB, cold.upstream / MIB, "MiB",
               "the bytes fetched", higher_is_better=False)
    report.add("upstream bytes for the same ranges again", again.upstream / MIB, 0.0, "MiB", "nothing",
               higher_is_better=False, outcomes="/".join(again.outcomes), seconds=round(again.seconds, 2))
    if full:
        rest = size - held
        report.add("upstream bytes for the full download after the ranges", (total - held) / MIB, rest / MIB, "MiB",
                   "the rest of the file", higher_is_better=False, seconds=full_seconds)
        report.add("upstream bytes for the whole run", total / MIB, size / MIB, "MiB", "the file once",
                   higher_is_better=False)
    details.update({"upstream_cold": cold.upstream, "upstream_again": again.upstream, "upstream_total": total})
    return report, details


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default=str(51 * 10**9), help="file size: bytes, or 2G, 300M (default 51 GB)")
    parser.add_argument("--no-full", action="store_true", help="the ranges only: no full download afterwards")
    parser.add_argument("--workdir", type=Path, default=None, help="where the cache goes (default: temp dir)")
    parser.add_argument("--json")
    args = parser.parse_args()
    size = int(args.size) if args.size.isdigit() else parse_size(args.size)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ranges-", dir=args.workdir))
    full = not args.no_full
    if full and shutil.disk_usage(workdir).free < size + 2 * 2**30:
        raise SystemExit(f"the full download of {size / 1e9:.1f} GB needs {(size + 2 * 2**30) / 2**30:.0f} GiB free "
                         f"under {workdir}: pass --workdir, --size or --no-full")
    began = time.monotonic()
    try:
        report, details = run(size, workdir, full)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report_run([report], began, args.json, {**machine(), **details, "argv": sys.argv[1:]}, details)


if __name__ == "__main__":
    main()
