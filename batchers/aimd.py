"""AIMD batch sizing for one model replica (Clipper NSDI'17, section 4.3.1).

Clipper finds the largest batch a replica can evaluate within the model's latency objective
by additive increase / multiplicative decrease: grow the maximum batch size by a fixed step
while the measured batch latency stays under the objective; on a miss, back off by 10%.
The back-off is small (not TCP's 50%) because the optimal batch size hardly moves.

Decisions this module makes, so a reader need not guess:

* Rounding of the back-off: ``new = max(1, floor(old * 0.9))``. Flooring (not rounding) makes
  every miss shrink a maximum of 2 or more by at least one (``floor(x * 0.9) <= x - 1`` for
  ``x >= 1``), so small maxima cannot get stuck: 10 -> 9 -> 8, 5 -> 4, 2 -> 1, 1 stays 1.
* Only a *full* batch may grow the maximum. A batch smaller than the maximum that met the
  objective says nothing about whether a larger one would (under light load every batch is
  small, and growing on them would push the maximum far past what was ever measured).
  "Full" means ``batch_size >= ceil(fill * limit)``, where ``limit`` is the maximum the batch
  was formed under (default: the current maximum) and ``fill`` defaults to 1.0 (exactly full).
* Any miss shrinks the maximum, full or not: a partial batch that already misses the objective
  is strong evidence that the maximum is too large.
* A miss from a batch formed under a larger limit than the current maximum does not shrink it
  again: with several batches in flight, one overshoot would otherwise be punished once per
  batch that was already on its way (10 -> 9 -> 8 for a single event).
"""

from __future__ import annotations

import math


class AIMD:
    """Additive-increase / multiplicative-decrease controller of one replica's max batch size."""

    def __init__(
        self,
        objective_us: int,
        step: int = 1,
        cap: int = 256,
        start: int = 1,
        backoff: float = 0.9,
        fill: float = 1.0,
    ) -> None:
        if objective_us <= 0:
            raise ValueError(f"latency objective must be positive, got {objective_us} us")
        if step < 1 or cap < 1:
            raise ValueError(f"step and cap must be >= 1, got step={step} cap={cap}")
        if not 0.0 < backoff < 1.0:
            raise ValueError(f"backoff must be in (0, 1), got {backoff}")
        if not 0.0 < fill <= 1.0:
            raise ValueError(f"fill must be in (0, 1], got {fill}")
        self.objective_us = int(objective_us)
        self.step = int(step)
        self.cap = int(cap)
        self.backoff = float(backoff)
        self.fill = float(fill)
        self._max = min(self.cap, max(1, int(start)))
        self.increases = 0
        self.decreases = 0

    @property
    def max_batch_size(self) -> int:
        """The largest batch this replica may be sent now."""
        return self._max

    def observe(self, batch_size: int, service_us: int, limit: int | None = None) -> int:
        """Feed one batch's measured service time; returns the new maximum batch size.

        ``limit`` is the maximum the batch was formed under, if the caller remembers it
        (the dispatcher does); without it the current maximum stands in.
        """
        if batch_size < 1:
            return self._max
        formed_under = self._max if limit is None else max(1, int(limit))
        if service_us > self.objective_us:
            if formed_under > self._max:
                return self._max  # already backed off since this batch was formed
            new = max(1, math.floor(self._max * self.backoff))
            if new < self._max:
                self.decreases += 1
            self._max = new
            return self._max
        full = batch_size >= math.ceil(self.fill * formed_under)
        if full:
            new = min(self.cap, self._max + self.step)
            if new > self._max:
                self.increases += 1
            self._max = new
        return self._max

    def retune(self, objective_us: int, cap: int) -> None:
        """A new latency objective and cap (the registry's, changed while serving): the batch
        size learnt so far stays, within the new cap."""
        if objective_us <= 0 or cap < 1:
            raise ValueError(f"need a positive objective and a cap >= 1, got {objective_us} us and {cap}")
        self.objective_us, self.cap = int(objective_us), int(cap)
        self._max = min(self._max, self.cap)

    def __repr__(self) -> str:
        return f"AIMD(max={self._max}, objective_us={self.objective_us}, step={self.step}, cap={self.cap})"
