"""The gateway's admission limit: AIMD on predictions in flight (clock injected)."""

from __future__ import annotations

import heapq
import random
from typing import Any

import pytest

from frontend.admission import AdmissionLimit, verdict
from schemas.reasons import NOTHING_ARRIVED


def test_answers_in_time_raise_the_limit_by_one_per_limits_worth() -> None:
    a = AdmissionLimit(initial=4, floor=2, ceiling=100)
    for _ in range(4):
        a.on_time()
    # 4 + 1/4 + 1/4.25 + 1/4.485 + 1/4.708 ~= 4.92: about one per window of four answers
    assert 4.9 < a.limit < 4.95 and a.admits(3) and not a.admits(4)


def test_one_bad_answer_never_cuts_a_share_of_a_limits_worth_does() -> None:
    a = AdmissionLimit(initial=16, floor=4, ceiling=100, backoff=0.9)
    for t in range(1, 13):
        a.on_time(inflight_at_admission=8, admitted_us=t)
    assert not a.late(100, admitted_us=13)  # one pause, one late answer: a hiccup
    for t in range(14, 17):
        a.on_time(inflight_at_admission=8, admitted_us=t)
    assert a.cuts == 0
    # a quarter of the last limit's worth (16) late: the pipeline is behind
    assert [a.late(200 + t, admitted_us=200 + t) for t in range(3)] == [False, False, True]
    assert a.cuts == 1 and a.limit == pytest.approx(0.9 * (16 + sum_growth(12 + 3)), rel=1e-3)


def test_only_a_query_admitted_after_the_last_cut_cuts_again() -> None:
    a = AdmissionLimit(initial=8, floor=4, ceiling=100, backoff=0.9)
    a.late(1_000_000, admitted_us=950_000)
    assert a.late(1_000_100, admitted_us=950_100)  # 2 of a window of 8
    assert a.limit == pytest.approx(7.2)
    for t in range(10):  # let in under the old limit: says nothing about the new one
        assert not a.late(1_010_000 + t, admitted_us=990_000 + t)
    assert a.cuts == 1
    a.late(1_060_000, admitted_us=1_001_000)
    assert a.late(1_060_100, admitted_us=1_001_100)
    assert a.limit == pytest.approx(6.48) and a.cuts == 2
    assert a.cut(1_060_200, admitted_us=1_060_150)  # the loop's own evidence: at once
    assert not a.cut(1_060_300, admitted_us=1_060_150)  # the same stall


def test_the_limit_stays_between_floor_and_ceiling() -> None:
    a = AdmissionLimit(initial=5, floor=4, ceiling=6)
    for t in range(10):
        a.late(t + 1, admitted_us=t + 1)
    assert a.limit == 4.0 and a.admits(3) and not a.admits(4)
    for _ in range(1000):
        a.on_time()
    assert a.limit == 6.0
    with pytest.raises(ValueError):
        AdmissionLimit(initial=1, floor=4)


def test_the_limit_grows_only_while_it_is_in_use() -> None:
    a = AdmissionLimit(initial=16, floor=4, ceiling=100)
    for _ in range(100):
        a.on_time(inflight_at_admission=2)  # light load: a limit of 16 was never tested
    assert a.limit == 16.0
    a.on_time(inflight_at_admission=7)  # 7 + 1 of 16: half the limit in use
    assert a.limit == pytest.approx(16 + 1 / 16)


def test_below_its_initial_value_the_limit_regrows_at_light_load() -> None:
    a = AdmissionLimit(initial=16, floor=4, ceiling=100)
    for t in range(40):  # an old overload left it at the floor
        a.late(t + 1, admitted_us=t + 1)
    assert a.limit == 4.0
    for _ in range(200):
        a.on_time(inflight_at_admission=1)  # light load: one or two in flight
    assert a.limit == pytest.approx(16.0, abs=0.1)  # back to the start, and no further untested


def sum_growth(n: int, start: float = 16.0) -> float:
    """What ``n`` answers in time add to a limit of ``start`` (each adds one over the limit)."""
    limit = start
    for _ in range(n):
        limit += 1 / limit
    return limit - start


def said(latency_ms: float, missing: tuple[str, ...] = (), default: bool = False,
         reason: str | None = None) -> dict[str, Any]:
    """The caller's JSON, as far as ``verdict`` reads it."""
    answered = [] if default else ["m1", "m2", "m3"]
    return {"default": default, "default_reason": reason, "latency_ms": latency_ms,
            "models": {"answered": answered, "missing": list(missing)}}


def test_what_an_answer_says_about_load() -> None:
    v = lambda answer, timed_out=False: verdict(answer, timed_out, slo_ms=100.0, slow_fraction=0.6)  # noqa: E731
    assert v(said(96.0, missing=("slow",))) == "on_time"  # the straggler cutoff, predictions in hand
    assert v(said(12.0)) == "on_time"
    assert v(said(70.0)) == "slow"  # every model answered, yet slowly: queueing
    assert v(said(101.0, missing=("slow",))) == "late"  # after the SLO, cutoff or not
    assert v(said(99.0, default=True, reason=NOTHING_ARRIVED)) == "late"
    assert v(said(105.0, default=True, reason="timeout"), timed_out=True) == "late"
    assert v(said(3.0, default=True, reason="every model failed: m1: boom")) is None  # not load


def test_by_default_a_complete_answer_is_slow_only_in_the_last_fifth_of_its_slo() -> None:
    """At 300-600 q/s on two cores a tail of answers lands at 30-40 ms of a 50 ms SLO; counted
    as queueing, those refused callers whose answers would have been in time (docs/design/0074)."""
    from frontend.settings import GatewaySettings

    share = GatewaySettings().admission_slow_fraction
    assert verdict(said(38.0), False, 50.0, share) == "on_time"
    assert verdict(said(42.0), False, 50.0, share) == "slow"


def test_straggler_cutoff_answers_never_lower_the_limit() -> None:
    a, t = AdmissionLimit(initial=4, floor=4, ceiling=100), 0
    for i in range(300):  # 4 callers; 30% of the answers made at the cutoff, 96 of 100 ms
        t += 1000
        answer = said(96.0, missing=("slow",)) if i % 10 < 3 else said(8.0)
        assert verdict(answer, False, 100.0, 0.6) == "on_time"
        a.on_time(inflight_at_admission=3, admitted_us=t)
    assert a.cuts == 0 and a.admits(3)


def test_empty_and_late_answers_lower_the_limit() -> None:
    a, t = AdmissionLimit(initial=32, floor=4, ceiling=100), 0
    for answer in [said(99.0, default=True, reason=NOTHING_ARRIVED), said(130.0, missing=("m3",))] * 40:
        t += 1000
        if verdict(answer, False, 100.0, 0.6) == "late":
            a.late(t, admitted_us=t - 500)
    assert a.cuts >= 4 and a.limit < 32 * 0.9 ** 4 + 1e-9


def test_light_load_with_single_late_answers_keeps_the_limit_above_what_is_in_use() -> None:
    """200 q/s of Poisson arrivals, 20 ms answers, one in a hundred late or slow (a pause),
    simulated for 60 s: nothing is refused and the limit stays above the peak in flight."""
    rng = random.Random(7)
    a = AdmissionLimit(initial=16, floor=4, ceiling=4096)
    t, done, inflight, peak, refused = 0, [], 0, 0, 0  # done: (finish_us, admitted_us, verdict, in flight then)
    while t < 60_000_000:
        t += int(rng.expovariate(200.0) * 1e6)
        while done and done[0][0] <= t:
            finish, admitted, kind, at_admission = heapq.heappop(done)
            inflight -= 1
            if kind == "on_time":
                a.on_time(inflight_at_admission=at_admission, admitted_us=admitted)
            else:
                a.late(finish, admitted) if kind == "late" else a.slow(finish, admitted)
        if not a.admits(inflight):
            refused += 1
            continue
        inflight, at_admission = inflight + 1, inflight
        peak = max(peak, inflight)
        roll = rng.random()
        kind, ms = ("late", 55.0) if roll < 0.01 else ("slow", 35.0) if roll < 0.02 else ("on_time", rng.uniform(8, 30))
        heapq.heappush(done, (t + int(ms * 1000), t, kind, at_admission))
    assert refused == 0 and a.limit > peak
