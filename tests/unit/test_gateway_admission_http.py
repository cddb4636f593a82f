"""The gateway's admission over HTTP, with an injected registry and a fake bus: the 503 at the
limit and the wait for a slot, and what cuts the learnt limit (a late event loop, slow answers).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from fastapi.testclient import TestClient

from clipstream.settings import Settings
from frontend.settings import GatewaySettings
from registry.topic import AppConfig, RegistryView
from tests.unit.test_gateway_http import GOOD, FakeBus, FakeRegistry, answer, make_app


def test_overload_is_503_with_retry_after():
    app = make_app(FakeBus(reply=None), max_inflight=1, retry_after_s=2)

    async def two_at_once() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            send = lambda: c.post("/v1/apps/pets/predict", json={"input": GOOD, "slo_ms": 200})
            return list(await asyncio.gather(send(), send()))

    statuses = sorted((r.status_code, r.headers.get("retry-after")) for r in asyncio.run(two_at_once()))
    assert statuses == [(200, None), (503, "2")]


def test_a_caller_at_the_limit_is_answered_when_a_slot_frees_within_its_wait():
    """The pets app's SLO is 30 ms: the second caller may wait 15 ms, and the first answer frees
    its slot after 5 (docs/design/0089)."""
    app = make_app(FakeBus(answer, after_ms=5.0), max_inflight=1, adaptive_admission=False)

    async def two_at_once() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            send = lambda: c.post("/v1/apps/pets/predict", json={"input": GOOD})
            return list(await asyncio.gather(send(), send()))

    replies = asyncio.run(two_at_once())
    assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
    assert {r.json()["output"] for r in replies} == {"dog"}


def _admission_limit(c: TestClient) -> float:
    from bench.admission import limit_in

    return limit_in(c.get("/metrics").text)


def _cuts(metrics_text: str, cause: str) -> float:
    """``clipstream_gateway_admission_cuts_total`` for one cause (0 before its first cut)."""
    from bench.admission import cuts_in

    return cuts_in(metrics_text).get(cause, 0.0)


def test_a_late_loop_cuts_the_limit_in_use_once_per_interval():
    from frontend.state import LAG_CUT_EVERY_US, GatewayState

    state = GatewayState(GatewaySettings(instance="unit"), Settings(topic_prefix="t."))
    state.cut_for_lag(1_000_000)  # nothing in flight: an idle gateway's hiccup
    assert (state.admission.cuts, state.limit) == (0, 16)
    state.inflight = 8  # half the limit in use
    state.cut_for_lag(2_000_000)
    assert (state.admission.cuts, state.limit) == (1, 14)  # 16 * 0.9
    state.cut_for_lag(2_000_000 + LAG_CUT_EVERY_US - 1)  # the same stall, still
    assert state.admission.cuts == 1
    state.cut_for_lag(2_000_000 + LAG_CUT_EVERY_US + 1)
    assert (state.admission.cuts, state.limit) == (2, 12)  # 14.4 * 0.9 = 12.96
    assert (_cuts(state.metrics.render(), "loop"), _cuts(state.metrics.render(), "slow")) == (2, 0)
    with TestClient(make_app(adaptive_admission=False)) as c:
        fixed = c.app.state.gateway
        fixed.inflight = fixed.limit
        fixed.cut_for_lag(5_000_000)
        assert fixed.admission.cuts == 0


def test_a_late_loop_is_judged_against_each_apps_slo_and_cuts_for_the_tightest():
    from frontend.state import GatewayState

    class Apps:  # a 150 ms ensemble alone, then beside a 50 ms app
        slos = [150.0]

        def view(self) -> RegistryView:
            return RegistryView(apps={f"a{i}": AppConfig(f"a{i}", "single", slo, 0.0, {}, ("m1",))
                                      for i, slo in enumerate(self.slos)})

    state = GatewayState(GatewaySettings(instance="unit"), Settings(topic_prefix="t."))
    state.registry = Apps()  # type: ignore[assignment]
    state.inflight = 16  # the limit in use
    for t in range(3):
        state.tick(12.0, 1_000_000 + t * 100_000)  # 12 ms late, three times in a row
    assert state.late_for(50.0) and state.late_for(None)  # past 5 ms: a 50 ms SLO's callers wait
    assert not state.late_for(150.0) and state.admission.cuts == 0  # within 15 ms: room left
    state.tick(16.0, 1_400_000)
    state.tick(16.0, 1_500_000)
    state.tick(16.0, 1_600_000)
    assert state.late_for(150.0) and state.admission.cuts == 2  # past 15 ms: cut, once per interval
    Apps.slos = [150.0, 50.0]
    state.tick(12.0, 1_700_000)  # 16 then 12 ms late: within 15 ms, but not 5
    assert state.admission.cuts == 3  # late for the 50 ms app, which shares the limit


def test_a_late_loop_refuses_the_callers_of_a_tight_slo_and_serves_those_of_a_long_one():
    registry = FakeRegistry()
    registry._view.apps["slow"] = AppConfig("slow", "exp4", 150.0, "unknown", {}, ("m1",))  # 15 ms of lag allowed
    app = make_app(registry=registry, max_loop_lag_ms=5.0)
    state = app.state.gateway
    state.watch_loop_lag = asyncio.Event().wait  # no watcher: the lags are the test's to set
    state.lags.extend([12.0, 12.0, 12.0])  # the last three wake-ups, 12 ms late
    with TestClient(app) as c:
        r = c.post("/v1/apps/pets/predict", json={"input": GOOD})  # SLO 30 ms: 5 ms allowed
        assert r.status_code == 503 and "event loop" in r.json()["detail"], r.text
        r = c.post("/v1/apps/slow/predict", json={"input": GOOD})
        assert r.status_code == 200 and r.json()["default"] is False, r.text


def test_the_loop_watcher_parks_while_nothing_is_in_flight_and_ticks_while_something_is():
    from frontend.state import GatewayState

    state = GatewayState(GatewaySettings(instance="unit"), Settings(topic_prefix="t."))

    async def until(cond: Any, timeout_s: float = 5.0) -> None:
        end = time.monotonic() + timeout_s
        while not cond():
            assert time.monotonic() < end, "condition not met within the deadline"
            await asyncio.sleep(0.001)

    async def scenario() -> None:
        watcher = asyncio.create_task(state.watch_loop_lag(every_s=0.002))
        try:
            await asyncio.sleep(0.05)  # 25 ticks' worth of idle
            assert state.lag_ticks == 0
            assert state.hold() == 0  # the first prediction let in wakes it
            await until(lambda: state.lag_ticks >= 3)
            assert state.hold() == 1
            state.inflight -= 2  # both answered
            await until(lambda: state._busy.is_set() is False)
            parked_at = state.lag_ticks
            await asyncio.sleep(0.05)
            assert state.lag_ticks == parked_at
            assert (state.late_for(None), state.loop_lag_ms) == (False, 0.0)
        finally:
            watcher.cancel()

    asyncio.run(scenario())


def test_slow_answers_cut_the_admission_limit_but_one_does_not_and_an_idle_limit_does_not_grow():
    # app SLO 30 ms: an answer after 22 ms, every model in hand, is in time but past a slow
    # fraction of 0.6 (queueing); one is a pause, a quarter of a limit's worth (4 of 16) is not
    with TestClient(make_app(FakeBus(answer, after_ms=22), admission_slow_fraction=0.6)) as c:
        r = c.post("/v1/apps/pets/predict", json={"input": GOOD})
        assert r.status_code == 200 and r.json()["default"] is False
        assert _admission_limit(c) == 16
        for _ in range(3):
            assert c.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 200
        assert _admission_limit(c) == 14  # int(16 * 0.9): the gauge shows whole requests
        assert _cuts(c.get("/metrics").text, "slow") == 1
    with TestClient(make_app(FakeBus(answer))) as c:  # quick answers, one at a time
        for _ in range(50):
            assert c.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 200
        assert _admission_limit(c) == 16.0
