"""Throughput over time of every pass, as a PNG (needs matplotlib)."""

from __future__ import annotations

from pathlib import Path

from mirror.harness.passes import PassOutcome


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
