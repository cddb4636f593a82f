"""The coalescing of identical cache misses (Clipper section 4.2); the key is
``clipstream.cachekey``'s.

Coalescing is Clipper's non-blocking *request*: the first miss for a key asks for the
evaluation; identical misses that arrive while it is queued or running wait for that one
result instead of occupying batch slots of their own. No Kafka or Redis here.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from clipstream.cachekey import KEY_PREFIX, NO_VERSION, cache_key, input_digest

__all__ = ["KEY_PREFIX", "NO_VERSION", "Coalescer", "cache_key", "input_digest"]

T = TypeVar("T")


class Coalescer(Generic[T]):
    """Groups requests for the same cache key behind one evaluation.

    ``join`` says whether the caller must get the prediction evaluated (it is the first
    pending request for the key, the *leader*) or may simply wait (a *waiter*). When the
    prediction is known, ``resolve`` hands back every waiter; when the leader's evaluation
    is abandoned (expired, worker lost), ``abandon`` hands the waiters back so one of them
    can lead a new evaluation.

    Waiters ride on the leader's place in the deadline queue. Requests of one app share an
    SLO, so a later identical request has a later deadline and loses nothing by waiting;
    a waiter whose deadline is earlier than the leader's is the rare case this accepts.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, list[T]] = {}

    def __len__(self) -> int:
        """Number of keys with an evaluation pending."""
        return len(self._waiters)

    def __contains__(self, key: str) -> bool:
        return key in self._waiters

    def join(self, key: str, item: T) -> bool:
        """True: ``item`` leads (enqueue it); False: it waits for the pending evaluation."""
        waiters = self._waiters.get(key)
        if waiters is None:
            self._waiters[key] = []
            return True
        waiters.append(item)
        return False

    def waiting(self, key: str) -> int:
        """How many requests wait on ``key`` (the leader not counted)."""
        return len(self._waiters.get(key, ()))

    def resolve(self, key: str) -> list[T]:
        """The evaluation for ``key`` is done: forget the key and return its waiters."""
        return self._waiters.pop(key, [])

    def abandon(self, key: str) -> list[T]:
        """The leader will not be evaluated: forget the key; the waiters must re-join."""
        return self._waiters.pop(key, [])
