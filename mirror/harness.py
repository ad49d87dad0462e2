"""``hf-mirror bench``: stream a dataset through an endpoint into a (GPU) training loop and measure it.

It loads data the way a training job does: ``datasets.load_dataset(..., streaming=True)``, an ``AutoTokenizer``
(loaded through the same endpoint) in a ``collate_fn``, a PyTorch ``DataLoader``, and batches moved to the device
from pinned memory with ``non_blocking=True``. Every measured pass runs in a fresh interpreter, because the HF
libraries read ``HF_ENDPOINT`` at import time: a *cold* pass with an empty ``HF_HOME``, then a *warm* pass with the
same ``HF_HOME`` again (tokenizer in the client cache, dataset files in the mirror's cache).

This module talks HTTP only and is never imported by the server. See docs/harness.md for the meaning of each figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENT_PREFIX = "@@hf-mirror-harness "
EXIT_USER_ERROR = 2
_MISSING_COLUMN = "HARNESS_MISSING_COLUMN"


class HarnessError(Exception):
    """A problem the user can fix (bad endpoint, unknown repo, missing column): a clear message, exit code 2."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


# --------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--endpoint", required=True, help="the endpoint to measure (your mirror), e.g. http://127.0.0.1:8090")
    add("--dataset", required=True, help="dataset repo id, e.g. demo/tiny-text")
    add("--config", default=None, help="dataset config name (default: the dataset's default)")
    add("--split", default="train", help="split to stream (default train)")
    add("--text-column", default="text", help="column fed to the tokenizer (default text)")
    add("--tokenizer", required=True, help="model repo whose tokenizer is loaded through the endpoint")
    add("--batch-size", type=int, default=32, help="rows per batch (default 32)")
    add("--max-length", type=int, default=128, help="tokenizer truncation length (default 128)")
    add("--num-workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    add("--shuffle-buffer", type=int, default=0, help="IterableDataset.shuffle buffer size; 0 = no shuffle")
    add("--max-rows", type=int, default=None, help="stop after this many rows per pass")
    add("--max-seconds", type=float, default=None, help="stop a pass after this many seconds")
    add("--step-ms", type=float, default=0.0,
        help="simulated consumer compute per batch in ms (default 0); makes the starvation ratio meaningful")
    add("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where batches go (default auto)")
    add("--compare-direct", metavar="URL", default=None,
        help="run the same cold+warm passes against this endpoint too (the Hub, or the upstream itself)")
    add("--compare-local", metavar="DIR", type=Path, default=None,
        help="also stream the dataset's files from this local folder (the ceiling)")
    add("--json", metavar="FILE", type=Path, default=None, help="write all figures to this JSON file")
    add("--plot", metavar="FILE.png", type=Path, default=None, help="plot throughput over time (needs matplotlib)")
    add("--timeout", type=float, default=600.0, help="seconds one pass may take before it is killed (default 600)")


def run(args: argparse.Namespace) -> int:
    try:
        report = run_bench(args)
    except HarnessError as exc:
        print(f"hf-mirror bench: error ({exc.kind}): {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0 if report["passes"] else 1


# --------------------------------------------------------------------------------------------------------------
# Parent side: pre-flight, passes in subprocesses, display
# --------------------------------------------------------------------------------------------------------------

@dataclass
class PassSpec:
    name: str
    endpoint: str
    hf_home: Path
    local_dir: Path | None = None
    offline: bool = False


@dataclass
class PassOutcome:
    spec: PassSpec
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    timeline: list[dict[str, Any]] = field(default_factory=list)


def _http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    import httpx

    headers = {}
    if os.environ.get("HF_TOKEN"):
        headers["authorization"] = f"Bearer {os.environ['HF_TOKEN']}"
    response = httpx.get(url, timeout=timeout, headers=headers, follow_redirects=True)
    return response.status_code, response.text


def preflight(endpoint: str, dataset: str | None, tokenizer: str) -> None:
    """Fail fast, with a clear message, on an unreachable endpoint or an unknown dataset/tokenizer repo."""
    import httpx

    base = endpoint.rstrip("/")
    checks = [("model", tokenizer, "unknown_tokenizer")]
    if dataset is not None:
        checks.insert(0, ("dataset", dataset, "unknown_dataset"))
    for kind, repo, error_kind in checks:
        url = f"{base}/api/{kind}s/{repo}"
        try:
            status, _ = _http_get(url)
        except httpx.HTTPError as exc:
            raise HarnessError("unreachable_endpoint", f"cannot reach {endpoint}: {exc!r}") from exc
        if status in (401, 403, 404):
            raise HarnessError(error_kind, f"{kind} {repo!r} not found at {endpoint} (HTTP {status}; "
                                           "a gated or private repo needs HF_TOKEN)")
        if status >= 400:
            raise HarnessError("endpoint_error", f"{url} answered HTTP {status}")


def scrape_bytes_served(endpoint: str) -> float | None:
    """Sum of ``hf_mirror_bytes_served_total`` on the endpoint's /metrics, or None when it has none (not a mirror)."""
    try:
        status, text = _http_get(endpoint.rstrip("/") + "/metrics", timeout=5)
    except Exception:  # noqa: BLE001 - any failure means "no metrics"
        return None
    if status != 200:
        return None
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("hf_mirror_bytes_served_total"):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    if not seen and "hf_mirror_bytes_served" in text:
        return 0.0  # a mirror that has served nothing yet: the labelled counter has no samples
    return total if seen else None


def pass_env(spec: PassSpec) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    if os.environ.get("HF_TOKEN"):
        env["HF_TOKEN"] = os.environ["HF_TOKEN"]
    env.update(HF_ENDPOINT=spec.endpoint.rstrip("/"), HF_HOME=str(spec.hf_home), HF_HUB_DISABLE_TELEMETRY="1",
               HF_UPDATE_DOWNLOAD_COUNTS="0", HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               HF_DATASETS_DISABLE_PROGRESS_BARS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent),
                                                      os.environ.get("PYTHONPATH", "")) if p))
    if spec.offline:
        env["HF_HUB_OFFLINE"] = "1"
        env["HF_DATASETS_OFFLINE"] = "1"
    return env


@dataclass
class PendingPass:
    """A pass's interpreter, started and importing its libraries, waiting for ``go`` on stdin before it measures."""

    spec: PassSpec
    proc: subprocess.Popen[str]
    stderr_path: Path


def start_pass(spec: PassSpec, args: argparse.Namespace) -> PendingPass:
    cfg = {"dataset": args.dataset, "config": args.config, "split": args.split, "text_column": args.text_column,
           "tokenizer": args.tokenizer, "batch_size": args.batch_size, "max_length": args.max_length,
           "num_workers": args.num_workers, "shuffle_buffer": args.shuffle_buffer, "max_rows": args.max_rows,
           "max_seconds": args.max_seconds, "device": args.device, "step_ms": args.step_ms,
           "local_dir": str(spec.local_dir) if spec.local_dir else None}
    spec.hf_home.mkdir(parents=True, exist_ok=True)
    stderr_path = spec.hf_home.parent / f"{spec.name}.stderr.log"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "mirror.harness", "--worker", json.dumps(cfg)],
                                env=pass_env(spec), cwd=spec.hf_home.parent, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
    return PendingPass(spec, proc, stderr_path)


def stop_pass(pending: PendingPass) -> None:
    """Stop a pass's interpreter by PID (idempotent)."""
    if pending.proc.poll() is None:
        pending.proc.kill()
    pending.proc.wait()
    for stream in (pending.proc.stdin, pending.proc.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


def finish_pass(pending: PendingPass, args: argparse.Namespace,
                on_progress: Callable[[dict[str, Any]], None]) -> PassOutcome:
    """Wait for the pass to be ready, let it measure, collect its events and wait for its exit."""
    spec, proc = pending.spec, pending.proc
    outcome = PassOutcome(spec)
    served_before: float | None = None
    assert proc.stdin is not None and proc.stdout is not None
    timer = threading.Timer(args.timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            if not line.startswith(EVENT_PREFIX):
                continue
            event = json.loads(line[len(EVENT_PREFIX):])
            if event["event"] == "ready":
                served_before = None if spec.local_dir else scrape_bytes_served(spec.endpoint)
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif event["event"] == "progress":
                outcome.timeline.append(event)
                on_progress(event)
            elif event["event"] == "result":
                outcome.result = event
            elif event["event"] == "error":
                outcome.error = event
        proc.wait()
    finally:
        timer.cancel()
        stop_pass(pending)
    if outcome.result is None and outcome.error is None:
        tail = pending.stderr_path.read_text(errors="replace")[-3000:]
        outcome.error = {"kind": "pass_failed", "message": f"pass exited with {proc.returncode}:\n{tail}"}
    if outcome.result is not None:
        outcome.result["name"] = spec.name
        served_after = None if spec.local_dir else scrape_bytes_served(spec.endpoint)
        served = (served_after - served_before) if served_before is not None and served_after is not None else None
        outcome.result["endpoint_bytes_served"] = served
        outcome.result["endpoint"] = None if spec.local_dir else spec.endpoint
        outcome.result["local_dir"] = str(spec.local_dir) if spec.local_dir else None
    return outcome


def plan_passes(args: argparse.Namespace, root: Path) -> list[PassSpec]:
    mirror_home = root / "hf-home-endpoint"
    passes = [PassSpec("endpoint-cold", args.endpoint, mirror_home), PassSpec("endpoint-warm", args.endpoint,
                                                                              mirror_home)]
    if args.compare_direct:
        direct_home = root / "hf-home-direct"
        passes += [PassSpec("direct-cold", args.compare_direct, direct_home),
                   PassSpec("direct-warm", args.compare_direct, direct_home)]
    if args.compare_local:
        # the tokenizer comes from the endpoint passes' client cache, offline: only the data is read from disk
        passes.append(PassSpec("local", args.endpoint, mirror_home, local_dir=args.compare_local, offline=True))
    return passes


def run_bench(args: argparse.Namespace, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Run every pass and report. Raises HarnessError on a user error (after printing what ran)."""
    preflight(args.endpoint, args.dataset, args.tokenizer)
    if args.compare_direct:
        preflight(args.compare_direct, args.dataset, args.tokenizer)
    if args.compare_local is not None and not Path(args.compare_local).is_dir():
        raise HarnessError("missing_local_dir", f"--compare-local {args.compare_local}: not a directory")
    tty = sys.stdout.isatty()
    root = Path(tempfile.mkdtemp(prefix="hf-mirror-bench-"))
    outcomes: list[PassOutcome] = []
    # every pass's interpreter is started (and imports torch/datasets/transformers) up front; idle ones block on
    # stdin, so only one pass at a time measures, and none runs while another measures
    pending = [start_pass(spec, args) for spec in plan_passes(args, root)]
    try:
        for p in pending:
            outcomes.append(_run_with_display(p, args, tty))
            if outcomes[-1].error is not None:
                break
    finally:
        for p in pending:
            stop_pass(p)
        shutil.rmtree(root, ignore_errors=True)
    report = build_report(args, outcomes, labels or {})
    print_report(report, tty)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        message = write_plot(outcomes, args.plot, labels or {})
        print(message)
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        err = failed[0].error or {}
        kind = str(err.get("kind", "pass_failed"))
        message = f"pass {failed[0].spec.name}: {err.get('message', '')}"
        if kind == "pass_failed":
            print(f"hf-mirror bench: {message}", file=sys.stderr)
            report["passes"] = []
            return report
        raise HarnessError(kind, message)
    return report


def _run_with_display(pending: PendingPass, args: argparse.Namespace, tty: bool) -> PassOutcome:
    spec = pending.spec
    if not tty:
        print(f"[bench] {spec.name}: running against {spec.local_dir or spec.endpoint}", flush=True)
        outcome = finish_pass(pending, args, lambda event: None)
        if outcome.result:
            r = outcome.result
            print(f"[bench] {spec.name}: {r['rows']} rows in {r['total_s']:.2f}s, first batch {r['ttfb_s']:.2f}s",
                  flush=True)
        return outcome
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed} rows"),
                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), transient=True) as progress:
        task = progress.add_task(spec.name, total=args.max_rows, rate="")

        def update(event: dict[str, Any]) -> None:
            rate = f"{event['rows'] / event['t']:.0f} rows/s" if event.get("t") else ""
            progress.update(task, completed=event["rows"], rate=rate)

        return finish_pass(pending, args, update)


def build_report(args: argparse.Namespace, outcomes: list[PassOutcome], labels: dict[str, str]) -> dict[str, Any]:
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if k not in ("func", "command")}
    passes = [dict(o.result, label=labels.get(o.spec.name, o.spec.name)) for o in outcomes if o.result is not None]
    notes: list[str] = []
    if passes:
        first = passes[0]
        if not first.get("torch"):
            notes.append("torch is not installed: measured the loading side only (no DataLoader, no device "
                         "transfer); pip install torch==2.13.0 for the full pipeline")
        elif first.get("device") == "cpu":
            notes.append(f"no GPU used ({first.get('device_note')}): batches stay on the CPU, "
                         "so there is no host-to-device transfer to measure")
    notes.append("MB/s = bytes received on the pass's sockets (HTTP headers+bodies, metadata and tokenizer "
                 "included) / pass time; 'served' = diff of the endpoint's hf_mirror_bytes_served_total "
                 "(bodies only; only for a mirror, and only exact when nothing else uses it meanwhile)")
    return {"config": config, "passes": passes, "notes": notes,
            "errors": [dict(o.error, name=o.spec.name) for o in outcomes if o.error is not None],
            "timelines": {o.spec.name: o.timeline for o in outcomes}}


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:{spec}}{suffix}"


COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("pass", lambda r: str(r["label"])),
    ("rows", lambda r: str(r["rows"])),
    ("first batch", lambda r: _fmt(r["ttfb_s"], ".2f", " s")),
    ("total", lambda r: _fmt(r["total_s"], ".2f", " s")),
    ("rows/s", lambda r: _fmt(r["rows_per_s"], ",.0f")),
    ("tokens/s", lambda r: _fmt(r["tokens_per_s"], ",.0f")),
    ("MB read", lambda r: _fmt(r["read_bytes"] / 1e6 if r["read_bytes"] is not None else None, ".3f")),
    ("MB/s", lambda r: _fmt(r["read_mb_per_s"], ".2f")),
    ("served MB", lambda r: _fmt(r["endpoint_bytes_served"] / 1e6 if r.get("endpoint_bytes_served") is not None
                                 else None, ".3f")),
    ("H2D GB/s", lambda r: _fmt(r["h2d_gb_per_s"], ".2f")),
    ("starved", lambda r: _fmt(r["starvation_ratio"] * 100 if r["starvation_ratio"] is not None else None,
                               ".0f", "%")),
]


def print_report(report: dict[str, Any], tty: bool) -> None:
    passes = report["passes"]
    if passes:
        env = passes[0]
        header = (f"device={env['device']} torch={env.get('torch') or 'absent'} batch={report['config']['batch_size']}"
                  f" workers={report['config']['num_workers']} max_length={report['config']['max_length']}")
        if tty:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=f"hf-mirror bench: {report['config']['dataset']} ({header})")
            for name, _ in COLUMNS:
                table.add_column(name, justify="left" if name == "pass" else "right")
            for r in passes:
                table.add_row(*(fn(r) for _, fn in COLUMNS))
            console = Console()
            console.print(table)
            for note in report["notes"]:
                console.print(f"note: {note}", style="dim", markup=False, highlight=False)
        else:
            print(f"hf-mirror bench: {report['config']['dataset']} ({header})")
            rows = [[name for name, _ in COLUMNS]] + [[fn(r) for _, fn in COLUMNS] for r in passes]
            widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
            for row in rows:
                print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                     strict=True))))
            for note in report["notes"]:
                print(f"note: {note}")
    for err in report["errors"]:
        print(f"pass {err['name']} failed ({err.get('kind')}): {err.get('message')}", file=sys.stderr)


def write_plot(outcomes: list[PassOutcome], path: Path, labels: dict[str, str]) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"--plot {path}: matplotlib is not installed, no plot written (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for o in outcomes:
        points = o.timeline
        xs, ys = [], []
        for prev, cur in zip(points, points[1:], strict=False):
            dt = cur["t"] - prev["t"]
            if dt > 0:
                xs.append(cur["t"])
                ys.append((cur["rows"] - prev["rows"]) / dt)
        if xs:
            ax.plot(xs, ys, label=labels.get(o.spec.name, o.spec.name))
    ax.set_xlabel("seconds since pass start")
    ax.set_ylabel("rows/s")
    ax.set_title("hf-mirror bench: throughput over time")
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return f"wrote {path}"


# --------------------------------------------------------------------------------------------------------------
# Worker side: one measured pass, in a fresh interpreter
# --------------------------------------------------------------------------------------------------------------

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


def _rchar() -> int | None:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Collate:
    """The ``collate_fn``: tokenize a list of rows; tensors when torch is there, numpy otherwise."""

    def __init__(self, tokenizer: Any, column: str, max_length: int, tensors: str) -> None:
        self.tokenizer, self.column, self.max_length, self.tensors = tokenizer, column, max_length, tensors

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        if rows and self.column not in rows[0]:
            raise KeyError(f"{_MISSING_COLUMN}: column {self.column!r} not in the dataset; columns: "
                           f"{sorted(rows[0])}")
        enc = self.tokenizer([r[self.column] for r in rows], padding="longest", truncation=True,
                             max_length=self.max_length, return_tensors=self.tensors)
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def _classify(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, HarnessError):
        return exc.kind, exc.message
    text = f"{type(exc).__name__}: {exc}"
    name = type(exc).__name__
    if _MISSING_COLUMN in text:
        line = next((ln for ln in text.splitlines() if _MISSING_COLUMN in ln), text)
        return "missing_column", line.split(_MISSING_COLUMN + ": ", 1)[-1].strip("'\"")
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


def _measure(cfg: dict[str, Any], counter: Any) -> dict[str, Any]:
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

    rchar0 = _rchar()
    bytes0 = counter.value
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(cfg["tokenizer"])
    tokenizer_s = time.perf_counter() - t0
    source = cfg["local_dir"] or cfg["dataset"]
    ds = datasets.load_dataset(source, cfg["config"], split=cfg["split"], streaming=True)
    features = getattr(ds, "features", None)
    if features is not None and cfg["text_column"] not in features:
        raise HarnessError("missing_column", f"column {cfg['text_column']!r} not in the dataset; "
                                             f"columns: {sorted(features)}")
    if cfg["shuffle_buffer"]:
        ds = ds.shuffle(seed=0, buffer_size=cfg["shuffle_buffer"])
    if cfg["max_rows"]:
        ds = ds.take(cfg["max_rows"])
    collate = Collate(tokenizer, cfg["text_column"], cfg["max_length"], "pt" if torch is not None else "np")

    if torch is not None:
        loader = DataLoader(ds, batch_size=cfg["batch_size"], collate_fn=collate, num_workers=cfg["num_workers"],
                            pin_memory=cuda)
        batches: Any = iter(loader)
    else:
        batches = (collate([dict(zip(b, vals, strict=True)) for vals in zip(*b.values(), strict=True)])
                   for b in ds.iter(batch_size=cfg["batch_size"]))

    rows = tokens = h2d_bytes = 0
    wait_s = h2d_s = 0.0
    ttfb_s: float | None = None
    t_first: float | None = None
    first_rows = 0
    stopped_early = False
    last_emit = 0.0
    loop_start = time.perf_counter()
    while True:
        tw = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            break
        wait_s += time.perf_counter() - tw
        n = int(batch["input_ids"].shape[0])
        if torch is not None:
            th = time.perf_counter()
            moved = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            if cuda:
                torch.cuda.synchronize()
                h2d_s += time.perf_counter() - th
                h2d_bytes += sum(v.numel() * v.element_size() for v in moved.values())
        tokens += int(batch["attention_mask"].sum())
        rows += n
        now = time.perf_counter()
        if ttfb_s is None:
            ttfb_s, t_first, first_rows = now - t0, now, n
        if cfg["step_ms"]:
            time.sleep(cfg["step_ms"] / 1000)
            now = time.perf_counter()
        if now - last_emit > 0.2:
            _emit({"event": "progress", "t": now - t0, "rows": rows, "bytes": counter.value - bytes0})
            last_emit = now
        if cfg["max_seconds"] and now - t0 > cfg["max_seconds"]:
            stopped_early = True
            break
    end = time.perf_counter()
    del batches  # shuts down DataLoader workers, if any
    _emit({"event": "progress", "t": end - t0, "rows": rows, "bytes": counter.value - bytes0})
    total_s = end - t0
    loop_s = end - loop_start
    socket_bytes = counter.value - bytes0
    rchar1 = _rchar()
    if cfg["local_dir"]:
        # local files are read with read(), not sockets: /proc/self/io rchar (main process only)
        read_bytes = (rchar1 - rchar0) if rchar0 is not None and rchar1 is not None and not cfg["num_workers"] \
            else None
        read_method = "proc_rchar" if read_bytes is not None else "unavailable"
    else:
        read_bytes, read_method = socket_bytes, "socket_recv"
    steady_s = end - t_first if t_first is not None else 0.0
    return {
        "event": "result", "rows": rows, "tokens": tokens, "batches": math.ceil(rows / cfg["batch_size"]),
        "stopped_early": stopped_early, "import_s": import_s, "tokenizer_load_s": tokenizer_s,
        "ttfb_s": ttfb_s, "total_s": total_s,
        "rows_per_s": rows / total_s if total_s > 0 else None,
        "steady_rows_per_s": (rows - first_rows) / steady_s if steady_s > 0 and rows > first_rows else None,
        "tokens_per_s": tokens / total_s if total_s > 0 else None,
        "read_bytes": read_bytes, "read_method": read_method, "socket_bytes": socket_bytes,
        "read_mb_per_s": read_bytes / 1e6 / total_s if read_bytes is not None and total_s > 0 else None,
        "h2d_bytes": h2d_bytes if cuda else None, "h2d_s": h2d_s if cuda else None,
        "h2d_gb_per_s": h2d_bytes / 1e9 / h2d_s if cuda and h2d_s > 0 else None,
        "wait_s": wait_s, "loop_s": loop_s, "starvation_ratio": wait_s / loop_s if loop_s > 0 else None,
        "device": device, "device_note": device_note, "torch": getattr(torch, "__version__", None),
        "datasets": datasets.__version__, "pinned_memory": cuda,
    }


def _worker_entry(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--worker":
        print("internal entry point of hf-mirror bench; use `hf-mirror bench`", file=sys.stderr)
        return 2
    rc = worker_main(json.loads(argv[1]))
    # the figures are out: skip the interpreter's teardown of torch/datasets/transformers (seconds on a small box)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(_worker_entry(sys.argv[1:]))
