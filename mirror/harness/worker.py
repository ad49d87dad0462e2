"""One measured pass, in a fresh interpreter (``python -m mirror.harness --worker CONFIG``): it loads the data
as a training job does and reports events on stdout, each line prefixed with ``EVENT_PREFIX``."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mirror.harness.protocol import EVENT_PREFIX, EXIT_USER_ERROR, MISSING_COLUMN, HarnessError


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(EVENT_PREFIX + json.dumps(event) + "\n")
    sys.stdout.flush()


def _install_socket_counter() -> Any:
    """Count every byte received on a socket by this process and its (forked) DataLoader workers."""
    import multiprocessing
    import socket
    import ssl

    counter = multiprocessing.Value("Q", 0)

    def add(n: int) -> None:
        with counter.get_lock():
            counter.value += n

    def wrap(cls: type, name: str, size_of: Callable[[Any, tuple[Any, ...]], int]) -> None:
        original = getattr(cls, name)

        def patched(self: Any, *a: Any, **kw: Any) -> Any:
            out = original(self, *a, **kw)
            add(size_of(out, a))
            return out

        setattr(cls, name, patched)

    def of_bytes(out: Any, _: tuple[Any, ...]) -> int:
        return len(out) if isinstance(out, bytes | bytearray) else 0

    def of_count(out: Any, _: tuple[Any, ...]) -> int:
        return out if isinstance(out, int) else 0

    wrap(socket.socket, "recv", of_bytes)
    wrap(socket.socket, "recv_into", of_count)
    # TLS: the SSLSocket methods read through the C TLS object, not socket.socket.recv*, so count them as well
    wrap(ssl.SSLSocket, "recv", of_bytes)
    wrap(ssl.SSLSocket, "recv_into", of_count)
    return counter


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its reaped children: the loader workers, once joined."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _rchar() -> int | None:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


# characters of a row kept per token of --max-length before tokenizing (early truncation, below): twice what
# English text takes per token, so that the fallback to the whole row stays rare
HEAD_CHARS_PER_TOKEN = 8


def head_of(text: str, budget: int) -> str:
    """The row cut before the last space that follows a non-space within ``budget`` characters (the whole row when
    it is shorter or has no such space). Tokenizers split words at spaces and normalize characters locally, so the
    tokens of the head are the first tokens of the whole row."""
    if len(text) <= budget:
        return text
    cut = text.rfind(" ", 1, budget)
    while cut > 0 and text[cut - 1].isspace():
        cut = text.rfind(" ", 1, cut)
    return text[:cut] if cut > 0 else text


class Collate:
    """The ``collate_fn``: tokenize a list of rows; tensors when torch is there, numpy otherwise.

    Truncation happens early: a tokenizer reads the whole row even when it keeps ``max_length`` tokens, so each row
    is first cut to its head (:func:`head_of`, ``max_length * HEAD_CHARS_PER_TOKEN`` characters). The batch is the
    one the whole rows give: a cut row whose head gave fewer than ``max_length`` tokens is tokenized again whole
    (the batch once more, rare). Rows shorter than the budget are not touched."""

    def __init__(self, tokenizer: Any, column: str, max_length: int, tensors: str) -> None:
        self.tokenizer, self.column, self.max_length, self.tensors = tokenizer, column, max_length, tensors
        # only for right-side truncation (the default): with left-side the tail is what stays
        self.budget = max_length * HEAD_CHARS_PER_TOKEN \
            if max_length and getattr(tokenizer, "truncation_side", "right") == "right" else 0

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        if rows and self.column not in rows[0]:
            raise KeyError(f"{MISSING_COLUMN}: column {self.column!r} not in the dataset; columns: "
                           f"{sorted(rows[0])}")
        texts = [r[self.column] for r in rows]
        heads = [head_of(t, self.budget) for t in texts] if self.budget else texts
        enc = self._encode(heads)
        if heads is not texts:
            lengths = enc["attention_mask"].sum(1).tolist()
            short = [i for i, (h, t) in enumerate(zip(heads, texts, strict=True))
                     if len(h) < len(t) and lengths[i] < self.max_length]
            if short:  # a head gave too few tokens: those rows whole
                for i in short:
                    heads[i] = texts[i]
                enc = self._encode(heads)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def _encode(self, texts: list[str]) -> Any:
        return self.tokenizer(texts, padding="longest", truncation=True, max_length=self.max_length,
                              return_tensors=self.tensors)


def _classify(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, HarnessError):
        return exc.kind, exc.message
    text = f"{type(exc).__name__}: {exc}"
    name = type(exc).__name__
    if MISSING_COLUMN in text:
        line = next((ln for ln in text.splitlines() if MISSING_COLUMN in ln), text)
        return "missing_column", line.split(MISSING_COLUMN + ": ", 1)[-1].strip("'\"")
    if name in ("DatasetNotFoundError", "DataFilesNotFoundError", "EmptyDatasetError"):
        return "unknown_dataset", text
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return "unknown_repo", text
    if "is not a valid model identifier" in text or "Can't load tokenizer" in text:
        return "unknown_tokenizer", text
    if name in ("ConnectError", "ConnectTimeout", "ConnectionError") or "Connection refused" in text:
        return "unreachable_endpoint", text
    if isinstance(exc, ValueError) and ("Bad split" in text or "Unknown split" in text or "config" in text.lower()):
        return "bad_split_or_config", text
    return "pass_failed", text


def worker_main(cfg: dict[str, Any]) -> int:
    counter = _install_socket_counter()
    try:
        result = _measure(cfg, counter)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        import traceback

        kind, message = _classify(exc)
        traceback.print_exc()
        _emit({"event": "error", "kind": kind, "message": message})
        return EXIT_USER_ERROR if kind != "pass_failed" else 1
    _emit(result)
    return 0


class _ForkedWorkers:
    """Without torch: DataLoader-like worker processes (forked, as DataLoader's are on Linux). Worker ``i`` of ``n``
    iterates ``ds.shard(num_shards=n, index=i, contiguous=False)`` of an IterableDataset, which is what ``datasets``
    gives DataLoader worker ``i``, collates batches and sends them back; ``prefetch`` batches per worker at most."""

    def __init__(self, ds: Any, workers: int, batch_size: int, collate: Collate, rchar: Any,
                 prefetch: int = 2) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.queue = ctx.Queue(maxsize=prefetch * workers)
        self.live = workers
        self.procs = [ctx.Process(target=_forked_worker, daemon=True,
                                  args=(ds.shard(num_shards=workers, index=i, contiguous=False), batch_size, collate,
                                        self.queue, rchar)) for i in range(workers)]
        for proc in self.procs:
            proc.start()

    def __iter__(self) -> _ForkedWorkers:
        return self

    def __next__(self) -> dict[str, Any]:
        while self.live:
            item = self.queue.get()
            if item is None:
                self.live -= 1
            elif isinstance(item, str):
                raise RuntimeError(f"a loader worker failed:\n{item}")
            else:
                return item
        raise StopIteration

    def close(self) -> None:
        for proc in self.procs:  # ours, by PID
            if proc.is_alive():
                proc.terminate()
            proc.join(timeout=5)


def _forked_worker(ds: Any, batch_size: int, collate: Collate, queue: Any, rchar: Any) -> None:
    import signal

    import fsspec.asyn

    def stopped(*_: Any) -> None:  # terminated by the parent (--max-rows): its reads still count (local MB/s)
        _add_rchar(rchar)
        os._exit(0)

    signal.signal(signal.SIGTERM, stopped)
    fsspec.asyn.reset_lock()  # as datasets does in a DataLoader worker: the parent's fsspec loop is not ours
    try:
        for b in ds.iter(batch_size=batch_size):
            queue.put(collate([dict(zip(b, vals, strict=True)) for vals in zip(*b.values(), strict=True)]))
    except Exception:  # noqa: BLE001 - handed to the parent, which fails the pass with it
        import traceback

        queue.put(traceback.format_exc())
    _add_rchar(rchar)
    queue.put(None)


def _add_rchar(rchar: Any) -> None:
    """Add this (worker) process's bytes read since its fork to the shared counter (local passes' MB/s)."""
    mine = _rchar()
    if rchar is not None and mine is not None:
        with rchar.get_lock():
            rchar.value += mine


def _torch_worker_init(rchar: Any) -> Callable[[int], None]:
    def init(_: int) -> None:
        import multiprocessing.util

        # a DataLoader worker leaves through multiprocessing's exit path, which runs Finalize callbacks (not atexit)
        multiprocessing.util.Finalize(None, _add_rchar, args=(rchar,), exitpriority=100)

    return init


class _Step:
    """The simulated training step: ``step_ms`` of work per batch. On a GPU real matmuls, calibrated to that
    duration and waited for (the batch's copy, issued before, overlaps with the previous step); else a sleep."""

    def __init__(self, step_ms: float, torch: Any, cuda: bool) -> None:
        self.seconds, self.torch, self.reps = step_ms / 1000, torch, 0
        self.kind = "sleep" if step_ms else "none"
        if step_ms and cuda:
            a = torch.randn(2048, 2048, device="cuda")
            self.a, self.b, self.c = a, torch.randn_like(a), torch.empty_like(a)
            torch.mm(self.a, self.b, out=self.c)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(20):
                torch.mm(self.a, self.b, out=self.c)
            torch.cuda.synchronize()
            per = (time.perf_counter() - t) / 20
            self.reps, self.kind = max(1, round(self.seconds / per)), "matmul"

    def __call__(self) -> None:
        if self.kind == "matmul":
            for _ in range(self.reps):
                self.torch.mm(self.a, self.b, out=self.c)
            self.torch.cuda.synchronize()
        elif self.kind == "sleep":
            time.sleep(self.seconds)


def _measure(cfg: dict[str, Any], counter: Any) -> dict[str, Any]:
    import multiprocessing

    t_imports = time.perf_counter()
    import datasets
    from transformers import AutoTokenizer

    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        torch = None  # type: ignore[assignment]
    import_s = time.perf_counter() - t_imports
    _emit({"event": "ready", "import_s": import_s})
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(0)

    device, device_note = "cpu", "torch absent" if torch is None else ""
    if torch is not None:
        has_cuda = torch.cuda.is_available()
        if cfg["device"] == "cuda" and not has_cuda:
            raise HarnessError("no_cuda", "--device cuda asked, but torch sees no CUDA device")
        if cfg["device"] != "cpu" and has_cuda:
            device, device_note = "cuda", torch.cuda.get_device_name(0)
        else:
            device_note = "asked for cpu" if cfg["device"] == "cpu" else "no CUDA device found"
    cuda = device == "cuda"
    step = _Step(cfg["step_ms"], torch, cuda)
    workers = int(cfg["workers"])
    streaming = not cfg.get("nonstreaming")

    worker_rchar = multiprocessing.Value("Q", 0)
    rchar0 = _rchar()
    bytes0 = counter.value
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(cfg["tokenizer"])
    tokenizer_s = time.perf_counter() - t0
    source = cfg["local_dir"] or cfg["dataset"]
    # Parquet's record batch size bounds pyarrow's background read-ahead (mirror/harness/sample_bench.py); 0 leaves
    # datasets' default
    batch_rows = int(cfg.get("parquet_batch_rows") or 0)
    ds = datasets.load_dataset(source, cfg["config"], split=cfg["split"], streaming=streaming,
                               **({"batch_size": batch_rows} if batch_rows else {}))
    load_s = time.perf_counter() - t0
    features = getattr(ds, "features", None)
    if features is not None and cfg["text_column"] not in features:
        raise HarnessError("missing_column", f"column {cfg['text_column']!r} not in the dataset; "
                                             f"columns: {sorted(features)}")
    if cfg["shuffle_buffer"]:
        ds = ds.shuffle(seed=0, buffer_size=cfg["shuffle_buffer"]) if streaming else ds.shuffle(seed=0)
    n_shards = getattr(ds, "n_shards", None) if streaming else None
    # datasets gives each DataLoader worker whole shards: workers beyond the shard count idle (it warns)
    active = min(workers, n_shards) if n_shards else workers
    collate = Collate(tokenizer, cfg["text_column"], cfg["max_length"], "pt" if torch is not None else "np")

    pool: _ForkedWorkers | None = None
    if torch is not None:
        loader = DataLoader(ds, batch_size=cfg["batch_size"], collate_fn=collate, num_workers=workers,
                            pin_memory=cuda, worker_init_fn=_torch_worker_init(worker_rchar) if workers else None,
                            persistent_workers=False)
        batches: Any = iter(loader)
        loader_kind = "torch DataLoader"
    elif workers and streaming:
        batches = pool = _ForkedWorkers(ds, active, cfg["batch_size"], collate, worker_rchar)
        loader_kind = "forked workers (no torch)"
    else:
        if workers:
            device_note += "; without torch a non-streaming load runs in-process"
        batches = (collate([dict(zip(b, vals, strict=True)) for vals in zip(*b.values(), strict=True)])
                   for b in ds.iter(batch_size=cfg["batch_size"]))
        loader_kind = "in-process (no torch)"

    rows = tokens = h2d_bytes = 0
    wait_s = 0.0
    copies: list[tuple[Any, Any]] = []
    ttfb_s: float | None = None
    t_first: float | None = None
    first_rows = 0
    stopped_early = False
    last_emit = 0.0
    max_rows = cfg["max_rows"] or 0
    rchar_loop = _rchar()
    loop_start = time.perf_counter()
    try:
        while True:
            tw = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                break
            wait_s += time.perf_counter() - tw
            n = int(batch["input_ids"].shape[0])
            if max_rows and rows + n >= max_rows:
                n, stopped_early = max_rows - rows, True
            if cuda:
                # queued on the stream from pinned memory; the events time the copy without stalling the host
                before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                before.record()
                moved = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                after.record()
                copies.append((before, after))
                h2d_bytes += sum(v.numel() * v.element_size() for v in moved.values())
            tokens += int(batch["attention_mask"][:n].sum())
            rows += n
            now = time.perf_counter()
            if ttfb_s is None:
                ttfb_s, t_first, first_rows = now - t0, now, n
            step()
            now = time.perf_counter()
            if now - last_emit > 0.2:
                _emit({"event": "progress", "t": now - t0, "rows": rows, "bytes": counter.value - bytes0})
                last_emit = now
            if stopped_early:
                break
            if cfg["max_seconds"] and now - t0 > cfg["max_seconds"]:
                stopped_early = True
                break
        if cuda:
            torch.cuda.synchronize()
        end = time.perf_counter()
    finally:
        if pool is not None:
            pool.close()
        del batches  # shuts down DataLoader workers, if any
    # after the workers are joined, so that their CPU is in RUSAGE_CHILDREN
    cpu_s = _cpu_s() - cpu0
    h2d_s = sum(b.elapsed_time(a) for b, a in copies) / 1000 if copies else 0.0
    _emit({"event": "progress", "t": end - t0, "rows": rows, "bytes": counter.value - bytes0})
    total_s = end - t0
    loop_s = end - loop_start
    socket_bytes = counter.value - bytes0
    rchar1 = _rchar()
    if cfg["local_dir"] and workers and loader_kind != "in-process (no torch)":
        # local files are read with read(), not sockets: /proc/self/io rchar of each loader worker (added by the
        # worker as it exits) and of this process until the loop (during it, this process reads batches from the
        # workers' pipes, which are no file reads)
        read_bytes = (rchar_loop - rchar0 + worker_rchar.value) if rchar0 is not None and rchar_loop is not None \
            else None
        read_method = "proc_rchar" if read_bytes is not None else "unavailable"
    elif cfg["local_dir"]:
        read_bytes = (rchar1 - rchar0) if rchar0 is not None and rchar1 is not None else None
        read_method = "proc_rchar" if read_bytes is not None else "unavailable"
    else:
        read_bytes, read_method = socket_bytes, "socket_recv"
    steady_s = end - t_first if t_first is not None else 0.0
    mb_per_s = read_bytes / 1e6 / total_s if read_bytes is not None and total_s > 0 else None
    stall = wait_s / loop_s if loop_s > 0 else None
    return {
        "event": "result", "rows": rows, "tokens": tokens, "batches": math.ceil(rows / cfg["batch_size"]),
        "stopped_early": stopped_early, "import_s": import_s, "tokenizer_load_s": tokenizer_s,
        "load_dataset_s": load_s, "ttfb_s": ttfb_s, "first_batch_s": ttfb_s, "total_s": total_s,
        "rows_per_s": rows / total_s if total_s > 0 else None,
        "steady_rows_per_s": (rows - first_rows) / steady_s if steady_s > 0 and rows > first_rows else None,
        "tokens_per_s": tokens / total_s if total_s > 0 else None,
        "read_bytes": read_bytes, "read_method": read_method, "socket_bytes": socket_bytes,
        "read_mb_per_s": mb_per_s, "mb_per_s": mb_per_s,
        "h2d_bytes": h2d_bytes if cuda else None, "h2d_s": h2d_s if cuda else None,
        "h2d_gb_per_s": h2d_bytes / 1e9 / h2d_s if cuda and h2d_s > 0 else None,
        "wait_s": wait_s, "loop_s": loop_s, "cpu_s": cpu_s, "starvation_ratio": stall, "stall_fraction": stall,
        "step_ms": cfg["step_ms"], "step_kind": step.kind, "step_reps": step.reps,
        "workers": workers, "active_workers": active, "n_shards": n_shards, "streaming": streaming,
        "loader": loader_kind, "batch_size": cfg["batch_size"], "max_length": cfg["max_length"],
        "parquet_batch_rows": batch_rows or None,
        "device": device, "device_note": device_note, "torch": getattr(torch, "__version__", None),
        "datasets": datasets.__version__, "pinned_memory": cuda,
    }


def worker_entry(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--worker":
        print("internal entry point of hf-mirror bench; use `hf-mirror bench`", file=sys.stderr)
        return 2
    rc = worker_main(json.loads(argv[1]))
    # the figures are out: skip the interpreter's teardown of torch/datasets/transformers (seconds on a small box)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
