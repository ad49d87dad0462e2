"""The status page's traffic charts: inline SVG drawn here, on a labelled time axis, one chart per quantity (hit
ratio, bytes served, bytes fetched, errors, upstream latency) so that no two lines ever lie on each other; where a
chart shows two counts (errors) they are bars side by side. A legend names every series."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable
from typing import Any

from mirror.config import format_size

_W, _H = 480, 150  # the drawing's size in SVG units (the page scales it to its column)
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 10, 10, 22  # room for the value labels (left) and the time labels (bottom)
# Time-axis steps in seconds: the smallest one that keeps the labels apart is used.
_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
_MAX_TICKS = 6

Series = tuple[str, str, list[float | None]]  # (legend name, colour, one value per point; None: nothing measured)


def _nice(top: float) -> float:
    """The axis' top: the next 1, 2 or 5 times a power of ten (counts and seconds), at least ``top``."""
    if top <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(top))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= top)


def _nice_bytes(top: float) -> float:
    """The byte axis' top: 1, 2 or 5 times a power of 1024 (or a round number of that unit), at least ``top``."""
    if top <= 1:
        return 1.0
    unit = 1024 ** min(4, math.floor(math.log(top, 1024)))
    return next(m * unit for m in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1024) if m * unit >= top)


def _count(value: float) -> str:
    return f"{value:g}" if value < 10_000 else f"{value / 1000:.0f}k"


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _time_ticks(start: float, end: float) -> tuple[list[float], str]:
    span = max(end - start, 1.0)
    step = next((s for s in _STEPS if span / s <= _MAX_TICKS), 86400)
    first = math.ceil(start / step) * step
    ticks = [first + i * step for i in range(int((end - first) // step) + 1)]
    return ticks, "%H:%M:%S" if step < 60 else "%H:%M"


def time_chart(chart_id: str, title: str, times: list[float], interval: float, series: list[Series], *,
               fmt: Callable[[float], str], top: float | None = None, bars: bool = False) -> str:
    """One chart: ``times`` are the ends of the intervals the values measure (unix seconds), oldest first."""
    esc = html.escape
    values = [v for _, _, vs in series for v in vs if v is not None]
    top = top if top is not None else _nice(max([*values, 0.0]))
    end = times[-1] if times else time.time()
    start = (times[0] if times else end) - interval
    width, height = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + (t - start) / max(end - start, 1e-9) * width

    def y(v: float) -> float:
        return _TOP + height - min(v / top, 1.0) * height

    grid = []
    for fraction in (0.0, 0.5, 1.0):  # the value axis: zero, half and the top, labelled
        level = y(top * fraction)
        grid.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{level:.1f}" y2="{level:.1f}" stroke="#e3e3e3"/>'
                    f'<text x="{_LEFT - 4}" y="{level + 3:.1f}" text-anchor="end">{esc(fmt(top * fraction))}</text>')
    ticks, pattern = _time_ticks(start, end)
    for t in ticks:
        at = x(t)
        grid.append(f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{_TOP}" y2="{_TOP + height + 3}" stroke="#eee"/>'
                    f'<text x="{at:.1f}" y="{_H - 6}" text-anchor="middle">'
                    f'{esc(time.strftime(pattern, time.localtime(t)))}</text>')
    drawn = []
    slot = width / max(1, (end - start) / interval) if interval else 4.0
    for n, (name, colour, vs) in enumerate(series):
        parts = []
        if bars:  # side by side within the interval: two counts never hide each other
            bar = max(1.0, slot * 0.8 / len(series))
            for t, v in zip(times, vs, strict=False):
                if v:
                    left = x(t) - slot * 0.9 + n * bar
                    parts.append(f'<rect x="{left:.1f}" y="{y(v):.1f}" width="{bar:.1f}" '
                                 f'height="{_TOP + height - y(v):.1f}" fill="{colour}"/>')
        else:
            runs: list[list[str]] = [[]]
            for t, v in zip(times, vs, strict=False):
                if v is None:
                    if runs[-1]:
                        runs.append([])
                    continue
                runs[-1].append(f"{x(t):.1f},{y(v):.1f}")
            for points in runs:
                if len(points) == 1:  # a lone measurement between gaps: a dot
                    cx, cy = points[0].split(",")
                    parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{colour}"/>')
                elif points:
                    parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.8" '
                                 f'points="{" ".join(points)}"/>')
        drawn.append(f'<g class="series" data-label="{esc(name)}">{"".join(parts)}</g>')
    legend = "".join(f'<span class="key"><i style="background:{colour}"></i>{esc(name)}</span>'
                     for name, colour, _ in series)
    return (f'<figure class="chart"><figcaption><b>{esc(title)}</b> {legend}</figcaption>'
            f'<svg id="{esc(chart_id)}" viewBox="0 0 {_W} {_H}" role="img" aria-label="{esc(title)}">'
            f'<rect x="{_LEFT}" y="{_TOP}" width="{width}" height="{height}" fill="#fcfcfc" stroke="#ccc"/>'
            f'<g class="axis" font-size="10" fill="#666">{"".join(grid)}</g>{"".join(drawn)}</svg></figure>')


def traffic_charts(history: dict[str, Any]) -> str:
    """The five charts of the status page, from ``StatusHistory.series`` (per-interval values)."""
    points = history.get("points", [])
    interval = float(history.get("interval", 60))
    times = [float(p["t"]) for p in points]
    every = f"per {interval:g} s"

    def column(name: str) -> list[float | None]:
        return [None if p.get(name) is None else float(p[name]) for p in points]

    served, fetched = column("bytes_served"), column("bytes_fetched")
    return "".join((
        time_chart("chart-hit-ratio", "Hit ratio", times, interval, [("hits / (hits + misses)", "#2a7", column(
            "hit_ratio"))], fmt=lambda v: f"{v:.0%}", top=1.0),
        time_chart("chart-bytes-served", f"Bytes served {every}", times, interval,
                   [("served to clients", "#36c", served)], fmt=format_size,
                   top=_nice_bytes(max([v or 0.0 for v in served] + [1.0]))),
        time_chart("chart-bytes-fetched", f"Bytes fetched {every}", times, interval,
                   [("fetched from upstream", "#c63", fetched)], fmt=format_size,
                   top=_nice_bytes(max([v or 0.0 for v in fetched] + [1.0]))),
        time_chart("chart-errors", f"Errors {every}", times, interval,
                   [("error answers", "#c33", column("errors")), ("upstream 5xx / failed", "#85c",
                                                                  column("upstream_errors"))],
                   fmt=_count, bars=True),
        time_chart("chart-latency", "Upstream latency (mean time to headers)", times, interval,
                   [("upstream latency", "#a70", column("upstream_latency"))], fmt=_seconds),
    ))
