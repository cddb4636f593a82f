"""The reply budget: how long before a query's deadline the straggler cutoff fires.

An answer made at the deadline still has a trip to make (the selector's producer to the broker,
the broker to the caller's consumer), so it reaches the caller after the SLO by that much. A
fixed margin is wrong both ways: on a quiet machine the trip takes a millisecond and a large
margin cuts off predictions that would have counted; on a busy one (every Kafka hop waits for
CPU behind the fan-out of newer queries) the trip's tail is several times longer and the answer
lands late. So the budget follows the trip as measured: the broker acknowledges every Response,
and the time from produce to that acknowledgement (there and back, to the broker) stands in for
the trip to the caller (there, and a fetch back). An answer made by the cutoff timer also counts
how late the selector's loop served the timer: on a busy machine the loop gets the CPU late,
and the caller waits for that as much as for the trip. The budget is a high quantile of the
recent trips, kept between a floor and a cap; no Kafka here, the selector feeds it.
"""

from __future__ import annotations

from selector.trips import RecentQuantile


class ReplyBudget:
    """A high quantile of recent reply trips, clamped to ``[floor_us, cap_us]``.
    ``cap_us <= floor_us`` fixes the budget at ``floor_us``."""

    def __init__(self, floor_us: int, cap_us: int, quantile: float = 0.95, window: int = 256,
                 every: int = 16) -> None:
        self._trips = RecentQuantile(quantile, window, every)
        self.floor_us, self.cap_us = int(floor_us), max(int(floor_us), int(cap_us))
        self.quantile = quantile
        self._us = self.floor_us

    @property
    def adaptive(self) -> bool:
        return self.cap_us > self.floor_us

    @property
    def us(self) -> int:
        """The budget now, in microseconds."""
        return self._us

    def observe(self, trip_us: int) -> None:
        """One acknowledged reply took ``trip_us`` from when it was due to the broker's ack. One thread
        observes (the selector's reply-acks thread); ``us`` may be read from any."""
        if not self.adaptive or trip_us < 0:
            return
        self._trips.observe(trip_us)
        self._us = min(self.cap_us, max(self.floor_us, self._trips.value or 0))
