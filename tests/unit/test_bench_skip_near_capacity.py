"""bench.skip_near_capacity's rows and medians from the demo's reports: no pipeline."""

from __future__ import annotations

from typing import Any

from bench.skip_near_capacity import row_of, summarize


def _report(exp4: float, defaults: int, not_asked: float | None, p50: float) -> dict[str, Any]:
    return {"models": ["a", "b"], "defaults": defaults, "default_reasons": {"timeout": defaults},
            "models_not_asked": not_asked, "latency_ms": {"p50": p50, "p99": 150.0, "max": 160.0},
            "cumulative_error": {"a": 0.04, "b": 0.03, "exp4_live": exp4, "exp3_replayed": 0.5}}


def test_a_row_takes_exp4s_error_and_the_best_single_model_not_exp3s_replay() -> None:
    row = row_of(_report(0.0612, 40, 17.0, 70.04), "skip 0.1", 0.1, 2)
    assert row["exp4_error"] == 0.0612 and row["best_single_error"] == 0.03
    assert (row["defaults"], row["models_not_asked"], row["p50_ms"], row["round"]) == (40, 17.0, 70.0, 2)


def test_medians_and_not_asked_are_per_setting() -> None:
    rows = [row_of(_report(e, d, n, p), name, q, r)
            for r, (name, q, e, d, n, p) in enumerate([
                ("skip 0.1", 0.1, 0.05, 10, 3.0, 60.0), ("ask", 0.0, 0.07, 30, 0.0, 80.0),
                ("skip 0.1", 0.1, 0.09, 50, None, 90.0), ("ask", 0.0, 0.06, 20, 0.0, 70.0),
                ("skip 0.1", 0.1, 0.06, 40, 5.0, 75.0)])]
    s = summarize(rows, {"skip 0.1": 0.1, "ask": 0.0})
    assert s["median_exp4_error"] == {"skip 0.1": 0.06, "ask": 0.065}
    assert s["median_defaults"] == {"skip 0.1": 40, "ask": 25.0}
    assert s["models_not_asked"] == {"skip 0.1": 8.0, "ask": 0.0}  # a run it could not read adds nothing
    assert s["median_p50_ms"] == {"skip 0.1": 75.0, "ask": 75.0}
