"""Policy state and stored predictions in Redis.

- ``cs:state:<app>:<context or __global__>``: a policy's JSON state. A new context starts from
  the app's global state (Clipper 5.3). Updates are read-modify-write under WATCH/MULTI with
  retry, so two learners updating one context never lose an update.
- ``cs:pred:<query_id>``: the per-model predictions and the answer of a query, with a TTL, for
  the feedback join (feedback arrives seconds to minutes later).
State keys have no TTL and stored predictions do: under ``volatile-lru`` memory pressure evicts
predictions and cache entries, never a context's weights.
"""

from __future__ import annotations

import json
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
    def __init__(self, client: redis.Redis, predictions_ttl_s: int = 3600) -> None:
        self.redis = client
        self.ttl_s = predictions_ttl_s

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
