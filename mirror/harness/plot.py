"""Throughput over time of every pass, as a PNG (needs matplotlib): rows/s and MB/s read, from each pass's
progress timeline."""

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
    fig, (rows_ax, mb_ax) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    for o in outcomes:
        xs, rows, mbs = [], [], []
        for prev, cur in zip(o.timeline, o.timeline[1:], strict=False):
            dt = cur["t"] - prev["t"]
            if dt > 0:
                xs.append(cur["t"])
                rows.append((cur["rows"] - prev["rows"]) / dt)
                mbs.append((cur.get("bytes", 0) - prev.get("bytes", 0)) / 1e6 / dt)
        if xs:
            label = labels.get(o.spec.name, o.spec.name)
            rows_ax.plot(xs, rows, label=label, linewidth=1)
            mb_ax.plot(xs, mbs, label=label, linewidth=1)
    rows_ax.set_ylabel("rows/s")
    rows_ax.set_title("hf-mirror bench: throughput over time, per pass")
    mb_ax.set_ylabel("MB/s received (sockets; local passes: n/a)")
    mb_ax.set_xlabel("seconds since pass start")
    rows_ax.legend(fontsize="small", ncol=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return f"wrote {path}"
