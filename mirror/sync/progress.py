"""What a sync prints while it runs: plain log lines (cron, journald) or progress bars (a terminal)."""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

from mirror.config import format_size


class Reporter(Protocol):
    def start(self, total_bytes: int) -> None: ...
    def file_started(self, key: str, label: str, size: int) -> None: ...
    def file_progress(self, key: str, done: int) -> None: ...
    def file_finished(self, key: str, label: str, ok: bool, message: str) -> None: ...
    def info(self, message: str) -> None: ...
    def stop(self) -> None: ...


class PlainReporter:
    """Log lines, for cron and journald."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self._started: dict[str, float] = {}

    def _print(self, message: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}", file=self.stream, flush=True)

    def start(self, total_bytes: int) -> None:
        pass

    def file_started(self, key: str, label: str, size: int) -> None:
        self._started[key] = time.monotonic()
        self._print(f"fetching {label} ({format_size(size)})")

    def file_progress(self, key: str, done: int) -> None:
        pass

    def file_finished(self, key: str, label: str, ok: bool, message: str) -> None:
        elapsed = time.monotonic() - self._started.pop(key, time.monotonic())
        word = ("cached" if message == "already cached" else "fetched") if ok else "FAILED"
        self._print(f"{word} {label}: {message} ({elapsed:.1f}s)")

    def info(self, message: str) -> None:
        self._print(message)

    def stop(self) -> None:
        pass


class RichReporter:
    """Progress bars on a terminal: one overall bar, one bar per file in flight."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = Console()
        self.progress = Progress(
            TextColumn("{task.description}", justify="left"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=self.console, transient=False,
        )
        self._overall: Any = None
        self._tasks: dict[str, Any] = {}
        self._done: dict[str, int] = {}
        self._base: dict[str, int] = {}

    def start(self, total_bytes: int) -> None:
        self.progress.start()
        self._overall = self.progress.add_task("[bold]total", total=total_bytes)

    def file_started(self, key: str, label: str, size: int) -> None:
        short = label if len(label) <= 60 else "…" + label[-59:]
        self._tasks[key] = self.progress.add_task(short, total=size)
        self._done[key] = 0

    def file_progress(self, key: str, done: int) -> None:
        task = self._tasks.get(key)
        if task is None:
            return
        delta = done - self._done.get(key, 0)
        self._done[key] = done
        self.progress.update(task, completed=done)
        if self._overall is not None and delta:
            self.progress.advance(self._overall, delta)

    def file_finished(self, key: str, label: str, ok: bool, message: str) -> None:
        task = self._tasks.pop(key, None)
        self._done.pop(key, None)
        if task is not None:
            self.progress.remove_task(task)
        if not ok:
            self.progress.console.print(f"[red]FAILED[/red] {label}: {message}")

    def info(self, message: str) -> None:
        self.progress.console.print(message, markup=False)

    def stop(self) -> None:
        self.progress.stop()
