"""The straggler benchmark's summary over repetitions (pure: no pipeline)."""

from __future__ import annotations

from typing import Any

from bench.stragglers import SLO_MS, run_key, summarise


def _run(p99: float, accuracy: float, defaults: int = 0, missing: float = 0.05) -> dict[str, Any]:
    return {"p99_ms": p99, "missing_fraction": missing, "default": defaults, "accuracy": accuracy,
            "accuracy_defaults_wrong": accuracy - defaults / 100, "latency_from_send_ms": {"p99": p99 - 2.0}}


def test_one_repetition_keeps_its_own_figures_and_checks() -> None:
    out = summarise([(_run(SLO_MS + 6, 0.95, defaults=1), _run(170.0, 0.96))])
    assert out["p99_cutoff_ms"] == SLO_MS + 6 and out["p99_wait_all_ms"] == 170.0
    assert out["p99_cutoff_from_send_ms"] == SLO_MS + 4
    assert out["accuracy_loss_points"] == 1.0 and out["accuracy_loss_points_defaults_wrong"] == 2.0
    assert out["cutoff_p99_within_slo_plus_5ms"] is False and out["wait_all_p99_over_slo_plus_5ms"] is True
    assert "repetitions" not in out


def test_several_repetitions_report_each_and_check_the_median() -> None:
    pairs = [(_run(49.0, 0.96), _run(180.0, 0.96)), (_run(65.0, 0.95), _run(190.0, 0.96)),
             (_run(54.0, 0.96), _run(175.0, 0.961))]
    out = summarise(pairs)
    assert out["p99_cutoff_ms"] == 54.0 and out["p99_wait_all_ms"] == 180.0
    assert out["cutoff_p99_within_slo_plus_5ms"] is True  # the median run, 54 ms
    assert out["cutoff_p99_within_slo_plus_5ms_in"] == "2/3"  # but one run of three was over
    assert [e["p99_cutoff_ms"] for e in out["repetitions"]] == [49.0, 65.0, 54.0]


def test_the_first_repetition_keeps_the_plain_run_keys() -> None:
    assert run_key(8, "cutoff", 0) == "8/cutoff"
    assert run_key(8, "cutoff", 2) == "8/cutoff/r3"
