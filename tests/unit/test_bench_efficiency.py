"""The efficiency benchmark's ideal-batcher reference (pure: no broker)."""

from __future__ import annotations

from bench.efficiency import ideal_goodput

TABLE = {1: 10.0, 2: 12.0, 4: 16.0}


def test_sparse_arrivals_are_each_served_alone_within_the_slo() -> None:
    assert ideal_goodput([0.0, 1.0, 2.0, 3.0], 50.0, 4, TABLE, 1.0, 0.0, 4.0) == 1.0


def test_a_burst_is_batched_and_what_cannot_finish_is_dropped() -> None:
    # five at once, cap 4: four together (done at 16 ms), then the fifth alone (done at 26 ms)
    assert ideal_goodput([0.0] * 5, 30.0, 4, TABLE, 1.0, 0.0, 1.0) == 5.0
    # a 20 ms SLO: the fifth could not finish before 26 ms, so it is dropped, not served late
    assert ideal_goodput([0.0] * 5, 20.0, 4, TABLE, 1.0, 0.0, 1.0) == 4.0
    # warm-up arrivals do not count
    assert ideal_goodput([0.0, 2.0], 50.0, 4, TABLE, 1.0, 1.0, 3.0) == 0.5
