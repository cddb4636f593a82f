"""The gateway's admission limit: AIMD on predictions in flight (clock injected)."""

from __future__ import annotations

import pytest

from frontend.admission import AdmissionLimit


def test_answers_in_time_raise_the_limit_by_one_per_limits_worth() -> None:
    a = AdmissionLimit(initial=4, floor=2, ceiling=100)
    for _ in range(4):
        a.on_time()
    # 4 + 1/4 + 1/4.25 + 1/4.485 + 1/4.708 ~= 4.92: about one per window of four answers
    assert 4.9 < a.limit < 4.95 and a.admits(3) and not a.admits(4)


def test_only_a_query_admitted_after_the_last_cut_cuts_again() -> None:
    a = AdmissionLimit(initial=50, floor=4, ceiling=100, backoff=0.9)
    a.late(1_000_000, admitted_us=950_000)
    assert a.limit == pytest.approx(45.0)
    a.late(1_010_000, admitted_us=990_000)  # let in under the old limit: says nothing new
    assert a.limit == pytest.approx(45.0) and a.cuts == 1
    a.late(1_060_000, admitted_us=1_001_000)
    assert a.limit == pytest.approx(40.5) and a.cuts == 2


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
