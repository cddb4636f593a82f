"""Stored predictions for the feedback join, written off the answer path.

Whoever answers a query (the selector's join, or the gateway for a query its model answered
straight, docs/design/0083) answers the caller first and stores what it answered for
``selector.learn`` after.
A thread writes them (a pipeline per group), so a slow or frozen Redis never holds up an
answer; while Redis is away the records wait here, bounded, and go out once it is back, so
feedback on queries answered during an outage can still be joined.

The thread gathers for ``gather_s`` after the first record of a group, and ``put`` wakes it
only when the queue was empty: one wake-up and one Redis round trip serve every query answered
meanwhile, not each on its own. Feedback that comes before its query is stored is retried by
the learner, so the short wait costs no feedback.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from typing import Any

import redis

from clipstream.redisclient import REDIS_AWAY, RedisGuard, stored_predictions_key

log = logging.getLogger(__name__)

# how long a group gathers by default, in the selector (``CLIPSTREAM_SELECTOR_SAVE_GATHER_MS``)
# and in the gateway alike
GATHER_S = 0.25


class PredictionSaver:
    """A bounded queue of stored predictions and the thread that writes them to Redis."""

    def __init__(self, client: redis.Redis, ttl_s: int, guard: RedisGuard, capacity: int = 100_000,
                 group_max: int = 500, gather_s: float = 0.02) -> None:
        self.client, self.ttl_s, self.guard, self.gather_s = client, ttl_s, guard, gather_s
        self._queue: deque[tuple[int, str, str]] = deque()  # (seq, query id, JSON)
        self._seq = 0
        self._capacity, self._group_max = capacity, group_max
        self._cond = threading.Condition()
        self._stop = False
        self.stats = {"saved": 0, "dropped": 0, "failed_writes": 0}
        self._thread = threading.Thread(target=self._run, name="save-predictions", daemon=True)

    def start(self) -> PredictionSaver:
        self._thread.start()
        return self

    def put(self, query_id: str, record: dict[str, Any]) -> None:
        """Queue one query's record; when full, the oldest is dropped (its feedback will find
        nothing to join and be dead-lettered after the learner's wait)."""
        value = json.dumps(record)
        with self._cond:
            if len(self._queue) >= self._capacity:
                self._queue.popleft()
                self.stats["dropped"] += 1
            self._seq += 1
            self._queue.append((self._seq, query_id, value))
            if len(self._queue) == 1:  # the writer waits only on an empty queue
                self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (if Redis answers within ``timeout_s``) and stop the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if not self._queue:
                    return
                if self.gather_s > 0 and not self._stop:
                    self._cond.wait(self.gather_s)  # the group grows; only ``close`` cuts it short
                group = [self._queue[i] for i in range(min(self._group_max, len(self._queue)))]
            if not self.guard.available():
                if self._stop:
                    return  # Redis is away and we are stopping: nothing more to do
                self.guard.wait_available(0.5)
                continue
            try:
                pipe = self.client.pipeline(transaction=False)
                for _, query_id, value in group:
                    pipe.set(stored_predictions_key(query_id), value, ex=self.ttl_s)
                pipe.execute()
            except REDIS_AWAY as exc:  # kept: written once Redis is back
                self.stats["failed_writes"] += 1
                self.guard.failed(exc)
                continue
            except Exception:  # a command error would fail again: drop the group, keep serving
                log.exception("storing %d predictions failed", len(group))
            last = group[-1][0]
            with self._cond:  # ``put`` may have dropped some of the group meanwhile
                while self._queue and self._queue[0][0] <= last:
                    self._queue.popleft()
                self.stats["saved"] += len(group)
