"""The reply budget: how long before a query's deadline the straggler cutoff fires.

An answer made at the deadline still has a trip to make (the selector's producer to the broker,
the broker to the caller's consumer), so it reaches the caller after the SLO by that much. A
fixed margin is wrong both ways: on a quiet machine the trip takes a millisecond and a large
margin cuts off predictions that would have counted; on a busy one (every Kafka hop waits for
CPU behind the fan-out of newer queries) the trip's tail is several times longer and the answer
lands late. So the budget follows the trip as measured, from two sides:

- the broker acknowledges every Response; the time from produce to that acknowledgement, plus
  how late the selector's loop served the cutoff timer, is the selector's half of the trip;
- every query crossed the same broker the other way, from the caller's producer to the
  selector's loop; that crossing also holds what the acknowledgement never sees: a fetch
  back and a consumer waiting for the CPU to wake up and read it.

The budget is a high quantile of either, whichever is longer, kept between a floor and a cap,
and for each query at most a share of its SLO (a budget that ate the SLO would leave the
models no time). No Kafka here: the selector feeds it.
"""

from __future__ import annotations

from selector.trips import RecentQuantile


class ReplyBudget:
    """A high quantile of recent reply trips and query crossings, clamped to ``[floor_us,
    cap_us]``, and per query to ``max_share`` of its SLO. ``cap_us <= floor_us`` fixes the
    budget at ``floor_us``."""

    def __init__(self, floor_us: int, cap_us: int, quantile: float = 0.95, window: int = 256,
                 every: int = 16, max_share: float = 1.0) -> None:
        if not 0.0 < max_share <= 1.0:
            raise ValueError(f"max_share must be in (0, 1], got {max_share}")
        self._trips = RecentQuantile(quantile, window, every)
        self._crossings = RecentQuantile(quantile, window, every)
        self.floor_us, self.cap_us = int(floor_us), max(int(floor_us), int(cap_us))
        self.quantile, self.max_share = quantile, max_share
        self._us = self.floor_us

    @property
    def adaptive(self) -> bool:
        return self.cap_us > self.floor_us

    @property
    def us(self) -> int:
        """The budget now, in microseconds."""
        return self._us

    def for_slo(self, slo_us: int) -> int:
        """The budget for a query of ``slo_us``: at most ``max_share`` of it, never under the floor."""
        return max(self.floor_us, min(self._us, int(self.max_share * slo_us)))

    def observe(self, trip_us: int) -> None:
        """One acknowledged reply took ``trip_us`` from when it was due to the broker's ack. One thread
        observes (the selector's reply-acks thread); ``us`` may be read from any."""
        self._observe(self._trips, trip_us)

    def observe_crossing(self, crossing_us: int) -> None:
        """One query took ``crossing_us`` from its producer to the selector's loop (the loop's
        thread observes)."""
        self._observe(self._crossings, crossing_us)

    def _observe(self, series: RecentQuantile, us: int) -> None:
        if not self.adaptive or us < 0:
            return
        before = series.value
        series.observe(us)
        if series.value != before:  # the quantile is recomputed every few observations only
            learnt = max(self._trips.value or 0, self._crossings.value or 0)
            self._us = min(self.cap_us, max(self.floor_us, learnt))
