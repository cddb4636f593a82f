"""The headline-figures table (bench.figures) from small synthetic reports: no broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import figures
from bench.figures import Row
from bench.figures_format import NO, NONE, YES


def _write(out: Path, name: str, report: dict[str, Any]) -> None:
    (out / f"{name}.json").write_text(json.dumps(report))


def _rows(out: Path) -> dict[str, Row]:
    table, _ = figures.rows(out)
    return {r.figure: r for r in table}


def _row(out: Path, start: str) -> Row:
    [row] = [r for name, r in _rows(out).items() if name.startswith(start)]
    return row


def _adapt(rec_goodput: int | None, rec_ok: int | None, settled: float = 0.95) -> dict[str, Any]:
    def reading(rec: int | None) -> dict[str, Any]:
        return {"aimd_objective_ms": 10.0, "new_best_fixed": "fixed 4", "new_best_fixed_qps": 260.0,
                "recovery_batches": rec, "recovery_s": None if rec is None else 1.0,
                "aimd_after_vs_new_best": settled,
                "by_round": [{"recovery_batches": rec}, {"recovery_batches": 50}, {"recovery_batches": rec}]}
    return {"adapt": {"goodput": reading(rec_goodput), "ok throughput": reading(rec_ok)}}


def test_a_met_and_a_missed_target(tmp_path: Path) -> None:
    _write(tmp_path, "scaling", {"summary": {"goodput_qps": {"1": 50.0, "2": 100.0, "4": 205.0},
                                             "ratio_to_one": {"1": 1.0, "2": 2.0, "4": 4.1}}})
    _write(tmp_path, "efficiency", {"summary": {"efficiency": 0.85, "best_goodput_qps": 102.9,
                                                "device_max_qps": 121.0}})
    scaling, eff = _row(tmp_path, "scaling"), _row(tmp_path, "efficiency")
    assert scaling.met == YES and "4.10x" in scaling.measured and "205" in scaling.measured
    assert eff.met == NO and "0.850" in eff.measured and "of 121 q/s" in eff.measured
    # just under the target is a miss, just at it is met
    _write(tmp_path, "scaling", {"summary": {"goodput_qps": {"1": 50.0, "2": 100.0, "4": 179.0},
                                             "ratio_to_one": {"4": 3.58}}})
    assert _row(tmp_path, "scaling").met == NO
    _write(tmp_path, "efficiency", {"summary": {"efficiency": 0.9, "best_goodput_qps": 109.0,
                                                "device_max_qps": 121.0}})
    assert _row(tmp_path, "efficiency").met == YES


def test_missing_reports_give_not_measured_rows_and_the_file_is_written(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "bench"
    assert figures.main(["--out-dir", str(out)]) == 0
    table = _rows(out)
    assert len(table) == len(figures.FIGURES)
    for row in table.values():
        assert row.met == NONE
        assert row.measured == f"not measured (no {out / row.report})"
    text = (out / "FIGURES.md").read_text()
    assert text == capsys.readouterr().out
    assert "| figure | target | measured | met | report |" in text
    assert text.count("not measured") == len(figures.FIGURES)


def test_a_missing_key_or_an_unreadable_report_does_not_raise(tmp_path: Path) -> None:
    _write(tmp_path, "scaling", {"summary": {"goodput_qps": {"1": 50.0}}})  # no ratio_to_one
    (tmp_path / "join.json").write_text("{ not json")
    assert _row(tmp_path, "scaling").measured == "not in report"
    assert _row(tmp_path, "scaling").met == NONE
    assert _row(tmp_path, "join overhead").measured.startswith("not measured (unreadable")


def test_adapt_recovery_never_is_not_met(tmp_path: Path) -> None:
    _write(tmp_path, "batching", _adapt(rec_goodput=None, rec_ok=35))
    row = _row(tmp_path, "AIMD after")
    assert row.met == NO
    assert "goodput (AIMD 10 ms): never batches (never, 50, never)" in row.measured
    _write(tmp_path, "batching", _adapt(rec_goodput=120, rec_ok=35))
    assert _row(tmp_path, "AIMD after").met == YES
    _write(tmp_path, "batching", _adapt(rec_goodput=201, rec_ok=35))
    assert _row(tmp_path, "AIMD after").met == NO
    _write(tmp_path, "batching", _adapt(rec_goodput=120, rec_ok=35, settled=0.85))
    assert _row(tmp_path, "AIMD after").met == NO


def test_adapt_another_objective_is_shown_but_not_judged(tmp_path: Path) -> None:
    report = _adapt(rec_goodput=40, rec_ok=35)
    report["adapt"]["goodput, objective as given"] = {
        "aimd_objective_ms": 8.0, "counts_for_target": False, "new_best_fixed": "fixed 8",
        "recovery_batches": None, "aimd_after_vs_new_best": 0.75, "by_round": []}
    _write(tmp_path, "batching", report)
    row = _row(tmp_path, "AIMD after")
    assert row.met == YES
    assert "goodput, objective as given (AIMD 8 ms): never batches, settled 0.75x of fixed 8 (not counted)" \
        in row.measured
    report["adapt"]["goodput"]["aimd_after_vs_new_best"] = 0.8  # a counted reading still decides
    _write(tmp_path, "batching", report)
    assert _row(tmp_path, "AIMD after").met == NO


def test_adapt_of_the_older_shape_without_objective_or_rounds(tmp_path: Path) -> None:
    _write(tmp_path, "batching", {"adapt": {"goodput": {"recovery_batches": 72, "aimd_after_vs_new_best": 0.93}}})
    row = _row(tmp_path, "AIMD after")
    assert row.met == YES and row.measured == "goodput: 72 batches, settled 0.93x of new best"


def test_gateway_overload_is_met_only_when_none_is_late_from_when_due(tmp_path: Path) -> None:
    overload = {"answered": 2668, "default": 11, "error": 6932, "lost": 0, "refused_503": 6932, "max_wait_ms": 70.5,
                "over_slo_plus_20ms": 1, "over_slo_plus_20ms_from_send": 0, "over_slo_plus_20ms_send_to_arrival": 0,
                "stamped": 9611, "offered_qps": 1201.6}
    report = {"summary": {"cache_hit_ms": {"p50": 4.4, "p99": 26.0, "n": 400}, "overload": overload}}
    _write(tmp_path, "gateway", report)
    row = _row(tmp_path, "gateway at overload")
    assert row.met == NO
    assert "1 from when due, 0 from the send, 0 at arrival" in row.measured and "6,932 503s" in row.measured
    assert row.measured.startswith("1,202 q/s offered; over SLO + 20 ms")
    assert _row(tmp_path, "gateway round trip").met == NO  # p99 26 ms > 25
    overload["over_slo_plus_20ms"] = 0
    _write(tmp_path, "gateway", report)
    assert _row(tmp_path, "gateway at overload").met == YES


def test_answer_after_deadline_sign(tmp_path: Path) -> None:
    summary = {"join_overhead_ms": {"p50": 0.2, "p99": 0.9}, "after_deadline_ms": {"p50": -3.0, "p99": -2.5, "max": -1.8}}
    _write(tmp_path, "join", {"summary": summary})
    row = _row(tmp_path, "answer time minus deadline")
    assert row.met == YES and "p99 -2.50 ms" in row.measured
    summary["after_deadline_ms"]["p99"] = 5.0  # 5 ms after the deadline: not below +5 ms
    _write(tmp_path, "join", {"summary": summary})
    assert _row(tmp_path, "answer time minus deadline").met == NO


def test_delayed_reports_the_best_ratio_per_mode_and_delay(tmp_path: Path) -> None:
    ratios = {"open pipe, 300 qps, delay 5 vs 0 ms": {"goodput": 2.76}, "open pipe, 600 qps, delay 5 vs 0 ms": {"goodput": 3.24},
              "open pipe, 300 qps, delay 2 vs 0 ms": {"goodput": 1.51},
              "just in time, 300 qps, delay 5 vs 0 ms": {"goodput": 1.03}}
    _write(tmp_path, "batching", {"delayed": {"ratios": ratios}})
    row = _row(tmp_path, "delayed batching")
    assert row.met == YES
    assert "open pipe: 2 ms 1.51x @300, 5 ms 3.24x @600" in row.measured
    assert row.measured.endswith("2x reached by open pipe 5 ms")
    for v in ratios.values():
        v["goodput"] = min(v["goodput"], 1.99)
    _write(tmp_path, "batching", {"delayed": {"ratios": ratios}})
    assert _row(tmp_path, "delayed batching").met == NO


def test_stragglers_each_size_must_be_within_slo_plus_5ms(tmp_path: Path) -> None:
    def size(p99: float, loss: float) -> dict[str, float]:
        return {"p99_cutoff_ms": p99, "accuracy_loss_points": loss}
    report = {"settings": {"slo_ms": 50.0}, "summary": {"2": size(45.0, 0.2), "4": size(55.0, 0.3), "8": size(54.0, 0.9)}}
    _write(tmp_path, "stragglers", report)
    row = _row(tmp_path, "stragglers")
    assert row.met == YES and "p99 45.0 / 55.0 / 54.0 ms (2 / 4 / 8 models)" in row.measured
    report["summary"]["8"] = size(55.1, 0.1)
    _write(tmp_path, "stragglers", report)
    assert _row(tmp_path, "stragglers").met == NO
    report["summary"]["8"] = size(50.0, 1.0)
    _write(tmp_path, "stragglers", report)
    assert _row(tmp_path, "stragglers").met == NO


def test_the_members_row_gives_each_count_and_its_ratio_to_one(tmp_path: Path) -> None:
    _write(tmp_path, "members", {"summary": {"goodput_qps": {"1": 400.0, "2": 380.0, "4": None},
                                             "ratio_to_one": {"1": 1.0, "2": 0.95, "4": None}, "cores": 2}})
    row = _row(tmp_path, "members")
    assert row.met == NONE and "400 / 380 / n/a q/s" in row.measured
    assert "2 vs 1 = 0.95x" in row.measured and "4 vs 1 = n/a" in row.measured and "2 cores" in row.measured


def test_the_crossing_row_gives_both_sides_and_the_floor_of_five(tmp_path: Path) -> None:
    rows = [{"variant": "linger 1 ms", "rate": 300.0, "broker_cpu_us_per_record": 100.0, "clients_cpu_us_per_record": 90.0},
            {"variant": "stages' settings", "rate": 300.0, "broker_cpu_us_per_record": 350.0,
             "clients_cpu_us_per_record": 200.0}]
    _write(tmp_path, "crossing", {"rows": rows, "crossings_per_query": 5, "broker_floor_us_per_query": {"300": 1750.0}})
    row = _row(tmp_path, "cost floor")
    assert "broker 350 µs + clients 200 µs" in row.measured and "1,750 µs" in row.measured
    assert row.met == NONE


def test_the_crossing_row_names_the_requests_of_a_fan_out(tmp_path: Path) -> None:
    rows = [{"variant": "stages' settings", "rate": 300.0, "broker_cpu_us_per_record": 350.0,
             "clients_cpu_us_per_record": 200.0}]
    fans = [{"topics": 5, "linger_ms": 0, "produce_requests_per_fan_out": 5.0},
            {"topics": 5, "linger_ms": 1, "produce_requests_per_fan_out": 4.0}]
    _write(tmp_path, "crossing", {"rows": rows, "crossings_per_query": 5, "broker_floor_us_per_query": {"300": 1750.0},
                                  "fan_out": fans})
    assert "5 records for 5 topics sent back to back: 5 produce requests" in _row(tmp_path, "cost floor").measured


def test_the_crossing_row_gives_both_ways_of_sending_an_ensembles_requests(tmp_path: Path) -> None:
    rows = [{"variant": "stages' settings", "rate": 300.0, "broker_cpu_us_per_record": 350.0,
             "clients_cpu_us_per_record": 200.0}]

    def fan(grouped: bool, broker: float, clients: float) -> dict[str, Any]:
        return {"models": 5, "grouped": grouped, "topics": 1 if grouped else 5, "rate": 200.0, "linger_ms": 0,
                "produce_requests_per_fan_out": 1.0 if grouped else 5.0, "broker_cpu_us_per_fan_out": broker,
                "clients_cpu_us_per_fan_out": clients}

    fans = [fan(False, 900.0, 500.0), fan(True, 350.0, 200.0), fan(True, 330.0, 220.0), fan(False, 1000.0, 520.0)]
    _write(tmp_path, "crossing", {"rows": rows, "crossings_per_query": 5, "broker_floor_us_per_query": {"300": 1750.0},
                                  "fan_out": fans})
    measured = _row(tmp_path, "cost floor").measured
    assert "5 records for 5 topics sent back to back: 5 produce requests, broker 950 + clients 510 µs at 200/s" in measured
    assert "one record for all 5 models: 1 produce request, broker 340 + clients 210 µs at 200/s" in measured


def _cost(rate: float, mlserver: float, cpus: int) -> dict[str, Any]:
    step = {"rate": rate + 100, "ok": False, "latency_ms": {"p99": 36.4}, "refused": 27}
    return {"machine": {"cpus": cpus},
            "summary": {"max_rate_qps": rate, "mlserver_max_rate_qps": mlserver, "vs_mlserver": rate / mlserver},
            "systems": {"clipstream": {"search": [{"rate": rate, "ok": True}, step],
                                       "cpu": {"300": {"cpu_us_per_query_total": 4852.1}}}}}


def test_the_wide_machines_cost_row_needs_both_the_rate_and_the_ratio(tmp_path: Path) -> None:
    _write(tmp_path, "cost-16core", _cost(700.0, 300.0, 16))
    row = _row(tmp_path, "cost on a 16-core machine")
    assert row.met == NO  # 2.33x MLServer, but 700 < 800 q/s
    assert row.measured.startswith("700 q/s; 800 q/s missed: p99 of answers 36.4 ms, 27 refused; 2.33x")
    assert "4,852 µs CPU per query at 300 q/s; 16 cores" in row.measured
    _write(tmp_path, "cost-16core", _cost(900.0, 400.0, 16))
    assert _row(tmp_path, "cost on a 16-core machine").met == YES


def test_the_wide_machines_ensemble_row_is_not_judged_and_says_when_the_search_ran_out(tmp_path: Path) -> None:
    report = {"machine": {"cpus": 16}, "max_rate_qps": 800.0, "settings": {
        "search": [200.0, 800.0], "slo_ms": 150.0, "baseline_qps": 130.0, "target_x": 3.0},
        "search": [{"rate": 800.0, "ok": True, "cpu_us_per_query_total": 10129.0}],
        "closed_loop": {"callers": 4, "qps": 326.0, "p99_ms": 17.2}}
    _write(tmp_path, "ensemble-16core", report)
    row = _row(tmp_path, "the 5-model ensemble on a 16-core machine")
    assert row.met == NONE
    assert row.measured.startswith("800 q/s (the highest step searched) within SLO 150 ms = 6.15x of 130")
    assert row.measured.endswith("; 16 cores")


def test_the_gpu_row_sets_the_real_model_beside_the_simulated_one(tmp_path: Path) -> None:
    torchscript = {b: {"p50_ms": p} for b, p in (("1", 2.0), ("4", 2.4), ("16", 3.9), ("32", 7.6))}
    _write(tmp_path, "gpu", {"device": "NVIDIA H200", "backend_device": "cuda", "formats": {"torchscript": torchscript},
                             "clockwork_ms": {"1": 2.61, "4": 5.61, "16": 15.67}})
    row = _row(tmp_path, "GPU: a real ResNet-50")
    assert row.met == NONE
    assert row.measured == ("NVIDIA H200, backend on cuda: TorchScript p50 2.00 / 2.40 / 3.90 / 7.60 ms at batch "
                            "1 / 4 / 16 / 32; the simulated accelerator sleeps 2.61 / 5.61 / 15.7 ms at batch 1 / 4 / 16")
    _write(tmp_path, "gpu", {"device": "NVIDIA H200", "backend_device": "cuda",
                             "formats": {"torchscript": torchscript,
                                         "export": {b: {"p50_ms": p} for b, p in (("1", 1.5), ("4", 1.7), ("16", 3.1),
                                                                                   ("32", 6.0))}},
                             "clockwork_ms": {"1": 2.61, "4": 5.61, "16": 15.67}})
    assert _row(tmp_path, "GPU: a real ResNet-50").measured == (
        "NVIDIA H200, backend on cuda: TorchScript p50 2.00 / 2.40 / 3.90 / 7.60 ms at batch 1 / 4 / 16 / 32; as "
        "torch.export p50 1.50 / 1.70 / 3.10 / 6.00 ms; the simulated accelerator sleeps 2.61 / 5.61 / 15.7 ms at "
        "batch 1 / 4 / 16")


def test_the_hopeless_row_gives_both_medians_and_their_ratio(tmp_path: Path) -> None:
    _write(tmp_path, "hopeless", {"settings": {"quantile": 0.5, "rate": 450.0, "rounds": 2},
                                  "summary": {"median_goodput_qps": {"skip": 65.0, "ask": 26.5},
                                              "skip_vs_ask": 2.45, "not_asked": 5547.0}})
    row = _row(tmp_path, "selector's skip of hopeless models")
    assert row.met == NONE
    assert row.measured == ("median goodput 65.0 q/s with the skip at 0.5 vs 26.5 q/s asking every model = 2.45x; "
                            "5,547 models not asked; 450 q/s offered, 2 round(s) each way")


def test_the_skip_near_capacity_row_gives_each_settings_median_error(tmp_path: Path) -> None:
    _write(tmp_path, "skip_near_capacity", {
        "settings": {"concurrency": 8, "rounds": 2},
        "summary": {"median_exp4_error": {"skip 0.5": 0.0712, "skip 0.1": 0.052, "ask": 0.0641},
                    "models_not_asked": {"skip 0.5": 1234.0, "skip 0.1": 0.0, "ask": 0},
                    "median_p50_ms": {"skip 0.5": 70.25, "skip 0.1": 68.0, "ask": 71.5}}})
    row = _row(tmp_path, "the same skip near capacity")
    assert row.met == NONE
    assert row.measured == ("median Exp4 error skip 0.5 0.071 (1,234 models not asked), skip 0.1 0.052 (0 models not asked), "
                            "ask 0.064; "
                            "8 callers, 2 round(s), p50 70.2 / 68.0 / 71.5 ms")


_README = """# title

Some text before.

| figure | target | measured | met | report |
| --- | --- | --- | --- | --- |
| scaling: 1, 2, 4 replicas of the simulated accelerator | ≥ 3.6x | an old scaling reading | yes | scaling.json |
| soak at 70% of capacity (python -m bench.soak) | 30 min | 30 min at 210 q/s, a \\| bar | yes | soak.json |
| a figure no longer in the table | — | gone | — | old.json |

Text after the table.
"""


def test_the_readme_table_is_renewed_where_a_report_exists_and_kept_where_none(tmp_path: Path) -> None:
    out, readme = tmp_path / "bench", tmp_path / "README.md"
    out.mkdir()
    readme.write_text(_README)
    _write(out, "scaling", {"summary": {"goodput_qps": {"1": 50.0, "2": 100.0, "4": 205.0},
                                        "ratio_to_one": {"4": 4.1}}})
    assert figures.main(["--out-dir", str(out), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\nSome text before.\n\n| figure |") and text.endswith("\nText after the table.\n")
    lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(lines) == len(figures.FIGURES)  # one row per figure, in the table's order; the stale one dropped
    by_figure = {line.split(" | ")[0][2:]: line for line in lines}
    assert "4.10x" in by_figure["scaling: 1, 2, 4 replicas of the simulated accelerator"]
    assert "an old scaling reading" not in text and "gone" not in text
    # no soak report here: the earlier reading stays, its escaped bar intact
    assert by_figure["soak at 70% of capacity (python -m bench.soak)"] == (
        "| soak at 70% of capacity (python -m bench.soak) | 30 min | 30 min at 210 q/s, a \\| bar | yes | soak.json |")
    assert "not measured" in by_figure["efficiency: goodput within SLO / device ceiling, 1 replica"]


def test_a_readme_without_the_table_is_left_as_it_was(tmp_path: Path, capsys: Any) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# no table here\n")
    assert figures.main(["--out-dir", str(tmp_path / "bench"), "--readme", str(readme)]) == 1
    assert readme.read_text() == "# no table here\n"
    assert "must start with the line" in capsys.readouterr().err


def test_the_hopeless_row_says_when_the_offered_rate_was_no_overload(tmp_path: Path) -> None:
    _write(tmp_path, "hopeless", {"settings": {"quantile": 0.5, "rate": 450.0, "rounds": 2},
                                  "summary": {"median_goodput_qps": {"skip": 446.2, "ask": 446.2},
                                              "skip_vs_ask": 1.0, "not_asked": 0.0, "ask_kept_up": True}})
    row = _row(tmp_path, "selector's skip of hopeless models")
    assert row.measured.endswith("; not an overload on this machine: asking every model kept up with the offered rate")
    _write(tmp_path, "hopeless", {"settings": {"quantile": 0.5, "rate": 450.0, "rounds": 2},
                                  "summary": {"median_goodput_qps": {"skip": 430.0, "ask": 420.0},
                                              "skip_vs_ask": 1.02, "not_asked": 12.0, "ask_kept_up": False}})
    assert "not an overload" not in _row(tmp_path, "selector's skip of hopeless models").measured


def test_the_hopeless_row_names_the_capacity_its_rate_was_set_from(tmp_path: Path) -> None:
    _write(tmp_path, "hopeless", {"settings": {"quantile": 0.5, "rate": 750.0, "rounds": 2, "over": 1.5},
                                  "summary": {"median_goodput_qps": {"skip": 300.0, "ask": 120.0},
                                              "skip_vs_ask": 2.5, "not_asked": 4000.0, "capacity_qps": 500.0}})
    row = _row(tmp_path, "selector's skip of hopeless models")
    assert row.measured.endswith("750 q/s offered, 2 round(s) each way (1.5x the 500 q/s that asking every model "
                                 "kept up with)")
