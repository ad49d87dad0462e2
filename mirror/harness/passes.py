"""One measured pass: its plan, the environment of its fresh interpreter, starting it, and collecting its events."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mirror.harness.endpoint import sample_hub_stats, scrape_mirror
from mirror.harness.protocol import EVENT_PREFIX
from mirror.harness.services import Service, mirror


@dataclass
class PassSpec:
    name: str
    endpoint: str
    hf_home: Path
    local_dir: Path | None = None
    offline: bool = False
    workers: int = 0
    tokenizer: str | None = None  # a local tokenizer folder instead of the repo (local passes of a sample bench)
    nonstreaming: bool = False
    label: str | None = None
    group: str | None = None  # repeats of one pass share a group: the report shows their medians
    # a sample bench's mirror: started before this pass when not running, stopped after it when asked
    service: Service | None = None
    stop_service_after: bool = False


@dataclass
class PassOutcome:
    spec: PassSpec
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    timeline: list[dict[str, Any]] = field(default_factory=list)



def pass_env(spec: PassSpec) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    if os.environ.get("HF_TOKEN"):
        env["HF_TOKEN"] = os.environ["HF_TOKEN"]
    env.update(HF_ENDPOINT=spec.endpoint.rstrip("/"), HF_HOME=str(spec.hf_home), HF_HUB_DISABLE_TELEMETRY="1",
               HF_UPDATE_DOWNLOAD_COUNTS="0", HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               HF_DATASETS_DISABLE_PROGRESS_BARS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]),
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
    ready: bool = False
    early_error: dict[str, Any] | None = None


def await_ready(pending: PendingPass, timeout: float) -> None:
    """Wait until the pass's interpreter has imported its libraries (or failed), so that no measurement overlaps
    another interpreter's imports."""
    proc = pending.proc
    assert proc.stdout is not None
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            if not line.startswith(EVENT_PREFIX):
                continue
            event = json.loads(line[len(EVENT_PREFIX):])
            if event["event"] == "ready":
                pending.ready = True
                return
            if event["event"] == "error":
                pending.early_error = event
                return
    finally:
        timer.cancel()


def start_pass(spec: PassSpec, args: argparse.Namespace) -> PendingPass:
    cfg = {"dataset": args.dataset, "config": args.config, "split": args.split, "text_column": args.text_column,
           "tokenizer": spec.tokenizer or args.tokenizer, "batch_size": args.batch_size,
           "max_length": args.max_length, "workers": spec.workers, "shuffle_buffer": args.shuffle_buffer,
           "max_rows": args.max_rows, "max_seconds": args.max_seconds, "device": args.device,
           "step_ms": args.step_ms, "nonstreaming": spec.nonstreaming,
           "parquet_batch_rows": getattr(args, "parquet_batch_rows", None) or 0,
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


def _counters(spec: PassSpec, hub: str | None) -> dict[str, Any]:
    return {"mirror": None if spec.local_dir else scrape_mirror(spec.endpoint),
            "hub": sample_hub_stats(hub) if hub else None,
            # the mirror's own CPU seconds, when the bench runs it (a sample bench): what serving the pass cost it
            "mirror_cpu": spec.service.cpu_s() if spec.service is not None else None}


def _upstream(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the pass asked of upstream: the sample Hub's own counters when there is one (the truth, for a mirror
    pass and a direct pass alike), else the mirror's /metrics; plus the mirror's figures as a cross-check."""
    out: dict[str, Any] = {"upstream_source": None, "upstream_requests": None, "upstream_bytes": None,
                           "upstream_data_requests": None, "upstream_data_bytes": None,
                           "upstream_metadata_requests": None, "mirror_upstream_requests": None,
                           "mirror_upstream_bytes": None, "endpoint_bytes_served": None,
                           "endpoint_cpu_s": None, "upstream_cpu_s": None}
    c0, c1 = before.get("mirror_cpu"), after.get("mirror_cpu")
    if c0 is not None and c1 is not None:
        out["endpoint_cpu_s"] = c1 - c0
    m0, m1 = before["mirror"], after["mirror"]
    if m0 is not None and m1 is not None:
        out.update(endpoint_bytes_served=m1["served"] - m0["served"],
                   mirror_upstream_requests=int(m1["upstream_requests"] - m0["upstream_requests"]),
                   mirror_upstream_bytes=int(m1["upstream_bytes"] - m0["upstream_bytes"]),
                   upstream_source="mirror /metrics", upstream_requests=int(m1["upstream_requests"] -
                                                                            m0["upstream_requests"]),
                   upstream_bytes=int(m1["upstream_bytes"] - m0["upstream_bytes"]))
    h0, h1 = before["hub"], after["hub"]
    if h0 is not None and h1 is not None:
        d = {k: h1[k] - h0[k] for k in h1}
        out.update(upstream_source="sample hub counters", upstream_requests=d["requests"],
                   upstream_bytes=d["bytes"], upstream_data_requests=d["data_requests"],
                   upstream_data_bytes=d["data_bytes"], upstream_metadata_requests=d["metadata_requests"],
                   upstream_cpu_s=d.get("cpu_s"))
    return out


def finish_pass(pending: PendingPass, args: argparse.Namespace,
                on_progress: Callable[[dict[str, Any]], None], hub: str | None = None) -> PassOutcome:
    """Wait for the pass to be ready, let it measure, collect its events and wait for its exit. ``hub``: the sample
    Hub's URL when the bench runs one (its counters say what the pass asked of upstream)."""
    spec, proc = pending.spec, pending.proc
    outcome = PassOutcome(spec)
    before: dict[str, Any] = {"mirror": None, "hub": None, "mirror_cpu": None}
    assert proc.stdin is not None and proc.stdout is not None
    outcome.error = pending.early_error

    def go() -> None:
        nonlocal before
        before = _counters(spec, hub)
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    timer = threading.Timer(args.timeout, proc.kill)
    timer.start()
    try:
        if pending.ready:
            go()
        for line in proc.stdout:
            if not line.startswith(EVENT_PREFIX):
                continue
            event = json.loads(line[len(EVENT_PREFIX):])
            if event["event"] == "ready":
                go()
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
        outcome.result["group"] = spec.group or spec.name
        outcome.result.update(_upstream(before, _counters(spec, hub)))
        outcome.result["endpoint"] = None if spec.local_dir else spec.endpoint
        outcome.result["local_dir"] = str(spec.local_dir) if spec.local_dir else None
    return outcome


def plan_passes(args: argparse.Namespace, root: Path) -> list[PassSpec]:
    """Passes against a given endpoint (``--endpoint``): cold and warm through it, optionally the same direct and a
    local folder, at each ``--workers`` count."""
    passes: list[PassSpec] = []
    for w in args.workers:
        suffix = f"-w{w}" if len(args.workers) > 1 else ""
        mirror_home = root / f"hf-home-endpoint{suffix}"
        passes += [PassSpec(f"endpoint-cold{suffix}", args.endpoint, mirror_home, workers=w),
                   PassSpec(f"endpoint-warm{suffix}", args.endpoint, mirror_home, workers=w)]
        if args.compare_direct:
            direct_home = root / f"hf-home-direct{suffix}"
            passes += [PassSpec(f"direct-cold{suffix}", args.compare_direct, direct_home, workers=w),
                       PassSpec(f"direct-warm{suffix}", args.compare_direct, direct_home, workers=w)]
        if args.compare_local:
            # the tokenizer comes from the endpoint passes' client cache, offline: only the data is read from disk
            passes.append(PassSpec(f"local{suffix}", args.endpoint, mirror_home, local_dir=args.compare_local,
                                   offline=True, workers=w))
    return passes


SAMPLE_KINDS = ("local", "direct", "cold", "warm", "nonstreaming")


def plan_sample_passes(args: argparse.Namespace, root: Path, hub: str, dataset_dir: Path,
                       tokenizer_dir: Path) -> list[PassSpec]:
    """A self-contained bench's passes, at each ``--workers`` count and ``--repeat`` times: local disk, direct to
    the sample Hub, a fresh mirror cold, the same mirror warm; then one non-streaming load through a warm mirror.
    Every cold pass gets a new mirror with an empty cache, so each is really cold."""
    kinds = set(args.passes)
    passes: list[PassSpec] = []
    last_mirror: Service | None = None
    for r in range(args.repeat):
        rep = f"-r{r + 1}" if args.repeat > 1 else ""
        for w in args.workers:
            tag = f"w{w}{rep}"

            def spec(kind: str, label: str, endpoint: str, home: Path, **kw: Any) -> PassSpec:
                return PassSpec(f"{kind}-{tag}", endpoint, home, workers=w, label=f"{label} w={w}",  # noqa: B023
                                group=f"{kind}-w{w}", **kw)  # noqa: B023

            if "local" in kinds:
                passes.append(spec("local", "local disk", hub, root / f"hf-home-local-{tag}", offline=True,
                                   local_dir=dataset_dir, tokenizer=str(tokenizer_dir)))
            if "direct" in kinds:
                passes.append(spec("direct", "direct (no mirror)", hub, root / f"hf-home-direct-{tag}"))
            if kinds & {"cold", "warm"}:
                service = mirror(root, f"mirror-{tag}", hub)
                home = root / f"hf-home-mirror-{tag}"
                for kind, label in (("mirror-cold", "mirror cold"), ("mirror-warm", "mirror warm")):
                    if kind[7:] in kinds:  # a warm pass alone still runs on a mirror its own passes filled
                        passes.append(spec(kind, label, service.url, home, service=service))
                if "cold" not in kinds:
                    passes.insert(len(passes) - 1, spec("mirror-fill", "mirror fill", service.url, home,
                                                        service=service))
                passes[-1].stop_service_after = True
                last_mirror = service
    if "nonstreaming" in kinds:
        service = last_mirror or mirror(root, "mirror-nonstreaming", hub)
        w = args.workers[-1]
        if last_mirror is None:  # nothing warmed it: a fill pass first
            passes.append(PassSpec("mirror-fill", service.url, root / "hf-home-fill", workers=w, service=service))
        else:
            passes[-1].stop_service_after = False
        passes.append(PassSpec(f"nonstreaming-w{w}", service.url, root / "hf-home-nonstreaming", workers=w,
                               nonstreaming=True, label=f"mirror warm, not streamed w={w}", service=service,
                               stop_service_after=True))
    return passes
