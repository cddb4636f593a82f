"""Policy state and stored predictions in Redis.

- ``cs:state:<app>:<context or __global__>``: a policy's JSON state. A new context starts from
  the app's global state (Clipper 5.3). Updates are read-modify-write under WATCH/MULTI with
  retry, so two learners updating one context never lose an update.
- ``cs:pred:<query_id>``: the per-model predictions and the answer of a query, with a TTL, for
  the feedback join (feedback arrives seconds to minutes later).
State keys have no TTL and stored predictions do: under ``volatile-lru`` memory pressure evicts
predictions and cache entries, never a context's weights.

Redis is a cache of the weights, not their only home while serving: every state ``load_many``
reads is remembered (a bounded LRU), and ``recall`` answers from that memory while Redis is
away, so queries still get a combined prediction from the last weights seen.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import redis

from selector.types import State

GLOBAL = "__global__"


def state_key(app: str, context: str | None) -> str:
    return f"cs:state:{app}:{context or GLOBAL}"


def pred_key(query_id: str) -> str:
    return f"cs:pred:{query_id}"


class StateStore:
    def __init__(self, client: redis.Redis, predictions_ttl_s: int = 3600, remember: int = 100_000) -> None:
        self.redis = client
        self.ttl_s = predictions_ttl_s
        self._memory: OrderedDict[tuple[str, str | None], State | None] = OrderedDict()
        self._remember = remember  # (app, context) states kept for ``recall``

    def load(self, app: str, context: str | None) -> State | None:
        """The context's state, else the app's global state, else None; one round trip."""
        if not context:
            raw = self.redis.get(state_key(app, None))
            return json.loads(raw) if raw else None
        own, glob = self.redis.mget(state_key(app, context), state_key(app, None))
        raw = own or glob
        return json.loads(raw) if raw else None

    def load_many(self, pairs: Iterable[tuple[str, str | None]]) -> dict[tuple[str, str | None], State | None]:
        """``load`` for many (app, context) pairs at once: one MGET for every distinct key.

        Each pair gets what ``load`` would give it (own state, else the app's global, else None).
        """
        wanted = list(dict.fromkeys((app, context or None) for app, context in pairs))
        if not wanted:
            return {}
        keys = list(dict.fromkeys(k for app, ctx in wanted
                                  for k in ((state_key(app, ctx), state_key(app, None)) if ctx
                                            else (state_key(app, None),))))
        raw = dict(zip(keys, self.redis.mget(keys)))
        out: dict[tuple[str, str | None], State | None] = {}
        for app, ctx in wanted:
            value = (raw.get(state_key(app, ctx)) if ctx else None) or raw.get(state_key(app, None))
            out[(app, ctx)] = json.loads(value) if value else None
        # every app's global state was read too: a context never read falls back to it
        globs = {(app, None): json.loads(g) if (g := raw.get(state_key(app, None))) else None
                 for app, _ in wanted if (app, None) not in out}
        self._keep({**globs, **out})
        return out

    def _keep(self, states: dict[tuple[str, str | None], State | None]) -> None:
        memory = self._memory
        for pair, state in states.items():
            memory[pair] = copy.deepcopy(state)  # callers may change theirs in place
            memory.move_to_end(pair)
        while len(memory) > self._remember:
            memory.popitem(last=False)

    def recall(self, pairs: Iterable[tuple[str, str | None]]) -> dict[tuple[str, str | None], State | None]:
        """What ``load_many`` last read for each pair, without Redis: a context never read gets
        the app's global state if that was read, else None (the policy's initial state)."""
        memory = self._memory
        out: dict[tuple[str, str | None], State | None] = {}
        for app, ctx in pairs:
            pair = (app, ctx or None)
            state = memory.get(pair, memory.get((app, None)))
            out[pair] = copy.deepcopy(state)
        return out

    def update(self, app: str, context: str | None, fn: Callable[[State | None], State]) -> State:
        """Apply ``fn`` to the current state atomically (optimistic: WATCH, MULTI, retry on conflict).

        A context seeded from the global state starts its own ``n_observed`` count at 0.
        """
        key = state_key(app, context)
        glob = state_key(app, None)
        result: dict[str, State] = {}

        def txn(pipe: Any) -> None:
            raw = pipe.get(key)
            current = json.loads(raw) if raw else None
            if current is None and context:
                seed = pipe.get(glob)  # a new context starts from what the app has learned
                if seed:
                    current = dict(json.loads(seed), n_observed=0)
            new = fn(current)
            pipe.multi()
            pipe.set(key, json.dumps(new))
            result["state"] = new

        self.redis.transaction(txn, key)
        return result["state"]

    def save_predictions(self, query_id: str, record: dict[str, Any]) -> None:
        self.redis.set(pred_key(query_id), json.dumps(record), ex=self.ttl_s)

    def load_predictions(self, query_id: str) -> dict[str, Any] | None:
        raw = self.redis.get(pred_key(query_id))
        return json.loads(raw) if raw else None
