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

from mirror.harness.endpoint import scrape_bytes_served
from mirror.harness.protocol import EVENT_PREFIX


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
