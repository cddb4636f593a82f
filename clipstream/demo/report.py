"""The demo's report: cumulative error per model and for Exp3/Exp4 (the paper's Figure 8)."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from frontend.dashboard import read_targets
from frontend.dashboard.series import parse
from selector.policies import get_policy
from selector.types import Feedback, Output, Query


def cumulative_error(correct: list[bool | None]) -> np.ndarray:
    """Running error rate; a missing answer counts as an error (the caller got nothing right)."""
    wrong = np.array([0.0 if c else 1.0 for c in correct])
    return np.cumsum(wrong) / np.arange(1, len(wrong) + 1)


def selector_total(targets_file: str | None, sample: str) -> float | None:
    """A counter summed over every selector member and label, read from their /metrics (the
    targets `clipstream up` wrote); None when a member cannot be read."""
    total = 0.0
    selectors = [t for t in read_targets(targets_file) if t.stage == "selector"]
    for target in selectors:
        try:
            with urllib.request.urlopen(target.url, timeout=10) as answer:
                text = answer.read().decode()
        except OSError:
            return None
        total += sum(value for name, _, value in parse(text) if name == sample)
    return total if selectors else None


def replay_exp3(models: list[str], rows: list[dict[str, Any]], seed: int = 0) -> list[bool]:
    """Exp3 run on the per-model answers the pipeline produced, with the same feedback."""
    policy = get_policy("exp3", {})
    state = policy.init(models)
    correct = []
    for i, row in enumerate(rows):
        query = Query(query_id=f"replay-{seed}-{i}", app="digits")
        chosen = policy.select(state, query)[0]
        answer = row["models"].get(chosen)
        correct.append(answer is not None and answer == row["label"])
        preds = {m: Output(v) for m, v in row["models"].items() if m == chosen}
        if preds:
            state = policy.observe(state, query, Feedback(query.query_id, label=row["label"]), preds)
    return correct


def plot(out: Path, models: list[str], rows: list[dict[str, Any]], exp3: list[bool],
         degraded: str, marks: tuple[int, int]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(9, 5))
    x = np.arange(1, len(rows) + 1)
    for m in models:
        err = cumulative_error([r["models"].get(m) == r["label"] if m in r["models"] else None for r in rows])
        ax.plot(x, err, lw=1, label=m + (" (degraded)" if m == degraded else ""))
    ax.plot(x, cumulative_error([r["ensemble_ok"] for r in rows]), lw=2.5, color="k", label="Exp4 (live)")
    ax.plot(x, cumulative_error(exp3), lw=2.5, ls="--", color="tab:red", label="Exp3 (replayed)")
    for mark in marks:
        ax.axvline(mark, color="grey", ls=":")
    ax.set_xlabel("queries")
    ax.set_ylabel("cumulative error rate")
    ax.set_ylim(0, 0.6)
    ax.set_title(f"clipstream demo: {degraded} degraded between the dotted lines")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "cumulative_error.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    lat = [r["latency_ms"] for r in rows]
    ax.hist(lat, bins=60, color="tab:blue")
    for q, ls in ((50, "-"), (99, "--")):
        v = float(np.percentile(lat, q))
        ax.axvline(v, color="k", ls=ls, label=f"p{q} {v:.1f} ms")
    ax.set_xlabel("gateway round trip (ms)")
    ax.set_ylabel("queries")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
