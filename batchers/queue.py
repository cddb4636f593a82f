"""Earliest-deadline-first queue of one model's pending requests.

Queueing belongs in the batcher, not in Kafka: here it is ordered by deadline (the request
that must be answered first is batched first) and a request whose deadline has passed is
dropped and handed back as expired, so the caller can report it instead of losing it.

Ties on the deadline are broken by arrival order (FIFO), so equal-SLO traffic is served
in the order it came. The queue also remembers each entry's arrival time, because delayed
batching (section 4.3.2) measures its wait from the oldest queued request's arrival, which
is not the head of an EDF heap.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(order=True)
class _Entry(Generic[T]):
    deadline_us: int
    seq: int
    arrival_us: int = field(compare=False)
    item: T = field(compare=False)


class DeadlineQueue(Generic[T]):
    """EDF queue; ``deadline`` extracts an item's absolute deadline (epoch us)."""

    def __init__(self, deadline: Callable[[T], int] = lambda item: item.deadline_us) -> None:  # type: ignore[attr-defined]
        self._deadline = deadline
        self._heap: list[_Entry[T]] = []
        self._seq = itertools.count()
        # seq -> arrival of every queued entry, in arrival order (dicts keep insertion order)
        self._arrivals: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, item: T, arrival_us: int = 0) -> None:
        """Queue ``item``; ``arrival_us`` is when the batcher received it (for delayed batching)."""
        seq = next(self._seq)
        heapq.heappush(self._heap, _Entry(int(self._deadline(item)), seq, int(arrival_us), item))
        self._arrivals[seq] = int(arrival_us)

    @property
    def next_deadline(self) -> int | None:
        """The earliest deadline queued, or None when empty."""
        return self._heap[0].deadline_us if self._heap else None

    def latest_deadlines(self, n: int) -> list[int]:
        """The ``n`` latest deadlines queued, latest first: whether ``k`` requests can still
        make a given time is whether the k-th of these is after it."""
        return heapq.nlargest(n, (e.deadline_us for e in self._heap))

    @property
    def oldest_arrival(self) -> int | None:
        """Arrival time of the request that has waited longest, or None when empty."""
        for arrival in self._arrivals.values():
            return arrival
        return None

    def _pop(self) -> _Entry[T]:
        entry = heapq.heappop(self._heap)
        del self._arrivals[entry.seq]
        return entry

    def expire(self, now_us: int) -> list[T]:
        """Remove and return every request whose deadline is at or before ``now_us``.

        In an EDF heap the expired entries are exactly those at the front, so this is
        O(k log n) for k expired requests.
        """
        out: list[T] = []
        while self._heap and self._heap[0].deadline_us <= now_us:
            out.append(self._pop().item)
        return out

    def take(self, n: int, now_us: int, weight: Callable[[T], int] | None = None,
             budget: int | None = None) -> tuple[list[T], list[T]]:
        """Up to ``n`` live requests, earliest deadline first, and the expired ones dropped.

        A request counts as expired when ``deadline_us <= now_us``: it cannot be answered
        in time, so evaluating it would only steal batch space from requests that can.
        With a ``budget``, the requests' ``weight`` adds up to at most that, though the first
        is taken whatever its weight; the rest wait for the next batch.
        """
        expired = self.expire(now_us)
        batch: list[T] = []
        used = 0
        while self._heap and len(batch) < n:
            if budget is not None and weight is not None:
                used += weight(self._heap[0].item)
                if batch and used > budget:
                    break
            batch.append(self._pop().item)
        return batch, expired

    def drain(self) -> list[T]:
        """Everything still queued, earliest deadline first (used at shutdown)."""
        out = [self._pop().item for _ in range(len(self._heap))]
        return out
