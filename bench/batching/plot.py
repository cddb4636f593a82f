"""The benchmark's figure (batching.png): throughput, adaptation, delayed batching, CPU cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import figure, save_figure


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    """Draw the report's sections into ``out_dir/batching.png``."""
    fig, axes = figure(2, 2, (15, 10))
    _throughput(axes[0][0], report)
    _adapt(axes[0][1], report)
    _delayed(axes[1][0], report)
    _cost(axes[1][1], report)
    for row in axes:
        for ax in row:
            if not ax.has_data():
                ax.text(0.5, 0.5, "section not run", ha="center", va="center", transform=ax.transAxes)
    return save_figure(fig, "batching", out_dir)


def _throughput(ax: Any, report: dict[str, Any]) -> None:
    """No batching, fixed sizes and AIMD, per model kind: goodput and ok throughput."""
    for e in report.get("throughput", {}).values():
        labels = list(e["runs"])
        c = e.get("confirmed", {}).get("goodput", {}).get("aimd_vs_best_fixed")
        rounds = f" (interleaved rounds: AIMD x{c:.2f} of {e['confirmed']['best_fixed']})" if c else ""
        line, = ax.plot(range(len(labels)), [max(0.5, e["runs"][k]["goodput_qps"]) for k in labels], "o-",
                        label=f"{e['label']}: goodput{rounds}")
        ax.plot(range(len(labels)), [max(0.5, e["runs"][k]["ok_qps"]) for k in labels], "s--", color=line.get_color(),
                label="  ok throughput (any latency)", alpha=0.6)
        for i, k in enumerate(labels):
            if k == "AIMD":
                ax.plot(i, max(0.5, e["runs"][k]["ok_qps"]), "k*", ms=12)
        if "device_max" in e:
            ax.axhline(e["device_max"]["qps"], ls=":", lw=1, color=line.get_color())
    allk = max((list(e["runs"]) for e in report.get("throughput", {}).values()), key=len, default=[])
    ax.set_xticks(range(len(allk)), allk, rotation=45, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("qps (goodput: ok within the deadline; 0 drawn at 0.5)")
    ax.set_title("real broker + Redis: no batching / fixed / AIMD (*); dotted = device max")
    if allk:
        ax.legend(fontsize=7)


def _adapt(ax: Any, report: dict[str, Any]) -> None:
    """AIMD's batch size and goodput over time, around the model's slowdown."""
    ad = report.get("adapt")
    if ad:
        tr = ad["trace"]
        ax.plot([t for t, _, _ in tr["batches"]], [s for _, s, _ in tr["batches"]], ".", ms=2, label="batch size (worker)")
        ax.step([t for t, _ in tr["max_batch"]], [v for _, v in tr["max_batch"]], where="post", label="AIMD max (stats: lines)")
        ax.axvline(tr["slowdown_s"], color="grey", ls="--")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("batch size")
        ax2 = ax.twinx()
        for key, color, name in (("goodput_bins", "r", "goodput"), ("ok_bins", "m", "ok throughput")):
            g = tr[key]
            ax2.plot([(i + 0.5) * tr["bin_s"] for i in range(len(g))], g, "-", color=color, lw=1, label=name)
        best = ad["goodput"]["new_best_fixed_qps"]
        if best:
            ax2.axhline(best, color="r", ls=":", lw=1)
        ax2.set_ylabel("qps: goodput (red), ok throughput (magenta)")
        ax.legend(fontsize=7, loc="upper right")
        ax.set_title(f"AIMD ({ad['goodput']['aimd_objective_ms']:g} ms objective), Clockwork profile 2x slower "
                     "at the dashed line (dotted: best fixed goodput after)", fontsize=8)


def _delayed(ax: Any, report: dict[str, Any]) -> None:
    """Delayed batching against none under bursty load."""
    de = report.get("delayed")
    if de:
        labels = list(de["runs"])
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], [de["runs"][k]["goodput_qps"] for k in labels], 0.4, label="goodput (qps)")
        ax.bar([i + 0.2 for i in x], [de["runs"][k]["batches_per_s"] for k in labels], 0.4, label="batches/s")
        ax.set_xticks(list(x), labels, rotation=30, fontsize=7)
        ax.legend(fontsize=7)
        ax.set_title("delayed batching, 5 ms + 0.05 ms/item, bursty load "
                     f"(AIMD; median of {de.get('rounds', 1)} rounds)")


def _cost(ax: Any, report: dict[str, Any]) -> None:
    """CPU per query by process, for the batching layer at saturation."""
    co = report.get("cost")
    if co:
        e = next(iter(co.values()))
        per = e["cpu_us_per_ok_query"]
        ax.bar(list(per), list(per.values()))
        ax.set_ylabel("CPU us per ok query")
        ax.set_title(f"ONNX digits, AIMD at saturation: CPU per query by process (layer {e['layer_us_per_ok_query']} us)")
        ax.tick_params(axis="x", labelsize=7)
