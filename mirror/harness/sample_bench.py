"""A self-contained bench (``hf-mirror bench`` without ``--endpoint``, and ``hf-mirror demo``): the generated
dataset of ``--size`` on disk, the sample Hub serving it, a fresh mirror in front of it for each cold pass, and the
passes of :func:`mirror.harness.passes.plan_sample_passes` measured one after another."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from mirror.harness import services
from mirror.harness.bench import run_passes
from mirror.harness.passes import plan_sample_passes
from mirror.harness.sample_data import ensure, parse_size

DATASET = "demo/bench-text"
TOKENIZER = "demo/bench-tokenizer"
# rows per Arrow record batch (datasets' Parquet ``batch_size``) in a self-contained bench. pyarrow's scan reads and
# decodes a queue of record batches ahead of its reader, in the background: at datasets' default (a row group, 8192
# rows, per batch) that queue holds a whole 128 MB shard, so every loader worker read and decoded its entire shard
# in the first seconds of a pass (~19 CPU s for 16 workers, ~590 MB RSS each; 2.15 GB over HTTP for 20,000 rows).
# 256 rows bound it to the first pre-buffered range (~37 MB, four row groups) per worker; the rows and tokens are
# the same (docs/harness.md: "Read-ahead").
PARQUET_BATCH_ROWS = 256


def run_sample_bench(args: argparse.Namespace) -> dict[str, Any]:
    size = parse_size(args.size)
    t = time.perf_counter()
    data = ensure(size, args.seed, args.data_dir, shards=args.shards)  # generated once, then read from the cache folder
    ready_s = time.perf_counter() - t
    print(f"[bench] dataset {DATASET}: {data.rows:,} rows, {len(data.data_files)} parquet shards, "
          f"{sum(m['size'] for m in data.manifest['dataset_files'].values()) / 1e6:,.1f} MB in "
          f"{len(data.manifest['dataset_files'])} files at {data.root} "
          f"(generated in {data.manifest['generate_s']:.1f}s; ready in {ready_s:.1f}s)", flush=True)
    if args.max_rows and data.rows > args.max_rows:
        print(f"[bench] every pass stops at {args.max_rows:,} of the dataset's {data.rows:,} rows "
              "(--max-rows 0 reads it whole)", flush=True)
    args.dataset, args.tokenizer, args.config, args.split, args.text_column = DATASET, TOKENIZER, None, "train", "text"
    if getattr(args, "parquet_batch_rows", None) is None:  # the flag not given (or the demo's own namespace)
        args.parquet_batch_rows = PARQUET_BATCH_ROWS
    root = Path(tempfile.mkdtemp(prefix="hf-mirror-bench-"))
    hub = services.sample_hub(root, size=args.size, seed=args.seed, data_dir=args.data_dir, shards=args.shards)
    try:
        print(f"[bench] starting the sample hub at {hub.url}", flush=True)
        hub.start()
        specs = plan_sample_passes(args, root, hub.url, data.dataset_dir, data.tokenizer_dir)
        dataset = {"repo": DATASET, "size": data.manifest["size"], "seed": data.manifest["seed"],
                   "rows": data.rows, "shards": len(data.data_files), "folder": str(data.root),
                   "generate_s": data.manifest["generate_s"],
                   "bytes": sum(m["size"] for m in data.manifest["dataset_files"].values()),
                   "files": len(data.manifest["dataset_files"])}
        return run_passes(args, specs, {}, hub=hub.url, extra={"dataset": dataset})
    finally:
        hub.stop()
        shutil.rmtree(root, ignore_errors=True)
