"""Policy state and stored predictions in Redis.

- ``cs:state:<app>:<context or __global__>``: a policy's JSON state. A new context starts from
  the app's global state (Clipper 5.3). Updates are read-modify-write under WATCH/MULTI with
  retry, so two learners updating one context never lose an update.
- ``cs:pred:<query_id>``: the per-model predictions and the answer of a query, with a TTL, for
  the feedback join (feedback arrives seconds to minutes later).
- ``cs:seen:<query_id>``: the (state key, model) pairs a query's feedback was applied to, with
  the stored predictions' TTL: feedback is applied once per (query_id, model), however often
  it is sent (docs/design/0031).
- ``cs:contexts:<app>``: the app's context states by last update; past ``max_contexts`` the
  oldest are deleted. A context's state key also has a TTL, renewed by each update, so the
  contexts callers name cannot grow Redis without bound. The app's global state has no TTL:
  under ``volatile-lru`` memory pressure evicts predictions, cache entries and idle contexts,
  never what the app as a whole has learned.

Redis is a cache of the weights, not their only home while serving: every state ``load_many``
reads is remembered (a bounded LRU), and ``recall`` answers from that memory while Redis is
away, so queries still get a combined prediction from the last weights seen. ``fresh`` answers
from it too while every state asked for was read recently enough: a bandit's weights move only
with feedback, so a read made a moment ago serves as well as a new round trip (docs/design/0054).
"""

from __future__ import annotations

import copy
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import redis

from clipstream.redisclient import contexts_key, policy_state_key, stored_predictions_key
from selector.types import State


def state_key(app: str, context: str | None) -> str:
    return policy_state_key(app, context)


def pred_key(query_id: str) -> str:
    return stored_predictions_key(query_id)


def seen_key(query_id: str) -> str:
    return f"cs:seen:{query_id}"


class StateStore:
    def __init__(self, client: redis.Redis, predictions_ttl_s: int = 3600, remember: int = 100_000,
                 context_ttl_s: int = 30 * 86400, max_contexts: int = 100_000) -> None:
        self.redis = client
        self.ttl_s = predictions_ttl_s
        self.context_ttl_s = context_ttl_s
        self.max_contexts = max_contexts
        # (app, context) -> (when it was read or learnt here, its state), least recent first
        self._memory: OrderedDict[tuple[str, str | None], tuple[float, State | None]] = OrderedDict()
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
        memory, now = self._memory, time.monotonic()
        for pair, state in states.items():
            memory[pair] = (now, copy.deepcopy(state))  # callers may change theirs in place
            memory.move_to_end(pair)
        while len(memory) > self._remember:
            memory.popitem(last=False)

    def fresh(self, pairs: Iterable[tuple[str, str | None]],
              max_age_s: float) -> dict[tuple[str, str | None], State | None] | None:
        """``recall``, when every pair's state was read (or written here) within ``max_age_s``;
        None when one was not, or ``max_age_s`` is 0: then Redis must be asked."""
        if max_age_s <= 0:
            return None
        pairs = [(app, ctx or None) for app, ctx in pairs]
        oldest = time.monotonic() - max_age_s
        memory = self._memory
        if any(pair not in memory or memory[pair][0] < oldest for pair in pairs):
            return None
        return self.recall(pairs)

    def recall(self, pairs: Iterable[tuple[str, str | None]]) -> dict[tuple[str, str | None], State | None]:
        """What ``load_many`` last read for each pair, without Redis: a context never read gets
        the app's global state if that was read, else None (the policy's initial state)."""
        memory = self._memory
        out: dict[tuple[str, str | None], State | None] = {}
        for app, ctx in pairs:
            pair = (app, ctx or None)
            _, state = memory.get(pair) or memory.get((app, None)) or (0.0, None)
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
        self._keep({(app, context or None): result["state"]})  # this process sees its own update at once
        return result["state"]

    def observe_once(self, app: str, context: str | None, query_id: str, models: Iterable[str],
                     fn: Callable[[State | None, list[str]], State]) -> list[str]:
        """Apply ``fn(state, models)`` for the ``models`` whose feedback for ``query_id`` this
        state has not had yet, atomically with marking them had; returns those models (empty:
        a repeat, nothing changed). A context's state gets the context TTL and joins the app's
        capped set of contexts."""
        key, glob, seen = state_key(app, context), state_key(app, None), seen_key(query_id)
        models = list(models)
        result: dict[str, Any] = {"applied": []}

        def txn(pipe: Any) -> None:
            had = {m.decode() if isinstance(m, bytes) else m for m in pipe.smembers(seen)}
            todo = [m for m in models if f"{key}|{m}" not in had]
            result["applied"] = todo
            if not todo:
                return
            raw = pipe.get(key)
            current = json.loads(raw) if raw else None
            if current is None and context:
                seed = pipe.get(glob)
                if seed:
                    current = dict(json.loads(seed), n_observed=0)
            new = fn(current, todo)
            result["state"] = new
            pipe.multi()
            pipe.set(key, json.dumps(new), ex=self.context_ttl_s if context else None)
            pipe.sadd(seen, *(f"{key}|{m}" for m in todo))
            pipe.expire(seen, self.ttl_s)
            if context:
                pipe.zadd(contexts_key(app), {context: time.time()})

        self.redis.transaction(txn, key, seen)
        if result["applied"]:
            self._keep({(app, context or None): result["state"]})  # this process sees its own update at once
            if context:
                self._cap_contexts(app)
        return result["applied"]

    def _cap_contexts(self, app: str) -> None:
        """Delete the least recently updated contexts past ``max_contexts``."""
        ckey = contexts_key(app)
        excess = int(self.redis.zcard(ckey)) - self.max_contexts
        if excess <= 0:
            return
        oldest = self.redis.zpopmin(ckey, excess)
        names = [c.decode() if isinstance(c, bytes) else c for c, _ in oldest]
        if names:
            self.redis.delete(*(state_key(app, c) for c in names))

    def save_predictions(self, query_id: str, record: dict[str, Any]) -> None:
        self.redis.set(pred_key(query_id), json.dumps(record), ex=self.ttl_s)

    def load_predictions(self, query_id: str) -> dict[str, Any] | None:
        raw = self.redis.get(pred_key(query_id))
        return json.loads(raw) if raw else None
