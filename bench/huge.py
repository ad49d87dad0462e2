"""A file over 50 GB through the mirror over Xet (issue 17 item 5), against one direct plain-HTTP stream of it.

The real client (huggingface_hub's ``HfFileSystem`` with hf_xet) fetches ``acme/huge-data`` ``huge.bin`` (generated
upstream from its offset, never stored there) through a cold mirror: the token route, the reconstructions and the
xorb ranges of the mirror's CAS while the mirror fills the blob from upstream and verifies its sha256. The client
writes to ``/dev/null`` (``get_file`` hands the path to hf_xet), since the mirror's blob and a client copy of a
50 GB file would need twice the disk; its bytes are checked instead by ranged reads through the mirror at the start,
across 2^32, across 50 GB and at the end. The reference is a direct single-stream download of the file from the
emulator (curl to /dev/null), in the same run.

    python -m bench.huge                    # 50 GB + 64 MiB: needs ~47 GiB free for the mirror's blob
    python -m bench.huge --size 2G          # the same flow, smaller
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import PeakRss, Report, cpu_seconds, curl, finish, machine, parse_size, report_run
from tests.support.hub_emulator.fixtures import generated_bytes
from tests.support.hub_emulator.runner import run_emulator
from tests.support.mirror_proc import MirrorProcess, metric, run_client

OVER_50GB = 50 * 10**9 + 64 * 2**20
REPO, FILE = "acme/huge-data", "huge.bin"
CHECK = 1 << 20  # bytes read at each checked offset

CLIENT = """
import json, hashlib, sys, time
from huggingface_hub import HfFileSystem
path = "datasets/{repo}/{file}"
fs = HfFileSystem()
t = time.monotonic()
info = fs.info(path)
fs.get_file(path, "/dev/null")
took = time.monotonic() - t
checks = {{}}
with fs.open(path, "rb") as f:
    for offset in {offsets}:
        f.seek(offset)
        checks[str(offset)] = hashlib.sha256(f.read({check})).hexdigest()
print(json.dumps(dict(seconds=took, size=info["size"], xet_hash=info.get("xet_hash"), checks=checks)))
"""


def run(size: int, workdir: Path) -> tuple[Report, dict[str, object]]:
    # The start, across 2^32, across the 50 GB limit, the end (each clamped into the file).
    offsets = sorted({max(0, min(at, size - CHECK)) for at in (0, 2**32 - CHECK // 2, 50 * 10**9 - CHECK // 2, size)})
    expected = {str(o): hashlib.sha256(generated_bytes(o, min(o + CHECK, size))).hexdigest() for o in offsets}
    with run_emulator(workdir / "emulator", huge_file_size=size) as emu, \
            MirrorProcess(emu.url, workdir / "cache") as mirror:
        assert mirror.proc is not None
        code = CLIENT.format(repo=REPO, file=FILE, offsets=offsets, check=CHECK)
        emu.reset_stats()
        cpu_before = cpu_seconds(mirror.proc.pid)
        with PeakRss(mirror.proc.pid) as rss:
            out: Any = run_client(code, mirror.url, workdir / "home", timeout=4 * 3600, HF_HUB_DISABLE_XET="0")
        client_done = time.monotonic()
        while metric(mirror, "hf_mirror_fills_in_flight") and time.monotonic() - client_done < 600:
            time.sleep(0.2)  # the fill's commit (its fsync) may end after the client's last verified byte
        commit_lag = time.monotonic() - client_done
        mirror_cpu = cpu_seconds(mirror.proc.pid) - cpu_before
        upstream_bytes = emu.stats().get("bytes_served", 0)
        xet_bytes = metric(mirror, "hf_mirror_served_bytes_total", source="xet")
        xorbs = metric(mirror, "hf_mirror_requests_total", route="xet-xorb")
        blob_bytes = sum(f.stat().st_size for f in (workdir / "cache" / "blobs").rglob("*") if f.is_file())
        if out["size"] != size or out["checks"] != expected or not out["xet_hash"] or not xorbs:
            raise RuntimeError(f"wrong answer through the mirror: {out} (xorb requests {xorbs})")
        direct = finish(curl(f"{emu.url}/datasets/{REPO}/resolve/main/{FILE}", follow=True))
        if direct.status != 200 or direct.bytes != size:
            raise RuntimeError(f"direct download: HTTP {direct.status}, {direct.bytes} bytes")
    report = Report(f"A {size / 1e9:.2f} GB file through the mirror over Xet (cold), against one direct stream")
    report.add("cold Xet download through the mirror (client wall time)", size / out["seconds"] / 1e6,
               size / direct.seconds / 1e6, "MB/s", "direct single stream (curl)", seconds=round(out["seconds"], 1),
               direct_seconds=round(direct.seconds, 1))
    details = {"size": size, "client_seconds": out["seconds"], "direct_seconds": direct.seconds,
               "mirror_peak_rss_mib": round(rss.peak / 2**20, 1), "mirror_cpu_seconds": round(mirror_cpu, 1),
               "upstream_bytes_per_file_byte": round(upstream_bytes / size, 4) if upstream_bytes else None,
               "xet_bytes_served_per_file_byte": round(xet_bytes / size, 4), "xorb_requests": int(xorbs),
               "blob_bytes_on_disk": blob_bytes,
               "commit_after_client_seconds": round(commit_lag, 1), "checked_offsets": offsets}
    return report, details


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default=str(OVER_50GB), help="file size: bytes, or 2G, 64M (default 50 GB + 64 MiB)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the cache goes (default: temp dir)")
    parser.add_argument("--json")
    args = parser.parse_args()
    size = int(args.size) if args.size.isdigit() else parse_size(args.size)
    workdir = Path(tempfile.mkdtemp(prefix="bench-huge-", dir=args.workdir))
    need = size + 2 * 2**30
    if shutil.disk_usage(workdir).free < need:
        raise SystemExit(f"{size / 1e9:.1f} GB needs {need / 2**30:.0f} GiB free under {workdir} for the mirror's "
                         f"blob; only {shutil.disk_usage(workdir).free / 2**30:.0f} GiB: pass --workdir or --size")
    began = time.monotonic()
    try:
        report, details = run(size, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report_run([report], began, args.json, {**machine(), **details}, details)


if __name__ == "__main__":
    main()
