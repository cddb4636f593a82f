"""How many predictions the gateway lets into the pipeline at once: AIMD on concurrency.

Under overload every stage queues, every query becomes late and the pipeline answers nobody
in time; callers are better served by a quick 503 for the excess than by a default after the
SLO. The right number in flight is (by Little's law) the rate the pipeline sustains times
its latency, which nobody configures, so it is learnt the way Clipper learns a batch size:
each answer in time raises the limit a little (by one per limit's worth of answers), an
answer that came late or empty because the pipeline was behind cuts it by a fraction. As in
TCP, only a query admitted after the last cut can cause the next one: the late answers of
queries let in under the old limit say nothing about the new one, and counting them would
drive the limit to its floor. Two refinements keep the limit near what the pipeline really
carries. The limit grows only while it is in use (a query admitted with at least half the
limit already in flight), as TCP validates its window (RFC 7661): at light load nothing tests
a higher limit, and one learnt idle would let a sudden overload flood the pipeline for many
round trips before the cuts caught up. And the gateway also reports an answer that came in time
but slowly (past a fraction of the SLO) as late: queueing shows in latency before it shows in
missed deadlines, and cutting then leaves the deadlines some slack. Pure: the gateway passes
the clock.
"""

from __future__ import annotations


class AdmissionLimit:
    """An additive-increase / multiplicative-decrease limit on predictions in flight."""

    def __init__(self, initial: float = 16.0, floor: float = 4.0, ceiling: float = 4096.0,
                 backoff: float = 0.9) -> None:
        if not 0 < floor <= initial <= ceiling or not 0 < backoff < 1:
            raise ValueError("need 0 < floor <= initial <= ceiling and 0 < backoff < 1")
        self.limit, self.floor, self.ceiling = float(initial), float(floor), float(ceiling)
        self.backoff = backoff
        self._last_cut_us: int | None = None
        self.cuts = 0

    def admits(self, inflight: int) -> bool:
        return inflight < int(self.limit)

    def on_time(self, inflight_at_admission: int | None = None) -> None:
        """An answer the models made in time: the pipeline kept up with this many in flight.

        ``inflight_at_admission``: how many were in flight when this query was let in; the
        limit grows only if that was at least half of it (None: assume it was in use).
        """
        if inflight_at_admission is not None and inflight_at_admission + 1 < self.limit / 2:
            return
        self.limit = min(self.ceiling, self.limit + 1.0 / self.limit)

    def late(self, now_us: int, admitted_us: int) -> None:
        """An answer the pipeline did not make in time (no reply, or nothing arrived by the
        deadline) for a query admitted at ``admitted_us``: too much in flight."""
        if self._last_cut_us is not None and admitted_us <= self._last_cut_us:
            return
        self._last_cut_us = now_us
        self.limit = max(self.floor, self.limit * self.backoff)
        self.cuts += 1
