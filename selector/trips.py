"""Quantiles of recent trips, which the selector learns from what it measures rather than
from settings: the reply's trip (``selector.reply_budget``) and each model's trip from dispatch
to its prediction back here (``ModelTrips``). No Kafka here; the selector feeds both.
"""

from __future__ import annotations

import math
from collections import deque


def nearest_rank(ranked: list[int], quantile: float) -> int:
    """The smallest of ``ranked`` (sorted, not empty) with at least ``quantile`` of them at or below it."""
    return ranked[max(0, math.ceil(quantile * len(ranked)) - 1)]


class RecentQuantile:
    """A quantile of the last ``window`` observations, recomputed every ``every`` of them
    rather than on each one: it is read once per query, and sorting the window each time
    would cost more than the answer itself. ``value`` is None until the first observation."""

    def __init__(self, quantile: float, window: int = 256, every: int = 16) -> None:
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        if window < 1 or every < 1:
            raise ValueError("window and every must be at least 1")
        self.quantile = quantile
        self._seen: deque[int] = deque(maxlen=window)
        self._every, self._since = every, 0
        self.value: int | None = None

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, x: int) -> None:
        self._seen.append(x)
        self._since += 1
        if self._since >= self._every or len(self._seen) < self._every:
            self._since = 0
            self.value = nearest_rank(sorted(self._seen), self.quantile)


class ModelTrips:
    """Each model's trips of the last ``horizon_us``, from dispatch to its prediction back at
    the selector.

    A query with less time left than a quantile of a model's trips (the median, by default: its
    typical trip) will likely not have that model's prediction in time. Asked anyway, under
    overload, its request takes a place in the batcher's queue and the worker's batches only to
    come back after the answer, or to expire there: work and Kafka crossings for nothing, which
    make the queries behind it late too. Clipper answers at the deadline with what arrived; a
    model that is hopeless before it is asked is not asked. Predictions that came after their
    answer count too (they are trips the pipeline made).

    The window is one of time, not of count: a backlog's slow trips leave it ``horizon_us``
    after they came, however few trips follow them, so a skip made in a slow moment ends soon
    after the pipeline is quick again. With fewer than ``min_trips`` in the window the model is
    asked, so skipping it cannot starve the learning that would end the skip. ``quantile`` 0
    asks every model.
    """

    def __init__(self, quantile: float = 0.5, horizon_us: int = 1_000_000, min_trips: int = 16,
                 every: int = 16, most: int = 4096) -> None:
        if not 0.0 <= quantile < 1.0:
            raise ValueError(f"quantile must be in [0, 1), got {quantile}")
        if horizon_us < 1 or min_trips < 1 or every < 1:
            raise ValueError("horizon_us, min_trips and every must be at least 1")
        self.quantile, self.horizon_us, self.min_trips, self.every = quantile, horizon_us, min_trips, every
        self.most = most  # trips kept per model at the most, whatever the rate
        self._trips: dict[str, deque[tuple[int, int]]] = {}  # model -> (arrived, trip) in arrival order
        self._typical: dict[str, int] = {}
        self._changed: dict[str, int] = {}  # trips added or dropped since the quantile was taken

    def observe(self, model: str, trip_us: int, now_us: int) -> None:
        if self.quantile <= 0 or trip_us < 0:
            return
        trips = self._trips.get(model)
        if trips is None:
            trips = self._trips[model] = deque(maxlen=self.most)
        trips.append((now_us, trip_us))
        self._changed[model] = self._changed.get(model, 0) + 1

    def typical_us(self, model: str, now_us: int) -> int | None:
        """The model's quantile of the trips in the window, or None while it holds too few.

        The quantile is taken again once ``every`` trips came or left, not on each query: it is
        read once per query, and sorting the window each time would cost more than the answer.
        """
        trips = self._trips.get(model)
        if trips is None:
            return None
        oldest = now_us - self.horizon_us
        while trips and trips[0][0] < oldest:
            trips.popleft()
            self._changed[model] += 1
        if len(trips) < self.min_trips:
            self._typical.pop(model, None)
            return None
        if self._changed[model] >= self.every or model not in self._typical:
            self._typical[model] = nearest_rank(sorted(trip for _, trip in trips), self.quantile)
            self._changed[model] = 0
        return self._typical[model]

    def hopeless(self, model: str, left_us: int, now_us: int) -> bool:
        """True when ``left_us`` is shorter than the model's quantile of recent trips."""
        typical = self.typical_us(model, now_us)
        return typical is not None and left_us < typical
