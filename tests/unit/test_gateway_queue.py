"""The gateway's wait for an admission slot (docs/design/0089): at the limit a caller waits a
share of its SLO, first come first served, and a slot freed in that time is handed to it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from clipstream.settings import Settings
from frontend.admission import verdict
from frontend.gateway_http import HTTPProblem
from frontend.settings import GatewaySettings
from frontend.state import GatewayState


def _state(**gw: Any) -> GatewayState:
    gw.setdefault("adaptive_admission", False)
    gw.setdefault("max_inflight", 2)
    return GatewayState(GatewaySettings(instance="unit", **gw), Settings(topic_prefix="t."))


def test_a_caller_at_the_limit_gets_the_next_slot_freed_first_come_first_served() -> None:
    async def run() -> tuple[list[str], GatewayState]:
        state, order = _state(), []
        await state.admit("a", 100.0)
        await state.admit("a", 100.0)  # the limit of two reached

        async def caller(name: str) -> None:
            before, waited_ms = await state.admit("a", 100.0)
            order.append(name)
            assert before == 1 and waited_ms > 0  # the slot was taken for it, one other in flight

        first = asyncio.create_task(caller("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(caller("second"))
        await asyncio.sleep(0)
        assert state.waiting == 2 and not order
        state.release()  # one answer: its slot goes to the first caller waiting, not to a newcomer
        await first
        assert order == ["first"] and state.inflight == 2 and state.waiting == 1
        state.release()
        await second
        return order, state

    order, state = asyncio.run(run())
    assert order == ["first", "second"] and (state.inflight, state.waiting) == (2, 0)


def test_no_slot_within_the_share_of_the_slo_is_a_503_that_says_how_long_it_waited() -> None:
    async def run() -> tuple[HTTPProblem, float, GatewayState]:
        state = _state(admission_queue_share=0.2)
        await state.admit("a", 100.0)
        await state.admit("a", 100.0)
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(HTTPProblem) as info:
            await state.admit("a", 100.0)
        return info.value, loop.time() - began, state

    problem, took_s, state = asyncio.run(run())
    assert problem.status == 503 and "no slot freed within 20 ms" in problem.detail
    assert 0.018 <= took_s < 1.0 and (state.inflight, state.waiting) == (2, 0)
    assert "clipstream_gateway_overload_rejections_total 1.0" in state.metrics.render()  # once


def test_with_no_share_the_limit_refuses_at_once() -> None:
    async def run() -> HTTPProblem:
        state = _state(admission_queue_share=0.0, max_inflight=1)
        await state.admit("a", 1000.0)
        with pytest.raises(HTTPProblem) as info:
            await asyncio.wait_for(state.admit("a", 1000.0), 0.5)  # never waits for the 1 s SLO
        return info.value

    problem = asyncio.run(run())
    assert problem.status == 503 and "no slot" not in problem.detail


def test_a_caller_gone_while_waiting_holds_no_slot_even_when_one_came_as_it_went() -> None:
    async def run() -> GatewayState:
        state = _state(max_inflight=1)
        await state.admit("a", 1000.0)
        gone = asyncio.create_task(state.admit("a", 1000.0))
        await asyncio.sleep(0)
        gone.cancel()  # the client hung up: its wait ends, and nothing is handed to it
        with pytest.raises(asyncio.CancelledError):
            await gone
        state.release()
        assert (state.inflight, state.waiting) == (0, 0)

        await state.admit("a", 1000.0)
        racing = asyncio.create_task(state.admit("a", 1000.0))
        await asyncio.sleep(0)
        state.release()  # a slot handed over ...
        racing.cancel()  # ... in the same turn as its caller goes away: given back, not leaked
        with pytest.raises(asyncio.CancelledError):
            await racing
        return state

    state = asyncio.run(run())
    assert (state.inflight, state.waiting) == (0, 0)


def test_a_waiting_caller_is_let_in_when_the_learnt_limit_grows() -> None:
    async def run() -> tuple[int, GatewayState]:
        state = _state(adaptive_admission=True, admission_initial=2, admission_floor=2, max_inflight=100)
        await state.admit("a", 1000.0)
        await state.admit("a", 1000.0)
        waiter = asyncio.create_task(state.admit("a", 1000.0))
        await asyncio.sleep(0)
        on_time = {"latency_ms": 5.0, "default": False, "models": {"missing": []}}
        for _ in range(4):  # answers in time with the limit in use: it grows past two
            state.observe("a", on_time, False, 0, inflight=1, slo_ms=1000.0)
        before, _ = await asyncio.wait_for(waiter, 0.5)
        return before, state

    before, state = asyncio.run(run())
    assert state.limit == 3 and before == 2 and state.inflight == 3


def test_the_wait_for_a_slot_is_not_counted_as_the_pipeline_being_slow() -> None:
    answer = {"latency_ms": 45.0, "default": False, "models": {"missing": []}}
    assert verdict(answer, False, 50.0, 0.8) == "slow"
    assert verdict(answer, False, 50.0, 0.8, waited_ms=20.0) == "on_time"  # 25 ms in the pipeline
    late = {**answer, "latency_ms": 51.0}
    assert verdict(late, False, 50.0, 0.8, waited_ms=20.0) == "late"  # the caller's SLO still rules


def test_a_caller_waits_no_longer_than_the_apps_recent_answers_leave_room_for() -> None:
    """Under a lasting overload the answers take most of the SLO: a wait would only make the
    caller's answer late, so its 503 comes at once; another app's answers say nothing of it."""
    async def run() -> tuple[float, float, str]:
        state = _state(max_inflight=1, admission_queue_share=0.5)
        slow = {"latency_ms": 75.0, "default": False, "models": {"missing": []}}
        for _ in range(20):  # the app's answers took 70 ms of its 100 lately (5 of them waiting)
            state.observe("busy", slow, False, 0, inflight=0, slo_ms=100.0, waited_ms=5.0)
        await state.admit("busy", 100.0)
        loop = asyncio.get_running_loop()
        waits = []
        for app in ("busy", "idle"):
            began = loop.time()
            with pytest.raises(HTTPProblem) as info:
                await state.admit(app, 100.0)
            waits.append(loop.time() - began)
        return waits[0], waits[1], info.value.detail

    busy_s, idle_s, detail = asyncio.run(run())
    assert busy_s < 0.02  # 80 - 70 = 10 ms before the slow band
    assert idle_s >= 0.045  # the idle app's callers still wait half its SLO
    assert "no slot freed within 50 ms" in detail


def test_recent_times_keep_a_high_quantile_of_a_window() -> None:
    from frontend.admission import RecentTimes

    times = RecentTimes(window=10, quantile=0.9, every=5)
    for ms in (1.0, 2.0, 3.0):
        times.add(ms)
    assert times.value == 3.0  # while still few, each answer counts at once
    for _ in range(10):
        times.add(10.0)
    for _ in range(9):
        times.add(1.0)
    assert times.value == 10.0  # as of the 20th answer, three slow ones of its last ten
    for _ in range(3):
        times.add(1.0)
    assert times.value == 1.0  # the 25th: the slow ones out of the window
