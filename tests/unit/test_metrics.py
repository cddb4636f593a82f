"""The metrics' pure parts: the dashboard's series (rates, quantiles, merging two members), the
selector's and batcher's families, the metric ports `up` hands out, consumer lag from
librdkafka's statistics, dead letters, and the gateway's dashboard routes behind API keys."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from batchers.metrics import batcher_registry
from clipstream.metrics_targets import PORT_ENV, TARGETS_ENV, MetricTargets, stage_kind
from frontend.dashboard import PAGE_PATHS, read_targets
from frontend.dashboard.series import Series, merge, parse, quantile
from selector.learn import UNKNOWN_QUERY
from schemas import Response
from schemas.reasons import NOTHING_ARRIVED
from selector.metrics import SelectorMetrics, default_reason, policy_weights
from tests.unit.test_gateway_http import GOOD, make_app
from topics.deadletters import dead_letter_record, reason_label
from topics.metrics import SEGMENTS, lag_of, render


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_quantile_interpolates_within_the_bucket_as_prometheus_does():
    buckets = {0.01: 50.0, 0.02: 90.0, 0.05: 100.0, float("inf"): 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.01)
    assert quantile(0.7, buckets) == pytest.approx(0.015)  # halfway through the second bucket
    assert quantile(0.99, buckets) == pytest.approx(0.02 + 0.03 * 0.9)
    assert quantile(0.5, {0.01: 0.0, float("inf"): 0.0}) is None


def test_merge_sums_two_members_counters_and_averages_their_weights():
    a = parse('clipstream_selector_answers_total{app="d",outcome="prediction"} 3\n'
              'clipstream_policy_weight{app="d",model="m"} 0.2\n')
    b = parse('clipstream_selector_answers_total{app="d",outcome="prediction"} 4\n'
              'clipstream_policy_weight{app="d",model="m"} 0.4\n')
    merged = merge([a, b])
    assert merged[("clipstream_selector_answers_total", (("app", "d"), ("outcome", "prediction")))] == 7
    assert merged[("clipstream_policy_weight", (("app", "d"), ("model", "m")))] == pytest.approx(0.3)


def test_two_batcher_members_limits_for_one_replica_are_averaged_not_added():
    a = parse('clipstream_batcher_aimd_limit{model="m",replica="0"} 8\n')
    b = parse('clipstream_batcher_aimd_limit{model="m",replica="0"} 4\n')
    assert merge([a, b])[("clipstream_batcher_aimd_limit", (("model", "m"), ("replica", "0")))] == 6


def scrape(answers: float, batches: float, items: float, limit: float, hits: float, requests: float,
           weight: float) -> dict:
    text = "\n".join([
        f'clipstream_selector_answers_total{{app="d",outcome="prediction"}} {answers}',
        f'clipstream_selector_answer_seconds_bucket{{app="d",le="0.01"}} {answers}',
        f'clipstream_selector_answer_seconds_bucket{{app="d",le="+Inf"}} {answers}',
        f'clipstream_batcher_batches_total{{model="m",replica="0"}} {batches}',
        f'clipstream_batcher_batched_requests_total{{model="m",replica="0"}} {items}',
        f'clipstream_batcher_aimd_limit{{model="m",replica="0"}} {limit}',
        f'clipstream_batcher_cache_hits_total{{model="m"}} {hits}',
        f'clipstream_batcher_requests_total{{model="m"}} {requests}',
        f'clipstream_batcher_cache_misses_total{{model="m"}} {requests - hits}',
        f'clipstream_policy_weight{{app="d",model="m"}} {weight}',
        f'clipstream_stage_latency_seconds_sum{{segment="device"}} {answers * 0.002}',
        f'clipstream_stage_latency_seconds_count{{segment="device"}} {answers}',
        f'clipstream_worker_device_seconds_sum{{model="m",replica="0",version="v1"}} {batches * 0.1}',
    ]) + "\n"
    return merge([parse(text)])


def test_series_rates_batch_size_cache_share_and_weights_over_the_window():
    series = Series(keep=10, window=2)
    series.add(100.0, scrape(0, 0, 0, 1, 0, 0, 0.5), {"d": 50.0})
    series.add(101.0, scrape(10, 2, 10, 6, 0, 10, 0.4), {"d": 50.0})
    row = series.add(102.0, scrape(30, 4, 20, 3, 5, 20, 0.3), {"d": 50.0})
    assert row["throughput"] == {"d": pytest.approx(15.0)}  # 30 answers over 2 s
    assert row["batch_size"]["m.0 mean"] == pytest.approx(5.0)  # 20 requests in 4 batches
    assert row["batch_size"]["m.0 limit"] == 3  # the gauge as it is now: the saw-tooth's last point
    assert row["cache"]["m"] == pytest.approx(0.25)
    assert row["weights"] == {"d: m": 0.3}
    assert row["latency"]["d SLO"] == 50.0 and 0 < row["latency"]["d p99"] <= 10.0
    assert row["breakdown"]["device"] == pytest.approx(2.0)
    assert row["device"] == {"m.0": pytest.approx(0.2)}  # 4 batches of 0.1 s in 2 s: busy a fifth of the time
    out = series.to_json()
    assert out["t"] == [100.0, 101.0, 102.0]
    panel = next(p for p in out["panels"] if p["id"] == "weights")
    assert panel["series"]["d: m"] == [0.5, 0.4, 0.3]
    first = next(p for p in out["panels"] if p["id"] == "throughput")
    assert len(first["series"]["d"]) == 3  # every series as long as t


def test_an_app_the_selector_never_answers_is_shown_from_the_gateways_answers():
    # ``d`` goes through the selector; ``one`` is a one-model app its model answers straight
    def at(n: float) -> dict:
        return merge([parse("\n".join([
            f'clipstream_selector_answers_total{{app="d",outcome="prediction"}} {n}',
            f'clipstream_selector_answer_seconds_bucket{{app="d",le="0.01"}} {n}',
            f'clipstream_selector_answer_seconds_bucket{{app="d",le="+Inf"}} {n}',
            f'clipstream_gateway_answers_total{{app="d",outcome="prediction"}} {n}',
            f'clipstream_gateway_query_seconds_bucket{{app="d",le="0.01"}} {n}',
            f'clipstream_gateway_query_seconds_bucket{{app="d",le="+Inf"}} {n}',
            f'clipstream_gateway_answers_total{{app="one",outcome="prediction"}} {2 * n}',
            f'clipstream_gateway_answers_total{{app="one",outcome="default"}} {n / 10}',
            f'clipstream_gateway_defaults_total{{source="model"}} {n / 20}',
            f'clipstream_gateway_defaults_total{{source="gateway_timeout"}} {n / 20}',
            f'clipstream_gateway_defaults_total{{source="selector"}} {n}',
            f'clipstream_gateway_answers_total{{app="one",outcome="refused"}} {3 * n}',
            f'clipstream_gateway_query_seconds_bucket{{app="one",le="0.005"}} {2 * n}',
            f'clipstream_gateway_query_seconds_bucket{{app="one",le="+Inf"}} {2.1 * n}',
        ]) + "\n")])

    series = Series(keep=10, window=2)
    series.add(100.0, at(0), {"d": 50.0, "one": 50.0})
    row = series.add(102.0, at(20), {"d": 50.0, "one": 50.0})
    # the 30 refusals a second are no answers: the throughput is what was answered
    assert row["throughput"] == {"d": pytest.approx(10.0), "one": pytest.approx(21.0)}
    assert row["outcomes"]["refused (503)"] == pytest.approx(30.0)
    assert row["outcomes"]["prediction"] == pytest.approx(10.0 + 20.0)
    # the gateway's own defaults, each by its cause; the selector's are counted by the selector
    assert row["outcomes"]["default: the model failed or was late (one-model app)"] == pytest.approx(0.5)
    assert row["outcomes"]["default: no answer reached the gateway by the deadline"] == pytest.approx(0.5)
    assert row["outcomes"]["default: decided by the selector"] == pytest.approx(10.0)
    assert 0 < row["latency"]["one p50"] <= 5.0 and row["latency"]["d p50"] <= 10.0


def test_a_removed_apps_series_leave_the_dashboard_with_it():
    """A removed app's counters and weights stay in the stages' metrics until they restart: the
    dashboard draws only the registry's apps."""
    def at(n: float) -> dict:
        return merge([parse("\n".join([
            f'clipstream_selector_answers_total{{app="{app}",outcome="prediction"}} {n}' for app in ("d", "gone")
        ] + ['clipstream_policy_weight{app="gone",model="m"} 0.5', 'clipstream_policy_weight{app="d",model="m"} 1',
             f'clipstream_selector_stragglers_total{{app="gone",model="m"}} {n}']) + "\n")])

    series = Series(keep=10, window=2)
    series.add(100.0, at(0), {"d": 50.0})
    row = series.add(102.0, at(20), {"d": 50.0})
    assert row["throughput"] == {"d": pytest.approx(10.0)} and row["weights"] == {"d: m": 1.0}
    assert row["stragglers"] == {}
    unknown = series.add(104.0, at(40), {})  # the registry not read: nothing is left out
    assert set(unknown["throughput"]) == {"d", "gone"}


def test_an_app_the_gateway_answers_is_shown_as_its_callers_got_it():
    """The selector's answers of an app the gateway answers are left out: after an outage the
    selector drains a backlog of queries whose callers the gateway already answered by the
    deadline, which no caller receives (a Kafka client's query among them is not told apart)."""
    def at(n: float, kafka: float) -> dict:
        return merge([parse("\n".join([
            'clipstream_gateway_direct_app{app="one"} 1',
            f'clipstream_selector_answers_total{{app="one",outcome="prediction"}} {kafka}',
            f'clipstream_selector_answer_seconds_bucket{{app="one",le="0.01"}} {kafka}',
            f'clipstream_selector_answer_seconds_bucket{{app="one",le="+Inf"}} {kafka}',
            f'clipstream_gateway_answers_total{{app="one",outcome="prediction"}} {n}',
            f'clipstream_gateway_query_seconds_bucket{{app="one",le="0.005"}} {n}',
            f'clipstream_gateway_query_seconds_bucket{{app="one",le="0.01"}} {n}',
            f'clipstream_gateway_query_seconds_bucket{{app="one",le="+Inf"}} {n}',
        ]) + "\n")])

    series = Series(keep=10, window=2)
    series.add(100.0, at(0, 1), {"one": 50.0})
    row = series.add(102.0, at(20, 300), {"one": 50.0})  # a backlog of 299 drained late
    assert row["throughput"] == {"one": pytest.approx(10.0)}
    assert row["outcomes"]["prediction"] == pytest.approx(10.0)
    assert row["latency"]["one p50"] <= 5.0  # the callers' 20 answers within 5 ms


def test_the_feedback_panel_shows_what_the_learner_did_with_each_apps_feedback():
    def at(n: float) -> dict:
        return merge([parse(f'clipstream_selector_feedback_total{{app="d",outcome="applied"}} {n}\n'
                            f'clipstream_selector_feedback_total{{app="d",outcome="unknown_query"}} {n / 4}\n')])

    series = Series(keep=10, window=2)
    series.add(100.0, at(0))
    row = series.add(102.0, at(8))
    assert row["feedback"] == {"d applied": pytest.approx(4.0), "d unknown_query": pytest.approx(1.0)}


def test_stragglers_and_failures_of_queries_sent_straight_to_a_model_join_the_selectors():
    def at(n: float) -> dict:
        return merge([parse(f'clipstream_selector_stragglers_total{{app="d",model="m"}} {n}\n'
                            f'clipstream_gateway_stragglers_total{{app="d",model="m"}} {n}\n'
                            f'clipstream_gateway_failed_total{{app="one",model="k"}} {n / 2}\n')])

    series = Series(keep=10, window=2)
    series.add(100.0, at(0))
    row = series.add(102.0, at(8))
    assert row["stragglers"]["stragglers d: m"] == pytest.approx(8.0)  # 4/s at the selector, 4/s straight
    assert row["stragglers"]["failed one: k"] == pytest.approx(2.0)


def test_the_admission_panel_shows_the_gateways_limit_in_flight_waiting_and_cuts_a_second_by_cause():
    from frontend.metrics import GatewayMetrics

    gateway = GatewayMetrics(lambda: 3, lambda: 20, lambda: 2)
    series = Series(keep=10, window=2)
    series.add(100.0, merge([parse(gateway.render())]))
    for cause in ("loop", "loop", "loop", "loop", "slow"):
        gateway.cuts.inc(cause)
    row = series.add(102.0, merge([parse(gateway.render())]))
    assert row["admission"] == {"limit": 20.0, "in flight": 3.0, "waiting": 2.0, "cuts: loop": 2.0,
                                "cuts: slow": 0.5}


def test_default_reasons_are_a_bounded_set_and_weights_a_softmax():
    assert default_reason(NOTHING_ARRIVED) == "nothing_arrived"
    assert default_reason("every model failed: m: boom") == "models_failed"
    assert default_reason("unknown app 'x' with free text") == "rejected"
    weights = policy_weights({"models": ["a", "b"], "log_w": [0.0, -1.0]})
    assert sum(weights.values()) == pytest.approx(1.0) and weights["a"] > weights["b"]
    assert policy_weights({"policy": "single"}) == {}


def _response(app: str, default: bool, trace: dict[str, int]) -> Response:
    return Response(query_id="q", app=app, output=None if default else 1, scores=None, labels=None,
                    confidence=0.0, is_default=default, default_reason=NOTHING_ARRIVED if default else None,
                    answered=[], missing=[], created_us=1, deadline_us=2, trace=trace)


def test_selector_counts_answers_defaults_stragglers_stage_times_and_weights():
    m = SelectorMetrics()
    m.dispatched("d", {"models": ["a", "b"], "log_w": [0.0, 0.0]})
    stamps = {"produced": 0, "dispatched": 1000, "batcher_in": 2000, "batched": 4000, "worker_in": 5000,
              "worker_out": 8000, "selector_in": 9000, "joined": 9500}
    m.answered(_response("d", False, stamps))
    m.answered(_response("d", True, {}))
    m.answered(_response("nope", True, {}))  # an app the selector never dispatched: one bounded label
    m.stragglers("d", ["b"])
    m.failed("d", ["a"])
    s = samples(render(m.registry).decode())
    assert s[("clipstream_selector_answer_seconds_count", (("app", "d"),))] == 1  # timed from `produced`
    assert s[("clipstream_selector_answers_total", (("app", "d"), ("outcome", "prediction")))] == 1
    assert s[("clipstream_selector_defaults_total", (("app", "d"), ("reason", "nothing_arrived")))] == 1
    assert s[("clipstream_selector_answers_total", (("app", "_unknown"), ("outcome", "default")))] == 1
    assert s[("clipstream_selector_stragglers_total", (("app", "d"), ("model", "b")))] == 1
    assert s[("clipstream_selector_failed_total", (("app", "d"), ("model", "a")))] == 1
    assert s[("clipstream_policy_weight", (("app", "d"), ("model", "a")))] == 0.5
    for segment, _, _ in SEGMENTS:
        assert s[("clipstream_stage_latency_seconds_count", (("segment", segment),))] == 1, segment
    assert s[("clipstream_stage_latency_seconds_sum", (("segment", "device"),))] == pytest.approx(0.003)


def test_the_weights_gauge_shows_what_was_learnt_since_the_last_dispatch():
    """Feedback comes after its queries: the learner's newer global state (the store's memory,
    which the selector shares) is what a scrape shows; until there is one, the dispatch's."""
    m = SelectorMetrics()
    m.dispatched("d", {"models": ["a", "b"], "log_w": [0.0, 0.0]})
    learnt: dict[str, Any] = {}
    m.global_state = learnt.get
    s = samples(render(m.registry).decode())
    assert s[("clipstream_policy_weight", (("app", "d"), ("model", "a")))] == 0.5
    learnt["d"] = {"models": ["a", "b"], "log_w": [0.0, -math.log(3)]}  # taught by feedback since
    s = samples(render(m.registry).decode())
    assert s[("clipstream_policy_weight", (("app", "d"), ("model", "a")))] == pytest.approx(0.75)


def test_selector_reads_its_reply_budget_at_scrape_time():
    m, budget = SelectorMetrics(), [3000]
    m.reply_budget(lambda: budget[0])
    budget[0] = 12_500  # learnt since: a scrape sees the budget now, not at registration
    s = samples(render(m.registry).decode())
    assert s[("clipstream_selector_reply_budget_seconds", ())] == pytest.approx(0.0125)


def test_batcher_families_are_read_from_its_counts_at_scrape_time():
    replica = {"replica": 0, "max_batch_size": 12, "in_flight": 1, "batches": 4, "items": 30, "suspect": False}
    svc = SimpleNamespace(counts={"requests": 40, "cached": 10, "batched": 30, "expired": 2, "forwarded": 5},
                          core=SimpleNamespace(queue=[1, 2, 3], dispatcher=SimpleNamespace(stats=lambda: [replica])))
    s = samples(render(batcher_registry(lambda: {"m": svc})).decode())
    assert s[("clipstream_batcher_cache_hits_total", (("model", "m"),))] == 10
    assert s[("clipstream_batcher_cache_misses_total", (("model", "m"),))] == 30
    assert s[("clipstream_batcher_queue_depth", (("model", "m"),))] == 3
    assert s[("clipstream_batcher_forwarded_total", (("model", "m"),))] == 5
    assert s[("clipstream_batcher_aimd_limit", (("model", "m"), ("replica", "0")))] == 12
    assert s[("clipstream_batcher_batched_requests_total", (("model", "m"), ("replica", "0")))] == 30
    svc.counts["cached"] = 11  # read again at the next scrape, not counted twice on the hot path
    s = samples(render(batcher_registry(lambda: {"m": svc})).decode())
    assert s[("clipstream_batcher_cache_hits_total", (("model", "m"),))] == 11
    # a hit counted after its request (the lookup came later) leaves the misses where they were
    assert s[("clipstream_batcher_cache_misses_total", (("model", "m"),))] == 30


def test_up_gives_each_stage_one_port_for_life_and_writes_file_sd(tmp_path):
    targets = MetricTargets(tmp_path / "targets.json")
    a = targets.env("selector-1", {"X": "1"})
    b = targets.env("worker-knn-v1-0", {})
    assert a["X"] == "1" and a[PORT_ENV] != b[PORT_ENV] and a[TARGETS_ENV] == str(tmp_path / "targets.json")
    assert targets.env("selector-1", {})[PORT_ENV] == a[PORT_ENV]  # a restart serves on the same port
    groups = json.loads((tmp_path / "targets.json").read_text())
    assert {g["labels"]["name"]: g["labels"]["stage"] for g in groups} == {"selector-1": "selector",
                                                                          "worker-knn-v1-0": "worker"}
    assert [t.url for t in read_targets(tmp_path / "targets.json")] == [
        f"http://127.0.0.1:{a[PORT_ENV]}/metrics", f"http://127.0.0.1:{b[PORT_ENV]}/metrics"]
    assert targets.lines(["selector-1"]) == [f"metrics: selector-1 http://127.0.0.1:{a[PORT_ENV]}/metrics"]
    targets.keep(["worker-knn-v1-0"])
    assert [g["labels"]["name"] for g in json.loads((tmp_path / "targets.json").read_text())] == ["worker-knn-v1-0"]
    assert stage_kind("batchers-a+b") == "batcher" and stage_kind("gateway-2") == "gateway"


def test_consumer_lag_from_librdkafka_statistics():
    stats = {"topics": {"t.queries": {"partitions": {
        "0": {"partition": 0, "fetch_state": "active", "consumer_lag": 7},
        "1": {"partition": 1, "fetch_state": "active", "consumer_lag": -1},   # not known yet
        "2": {"partition": 2, "fetch_state": "none", "consumer_lag": 99},     # not this consumer's
        "-1": {"partition": -1, "consumer_lag": 5}}}}}                        # librdkafka's UA partition
    assert lag_of(json.dumps(stats)) == {"t.queries": 7.0}
    assert lag_of("not json") == {}


def test_dead_letters_are_counted_by_stage_and_reason_prefix():
    assert reason_label("bad input: shape (3,) is not (64,)") == "bad input"
    assert reason_label(UNKNOWN_QUERY) == "unknown query id"  # says what went wrong in its first words
    before = samples(render().decode()).get(
        ("clipstream_dead_letters_total", (("reason", "undecodable query"), ("stage", "unit"))), 0.0)
    dead_letter_record(stage="unit", reason="undecodable query: truncated")
    after = samples(render().decode())
    assert after[("clipstream_dead_letters_total", (("reason", "undecodable query"), ("stage", "unit")))] == before + 1


def test_every_stage_says_whether_redis_answers_it():
    from clipstream.redisclient import RedisGuard

    def frozen() -> None:
        raise ConnectionError("frozen")

    guard = RedisGuard(frozen, name="unit-redis", probe_every_s=60)
    key = ("clipstream_redis_available", (("user", "unit-redis"),))
    assert samples(render().decode())[key] == 1.0
    guard.failed(ConnectionError("frozen"))
    now = samples(render().decode())
    assert now[key] == 0.0 and now[("clipstream_redis_outages_total", (("user", "unit-redis"),))] == 1.0
    guard.close()


@pytest.mark.parametrize(("reason", "label"), [
    ("unknown app 'rand65b1eec3'", "unknown app"),
    ("unknown tensor dtype 'complex256x'", "unknown tensor dtype"),
    ("tensor of dtype float32 and shape [64] needs 256 bytes, got 3", "tensor of dtype and"),
    ("bad input for model logreg: input shape [63] does not match", "bad input for model"),
    ("query 4019abc has no app", "query has no app"),
    (":", "unknown"),
])
def test_a_reason_label_keeps_none_of_the_records_values(reason: str, label: str) -> None:
    """Hostile records choose the values in a reason (an app name, a dtype, a shape): none may
    reach the label, or every such record would add a series to the metric."""
    assert reason_label(reason) == label


def test_hostile_reasons_add_no_series() -> None:
    for i in range(20):
        dead_letter_record(stage="unit-hostile", reason=f"unknown app 'app{i:x}-{i * 7919}'")
    labels = {dict(k[1])["reason"] for k in samples(render().decode())
              if k[0] == "clipstream_dead_letters_total" and dict(k[1]).get("stage") == "unit-hostile"}
    assert labels == {"unknown app"}


def test_gateway_counts_per_app_and_serves_the_dashboard_behind_its_keys():
    with TestClient(make_app(api_keys=("k1",))) as c:
        for path in PAGE_PATHS:  # the page and its scripts hold no data: open
            r = c.get(path)
            assert r.status_code == 200 and len(r.content) > 100, path
        assert "uPlot" in c.get("/dashboard/uPlot.iife.min.js").text
        assert c.get("/dashboard/nope.js", headers={"X-API-Key": "k1"}).status_code == 404
        assert c.get("/dashboard/data").status_code == 401
        assert c.post("/v1/apps/pets/predict", json={"input": GOOD}, headers={"X-API-Key": "k1"}).status_code == 200
        data = c.get("/dashboard/data", headers={"X-API-Key": "k1"}).json()
        assert [p["id"] for p in data["panels"]][:3] == ["throughput", "latency", "outcomes"]
        s = samples(c.get("/metrics", headers={"X-API-Key": "k1"}).text)
    assert s[("clipstream_gateway_queries_total", (("app", "pets"),))] == 1
    assert s[("clipstream_gateway_answers_total", (("app", "pets"), ("outcome", "prediction")))] == 1
    assert s[("clipstream_gateway_query_seconds_count", (("app", "pets"),))] == 1
    assert s[("clipstream_app_slo_seconds", (("app", "pets"),))] == pytest.approx(0.03)
    assert s[("process_resident_memory_bytes", ())] > 0


def test_hot_path_families_render_as_prometheus_counters_and_cumulative_histograms():
    from prometheus_client import CollectorRegistry

    from topics.metrics import Family

    r = CollectorRegistry()
    hist = Family("t_seconds", "h", ("app",), buckets=(0.01, 0.1), registry=r)
    count = Family("t_events", "c", registry=r)
    child = hist.labels("a")
    for v in (0.005, 0.01, 0.05, 3.0):
        child.observe(v)
    count.labels().inc(2)
    s = samples(render(r).decode())
    assert [s[("t_seconds_bucket", (("app", "a"), ("le", le)))] for le in ("0.01", "0.1", "+Inf")] == [2, 3, 4]
    assert s[("t_seconds_count", (("app", "a"),))] == 4 and s[("t_seconds_sum", (("app", "a"),))] == 3.065
    assert s[("t_events_total", ())] == 2


def test_the_page_gets_only_the_rows_it_has_not_seen():
    series = Series(keep=10, window=2)
    for t in (100.0, 101.0, 102.0):
        series.add(t, scrape(t - 100, 0, 0, 1, 0, 0, 0.5))
    newer = series.to_json(since=101.0)
    assert newer["t"] == [102.0]
    assert next(p for p in newer["panels"] if p["id"] == "weights")["series"] == {"d: m": [0.5]}
    assert series.to_json(since=102.0)["t"] == []


def test_the_gateway_counts_the_bodies_it_is_still_reading() -> None:
    from frontend.metrics import GatewayMetrics

    reading = [0]
    gateway = GatewayMetrics(lambda: 0, reading=lambda: reading[0])
    assert "clipstream_gateway_reading_bodies 0.0" in gateway.render()
    reading[0] = 7
    assert "clipstream_gateway_reading_bodies 7.0" in gateway.render()


def test_the_weight_gauge_shows_the_apps_global_weights_not_the_last_context():
    m = SelectorMetrics()
    alice = {"models": ["a", "b"], "log_w": [0.0, -10.0]}
    m.dispatched("d", alice, "alice")  # no query without a context yet: the context's weights
    weight = lambda: samples(render(m.registry).decode())[("clipstream_policy_weight", (("app", "d"), ("model", "a")))]  # noqa: E731
    assert weight() > 0.99
    m.dispatched("d", {"models": ["a", "b"], "log_w": [0.0, 0.0]}, None)
    m.dispatched("d", alice, "alice")
    assert weight() == 0.5
