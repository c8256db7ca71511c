"""A PNG bar chart of a benchmark report: median images/s per loader, min–max whiskers,
the baseline's median drawn as a dashed line, each bar labelled with its ratio to it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardkit.bench.report import too_few_timed


def plot_report(report: Mapping[str, Any], path: str) -> None:
    """Draw ``report`` (see :mod:`shardkit.bench.report`) into the PNG file ``path``.

    Uses matplotlib's Agg backend (no display needed); the global pyplot state is not touched.

    Raises:
        ImportError: matplotlib is not installed (``pip install shardkit[bench]``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    results = report["results"]
    labels = [r["label"] for r in results]
    medians = [r["images_per_second"]["median"] for r in results]
    lows = [m - r["images_per_second"]["min"] for m, r in zip(medians, results, strict=True)]
    highs = [r["images_per_second"]["max"] - m for m, r in zip(medians, results, strict=True)]
    colors = ["#9e9e9e" if r["baseline"] else "#1f77b4" for r in results]

    fig = Figure(figsize=(8, 1.2 + 0.8 * len(results)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    y = list(range(len(results)))[::-1]
    ax.barh(y, medians, xerr=[lows, highs], color=colors, capsize=4)
    ax.set_yticks(y, labels)
    ax.set_xlabel("images/s (median; whiskers: min–max over repetitions)")
    base = next((r for r in results if r["baseline"]), None)
    if base is not None:
        x = base["images_per_second"]["median"]
        ax.axvline(x, color="black", linestyle="--", linewidth=1)
        ax.text(x, len(results) - 0.45, " baseline", va="bottom", ha="left", fontsize="small")
    few = too_few_timed(report) is not None  # no ratio, as in the table
    for yi, r, m in zip(y, results, medians, strict=True):
        ratio = None if few else r["ratio_to_baseline"]
        text = f"{m:,.0f}" + ("" if ratio is None or r["baseline"]
                              else f"  ({ratio['median']:.2f}×)")
        ax.text(r["images_per_second"]["max"], yi, "  " + text, va="center", ha="left",
                fontsize="small")
    ax.set_ylim(-0.6, len(results) - 0.1)
    ax.set_xlim(0, max(r["images_per_second"]["max"] for r in results) * 1.35)
    cfg = report.get("config", {})
    cores = report.get("conditions", {}).get("machine", {}).get("usable_cores", "?")
    ax.set_title(f"{cfg.get('transform', '')} {cfg.get('size', '')} px, batch "
                 f"{cfg.get('batch_size', '?')}, {cfg.get('workers', '?')} workers, {cores} cores, "
                 f"{cfg.get('device', 'cpu')}", fontsize="medium")
    fig.savefig(path, dpi=120)
