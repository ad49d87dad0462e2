"""Memory under load: the mirror's peak RSS while it fills a large file and serves many clients at once.

One client downloads the whole ``--size`` file cold (one fill) while ``--readers`` clients each read the first
``--read-size`` bytes of it (followers of the fill); then the same readers again, warm, from the committed blob.
The reference is the target of issue 4 (150 MiB); the file's bytes must never be held in memory.

    python -m bench.memory --size 10G --readers 8 --read-size 1G [--json out.json]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from pathlib import Path

from bench.common import (
    BIG_PATH,
    PeakRss,
    Report,
    add_common_arguments,
    emulator,
    ensure_tools,
    mirror,
    parallel_get,
    parse_size,
    print_and_save,
)

RSS_TARGET_MIB = 150


def run(size: int, readers: int, read_size: int, workers: int) -> list[Report]:
    report = Report(f"Peak RSS: filling a {size / 2**30:.1f} GiB file while {readers} clients each read "
                    f"{read_size / 2**30:.1f} GiB of it")
    read_range = f"0-{min(read_size, size) - 1}"
    with emulator(size) as emu, tempfile.TemporaryDirectory(prefix="hf-bench-mem-") as tmp:
        with mirror(emu.url, Path(tmp) / "cache", "--workers", str(workers)) as proc:
            assert proc.proc is not None
            url = proc.url + BIG_PATH
            whole: dict[str, float] = {}
            with PeakRss(proc.proc.pid) as cold_rss:
                filler = threading.Thread(target=lambda: whole.update(parallel_get(url, 1)))
                filler.start()
                cold = parallel_get(url, readers, range_spec=read_range)
                filler.join()
            with PeakRss(proc.proc.pid) as warm_rss:
                warm = parallel_get(url, readers, range_spec=read_range)
            fetches = emu.fetch_count("dataset", "acme/big-data", "big.bin")
    report.add("peak RSS, cold (1 fill + followers)", cold_rss.peak / 2**20, RSS_TARGET_MIB, "MiB", "target",
               higher_is_better=False, fill_mb_s=round(whole["mb_s"], 1), readers_mb_s=round(cold["mb_s"], 1))
    report.add("peak RSS, warm", warm_rss.peak / 2**20, RSS_TARGET_MIB, "MiB", "target", higher_is_better=False,
               readers_mb_s=round(warm["mb_s"], 1))
    report.add("upstream fetches", fetches, 1, "count", "ideal", higher_is_better=False)
    return [report]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--read-size", default="1G", help="bytes each reader takes from the start of the file")
    parser.set_defaults(size="10G")
    args = parser.parse_args()
    ensure_tools()
    size = parse_size(args.size)
    print_and_save(run(size, args.readers, parse_size(args.read_size), args.workers), args, size)


if __name__ == "__main__":
    main()
