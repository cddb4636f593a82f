"""The warm-up's steady phase: closed loop, round robin over the apps, bounded in time."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np

from clipstream.warmup import Target, WarmStats, steady_load


def _gateway(in_flight_seen: list[int], per_app: dict[str, int],
             given_ms: list[float] | None = None) -> httpx.MockTransport:
    lock = threading.Lock()
    in_flight = [0]

    def handle(request: httpx.Request) -> httpx.Response:
        app = request.url.path.split("/")[3]
        body = json.loads(request.content)
        with lock:
            in_flight[0] += 1
            in_flight_seen.append(in_flight[0])
            per_app[app] = per_app.get(app, 0) + 1
        time.sleep(0.005)
        with lock:
            in_flight[0] -= 1
        if app == "busy":
            if per_app[app] % 2:  # a refusal, or no answer at all: both count as refused
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(503, json={"detail": "overloaded"})
        assert len(body["input"]) == 3 and body["slo_ms"] <= 2000.0
        with lock:  # a different latency each answer: the median tells which answers were counted
            latency = 5.0 + per_app[app] * (1.0 if app == "digits" else 3.0)
            if given_ms is not None:
                given_ms.append(latency)
        return httpx.Response(200, json={"default": app == "late", "latency_ms": latency})

    return httpx.MockTransport(handle)


def test_steady_load_is_closed_loop_round_robin_and_stops_on_time() -> None:
    seen: list[int] = []
    per_app: dict[str, int] = {}
    targets = [Target(a, (3,), "float32", 50.0) for a in ("digits", "late", "busy")]
    lines: list[str] = []
    given: list[float] = []
    with httpx.Client(transport=_gateway(seen, per_app, given), base_url="http://gw") as http:
        t0 = time.monotonic()
        stats = steady_load(http, targets, seconds=0.6, callers=3, report=lines.append, every_s=0.2)
        took = time.monotonic() - t0
    assert 0.6 <= took < 2.0
    assert max(seen) <= 3  # never more in flight than callers
    counts = [per_app[a] for a in ("digits", "late", "busy")]
    assert min(counts) >= 5 and max(counts) - min(counts) <= 3  # every app, evenly
    assert stats.answered == per_app["digits"] + per_app["late"]
    assert stats.defaults == per_app["late"] and stats.refused == per_app["busy"]
    assert stats.p50_ms() == float(np.median(given))  # every answer, a default too; no refusal
    assert lines and all(line.startswith("warming up: ") for line in lines)


def test_stats_count_refusals_apart_from_answers() -> None:
    stats = WarmStats()
    stats.add(200, {"default": False, "latency_ms": 10.0})
    stats.add(200, {"default": True, "latency_ms": 60.0})
    stats.add(503, {})
    assert (stats.answered, stats.defaults, stats.refused) == (2, 1, 1)
    assert stats.p50_ms() == 35.0 and stats.p50_ms(since=1) == 60.0
    assert "2 answered, p50 35.0 ms, 1 defaults, 1 refused" == stats.line()


def test_a_warm_up_answered_by_defaults_says_so_and_why() -> None:
    stats = WarmStats()
    for i in range(20):
        stats.add(200, {"default": False, "latency_ms": 10.0})
    stats.add(200, {"default": True, "latency_ms": 50.0, "default_reason": "every model was late: slow: queued"})
    assert stats.worry() is None  # one default in 21: the pipeline answers
    for i in range(4):
        stats.add(200, {"default": True, "latency_ms": 50.0, "default_reason": "every model was late: slow: queued"})
    stats.add(200, {"default": True, "latency_ms": 50.0, "default_reason": "every model failed: flaky: boom"})
    said = stats.worry()
    assert said is not None and said.startswith("warning: 6 of 26 warm-up answers were the app's default"), said
    assert "(most often: every model was late: slow: queued)" in said


def test_first_answers_give_up_at_once_on_a_model_that_fails_and_say_why() -> None:
    from clipstream.warmup import first_answers

    asked: list[int] = []

    def failing(request: httpx.Request) -> httpx.Response:
        asked.append(1)
        return httpx.Response(200, json={"default": True, "models": {"answered": [], "missing": ["m"]},
                                         "default_reason": "every model failed: m: model error: boom"})

    with httpx.Client(transport=httpx.MockTransport(failing), base_url="http://gw") as http:
        t0 = time.monotonic()
        why = first_answers(http, Target("digits", (3,), "float32", 50.0), rounds=5, timeout_s=60.0)
    assert time.monotonic() - t0 < 5.0 and len(asked) == 5
    assert why == "its answers are the default: every model failed: m: model error: boom"

    def loading(request: httpx.Request) -> httpx.Response:
        asked.append(1)
        return httpx.Response(200, json={"default": True, "models": {"answered": [], "missing": ["m"]},
                                         "default_reason": "no answer reached the gateway by the deadline: model m: "
                                                           "no worker has said it has the model loaded"})

    asked.clear()
    with httpx.Client(transport=httpx.MockTransport(loading), base_url="http://gw") as http:
        why = first_answers(http, Target("digits", (3,), "float32", 50.0), rounds=5, timeout_s=0.5)
    assert why is not None and why.startswith("it did not answer in 0s (the last answer: no answer reached")
    assert len(asked) < 20  # paced while the model loads, not a tight loop


def test_each_warm_up_sends_inputs_no_other_run_sends() -> None:
    """A seeded warm-up would fill the cache with what a seeded client sends next."""
    def run() -> set[tuple[float, ...]]:
        sent: set[tuple[float, ...]] = set()

        def handle(request: httpx.Request) -> httpx.Response:
            sent.add(tuple(json.loads(request.content)["input"]))
            return httpx.Response(200, json={"default": False, "latency_ms": 1.0})

        with httpx.Client(transport=httpx.MockTransport(handle), base_url="http://gw") as http:
            steady_load(http, [Target("digits", (4,), "float32", 50.0)], seconds=0.1, callers=2)
        return sent

    first, second = run(), run()
    assert len(first) > 10 and len(second) > 10
    assert not first & second


def test_an_app_whose_query_the_gateway_refuses_as_too_large_is_named_at_once_not_waited_on() -> None:
    from clipstream.warmup import first_answers

    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if "big" in request.url.path:
            return httpx.Response(413, json={"detail": "body of 3000000 bytes is over the limit of 1048576 bytes"})
        return httpx.Response(200, json={"default": False, "latency_ms": 3.0, "models": {"missing": []}})

    with httpx.Client(transport=httpx.MockTransport(handle), base_url="http://gw") as http:
        why = first_answers(http, Target("big", (3,), "float32", 50.0), rounds=5, timeout_s=60.0)
        assert why == "the gateway refused its query (413: body of 3000000 bytes is over the limit of 1048576 bytes)"
        assert len(calls) == 1  # not retried for a minute
        assert first_answers(http, Target("small", (3,), "float32", 50.0), rounds=2, timeout_s=60.0) is None
