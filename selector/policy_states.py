"""How the join thread gets the policy states it selects with: one read per poll group, waited
for only briefly, so that a slow or absent Redis is served from the store's memory rather than
holding back the answers due meanwhile."""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from clipstream.redisclient import REDIS_AWAY, RedisGuard
from selector.kafka import log
from selector.store import StateStore
from selector.types import State

# a group's policy states are read from Redis in about a millisecond; the join thread never
# waits longer than this for them, so a frozen Redis cannot hold back the answers due meanwhile
STATE_WAIT_S = 0.02


class PolicyStates:
    """The policy-state half of ``Selector``, which sets these attributes."""

    store: StateStore
    guard: RedisGuard
    state_wait_s: float
    state_fresh_s: float
    stats: dict[str, int]
    _state_reader: ThreadPoolExecutor | None
    _state_read: Future[Any] | None

    def states(self, pairs: list[tuple[str, str | None]]) -> dict[tuple[str, str | None], State | None]:
        """The policy states of ``pairs``: those read within ``state_fresh_s`` from memory, else
        one MGET while Redis answers, else (and when that MGET fails) the last states read, so a
        query still gets a combined prediction."""
        fresh = self.store.fresh(pairs, self.state_fresh_s)
        if fresh is not None:
            return fresh
        if self.guard.available() and self._state_read is None:
            if self._state_reader is None:
                self._state_reader = ThreadPoolExecutor(1, thread_name_prefix="selector-states")
            read = self._state_reader.submit(self.store.load_many, pairs)
            try:
                return read.result(timeout=self.state_wait_s)
            except FutureTimeout:  # it lands in memory when it ends; this group is served from memory
                self._state_read = read
                read.add_done_callback(self._state_read_done)
            except REDIS_AWAY as exc:
                self.guard.failed(exc)
            except Exception:  # a bad entry, say: serve from memory rather than fail the group
                log.exception("loading policy states for %d queries failed", len(pairs))
        self.stats["recalled_states"] += len(pairs)
        return self.store.recall(pairs)

    def _state_read_done(self, read: Future[Any]) -> None:
        exc = read.exception()
        if isinstance(exc, REDIS_AWAY):
            self.guard.failed(exc)
        elif exc is not None:
            log.warning("loading policy states failed: %s", exc)
        self._state_read = None

    def _stored_state(self, app: str, context: str | None,
                      states: dict[tuple[str, str | None], State | None] | None) -> State | None:
        """One query's stored state: from ``states`` (its poll group's) when they hold it, else
        read for it alone."""
        pair = (app, context or None)
        if states is None or pair not in states:
            return self.states([pair])[pair]
        return copy.deepcopy(states[pair])  # each query its own dict, as a load gives it
