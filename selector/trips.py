"""Quantiles of recent trips, which the selector learns from what it measures rather than
from settings: the reply's trip (``selector.reply_budget``) and each model's trip from dispatch
to its prediction back here (``ModelTrips``). No Kafka here; the selector feeds both.
"""

from __future__ import annotations

import math
from collections import deque


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
            ranked = sorted(self._seen)
            # nearest rank: the smallest value with at least ``quantile`` of the window at or below it
            self.value = ranked[max(0, math.ceil(self.quantile * len(ranked)) - 1)]


class ModelTrips:
    """Each model's recent trips, from dispatch to its prediction back at the selector.

    A query with less time left than a quantile of a model's trips (the median, by default: its
    typical trip) will likely not have that model's prediction in time. Asked anyway, under
    overload, its request takes a place in the batcher's queue and the worker's batches only to
    come back after the answer, or to expire there: work and Kafka crossings for nothing, which
    make the queries behind it late too. Clipper answers at the deadline with what arrived; a
    model that is hopeless before it is asked is not asked. Predictions that came after their
    answer count too (they are trips the pipeline made), and a model unheard of for
    ``stale_us`` has its trips forgotten and is asked again until it has ``min_trips`` new ones,
    so skipping it cannot starve the learning that would end the skip. ``quantile`` 0 asks every model.
    """

    def __init__(self, quantile: float = 0.5, window: int = 256, every: int = 16, min_trips: int = 16,
                 stale_us: int = 2_000_000) -> None:
        if not 0.0 <= quantile < 1.0:
            raise ValueError(f"quantile must be in [0, 1), got {quantile}")
        self.quantile, self.window, self.every = quantile, window, every
        self.min_trips, self.stale_us = min_trips, stale_us
        self._trips: dict[str, RecentQuantile] = {}
        self._heard_us: dict[str, int] = {}

    def observe(self, model: str, trip_us: int, now_us: int) -> None:
        if self.quantile <= 0 or trip_us < 0:
            return
        trips = self._trips.get(model)
        if trips is None:
            trips = self._trips[model] = RecentQuantile(self.quantile, self.window, self.every)
        trips.observe(trip_us)
        self._heard_us[model] = now_us

    def typical_us(self, model: str, now_us: int) -> int | None:
        """The model's quantile of recent trips, or None while it is unknown or stale. Stale
        trips are forgotten: one new trip must not revive a window full of old ones, or a
        skip made in a slow moment would go on after the pipeline is quick again."""
        trips = self._trips.get(model)
        if trips is None:
            return None
        if now_us - self._heard_us[model] > self.stale_us:
            del self._trips[model], self._heard_us[model]
            return None
        return trips.value if len(trips) >= self.min_trips else None

    def hopeless(self, model: str, left_us: int, now_us: int) -> bool:
        """True when ``left_us`` is shorter than the model's quantile of recent trips."""
        typical = self.typical_us(model, now_us)
        return typical is not None and left_us < typical
