"""A stage that turns away much of its work says so, over a window, at most once a minute."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchers.latency import LatencyModel
from topics.saturation import Saturation


def test_a_high_share_turned_away_over_a_window_alerts_once_a_minute() -> None:
    s = Saturation(window_s=10, share=0.1, least=20, every_s=60)
    assert s.check("a", 0, 0, 0) is None  # the window starts
    assert s.check("a", 5, 500, 200) is None  # not a whole window yet
    assert s.check("a", 10, 1000, 350) == 0.35
    assert s.check("a", 20, 2000, 700) is None  # as bad, but alerted 10 s ago
    assert s.check("a", 70, 3000, 1050) == 0.35  # a minute on, still at it
    assert s.check("b", 70, 0, 0) is None  # each key on its own


def test_a_low_share_or_a_handful_says_nothing() -> None:
    s = Saturation(window_s=10, share=0.1, least=20, every_s=60)
    s.check("a", 0, 0, 0)
    assert s.check("a", 10, 1000, 50) is None  # 5%
    assert s.check("a", 20, 1010, 60) is None  # 10 of 10 refused: too few to say
    assert s.check("a", 30, 1010, 60) is None  # nothing at all


def _gateway_says(monkeypatch: Any, capsys: Any, count: Callable[[Any], None]) -> str:
    """What the gateway's watcher prints once ``count(state)`` has counted a window's queries
    of app ``pets`` (its first window starts at nothing); "" if nothing within 2 s."""
    import asyncio

    import frontend.state as gateway_state
    from tests.unit.test_gateway_http import FakeBus, answer, make_app

    state = make_app(FakeBus(answer)).state.gateway
    monkeypatch.setattr(gateway_state, "Saturation", lambda **kw: Saturation(window_s=0.05, share=0.1, least=20))
    state.metrics.app("pets")  # counted from nothing: the watcher's first window starts there

    async def run() -> str:
        watch = asyncio.create_task(state.watch_saturation(every_s=0.01))
        try:
            await asyncio.sleep(0.03)
            count(state)
            for _ in range(200):
                await asyncio.sleep(0.01)
                err = capsys.readouterr().err
                if err:
                    return err
            return ""
        finally:
            watch.cancel()

    return asyncio.run(run())


def test_the_gateway_says_when_an_apps_queries_are_refused_in_numbers(monkeypatch, capsys) -> None:
    def count(state: Any) -> None:
        queries, _, _, refused, _ = state.metrics.app("pets")
        queries.inc(100)
        refused.inc(40)

    said = _gateway_says(monkeypatch, capsys, count)
    assert said.startswith("alert: gateway: app pets: 40% of its queries were refused (503)"), said
    assert "add replicas of m1 (clipstream set-replicas m1 N)" in said, said


def test_refusals_and_defaults_while_kafka_is_away_blame_kafka_not_capacity(monkeypatch, capsys) -> None:
    def refused(state: Any) -> None:
        state.reach.observe(False, 0.0)
        state.reach.observe(False, 1.0)  # two checks found no broker: queries are refused
        queries, _, _, refused, _ = state.metrics.app("pets")
        queries.inc(100)
        refused.inc(40)

    said = _gateway_says(monkeypatch, capsys, refused)
    assert said.startswith("alert: gateway: app pets: 40% of its queries were refused (503)"), said
    assert "cannot reach Kafka" in said and "set-replicas" not in said, said

    def timed_out(state: Any) -> None:
        state.reach.observe(False, 0.0)  # the last check found no broker
        queries, predictions, defaults, _, _ = state.metrics.app("pets")
        queries.inc(100)
        predictions.inc(70)
        defaults.inc(30)
        state.metrics.defaults.inc("gateway_timeout", by=30)

    said = _gateway_says(monkeypatch, capsys, timed_out)
    assert "this gateway's last check found no Kafka broker" in said and "add replicas" not in said, said


def test_a_batcher_says_when_it_gives_up_many_requests(capsys) -> None:
    from types import SimpleNamespace

    from batchers.app import _say_if_saturated

    s = Saturation(window_s=0.0, share=0.1, least=20)
    fast, slow = LatencyModel(), LatencyModel()
    for took_us in (20_000, 150_000, 160_000):
        fast.observe(1, took_us // 10)
        slow.observe(1, took_us)
    replicas = [SimpleNamespace(service_us=m.median_us) for m in (fast, slow, LatencyModel())]
    svc = SimpleNamespace(counts={"requests": 0, "expired": 0}, core=SimpleNamespace(dispatcher=SimpleNamespace(
        replicas=replicas)))
    _say_if_saturated(s, "strag", svc)  # type: ignore[arg-type]
    svc.counts.update(requests=1000, expired=581)
    _say_if_saturated(s, "strag", svc)  # type: ignore[arg-type]
    said = capsys.readouterr().err
    assert said.startswith("alert: batcher: model strag: 58% of its requests were given up or expired"), said
    assert "clipstream set-replicas strag N" in said
    # the advice turns on how long one call takes: the alert says it
    assert "its batches took 150.0 ms lately, the median on its slowest replica" in said, said


def test_the_gateway_says_when_an_apps_callers_get_its_default_in_numbers(monkeypatch, capsys) -> None:
    def count(state: Any) -> None:
        queries, predictions, defaults, _, _ = state.metrics.app("pets")
        queries.inc(100)
        predictions.inc(75)
        defaults.inc(25)
        state.metrics.defaults.inc("not_loaded", by=20)
        state.metrics.defaults.inc("selector", by=5)

    said = _gateway_says(monkeypatch, capsys, count)
    assert said.startswith("alert: gateway: app pets: 25% of its queries were answered with its default output"), said
    assert "refused" not in said  # no capacity alert: nothing was refused
    assert said.rstrip().endswith("most of this gateway's defaults: no worker has a model loaded: `clipstream inspect` "
                                  "names it, and why"), said
