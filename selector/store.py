"""Policy state and stored predictions in Redis.

- ``cs:state:<app>:<context or __global__>``: a policy's JSON state. A new context starts from
  the app's global state (Clipper 5.3). Updates are read-modify-write with a compare-and-set
  and retry, so two learners updating one context never lose an update.
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
from functools import cached_property
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


UNREAD = object()  # a state key this process has neither read nor written

# ``observe_once``'s write, done only when the state is still what the learner computed from and
# none of the (state, model) pairs was had yet; else it answers with what is there.
# KEYS: state, seen, contexts, global state. ARGV: "unread" | "value" | "absent", the value
# computed from, the new value, the state's TTL (0: none), seen's TTL, the context ("": none),
# now, then the seen members to add. Answers {1, contexts count} or {0, state, global, seen}.
OBSERVE = """
local current = redis.call('GET', KEYS[1])
local fresh = (ARGV[1] == 'value' and current == ARGV[2]) or (ARGV[1] == 'absent' and not current)
for i = 8, #ARGV do
  if not fresh then break end
  fresh = redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 0
end
if not fresh then
  return {0, current, redis.call('GET', KEYS[4]), redis.call('SMEMBERS', KEYS[2])}
end
if ARGV[4] ~= '0' then
  redis.call('SET', KEYS[1], ARGV[3], 'EX', ARGV[4])
else
  redis.call('SET', KEYS[1], ARGV[3])
end
redis.call('SADD', KEYS[2], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[2], ARGV[5])
if ARGV[6] == '' then
  return {1, 0}
end
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[6])
return {1, redis.call('ZCARD', KEYS[3])}
"""


def _seeded(raw: Any, seed: bytes | None, context: str | None) -> State | None:
    """A state read as ``raw``; a context's state never written starts from the app's global
    one (``seed``) with a count of its own (Clipper 5.3)."""
    if raw:
        return json.loads(raw)
    if context and seed:
        return dict(json.loads(seed), n_observed=0)
    return None


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
        # state key -> its value as this process last read or wrote it: what ``observe_once``
        # compares against, least recent first
        self._written: OrderedDict[str, bytes] = OrderedDict()

    @cached_property
    def _observe(self) -> Any:
        """``OBSERVE``, sent by its digest once Redis has it (redis-py loads it again after a
        restart of Redis)."""
        return self.redis.register_script(OBSERVE)

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

    def observe_once(self, app: str, context: str | None, query_id: str, models: Iterable[str],
                     fn: Callable[[State | None, list[str]], State]) -> list[str]:
        """Apply ``fn(state, models)`` for the ``models`` whose feedback for ``query_id`` this
        state has not had yet, atomically with marking them had; returns those models (empty:
        a repeat, nothing changed). A context's state gets the context TTL and joins the app's
        capped set of contexts.

        A compare-and-set (``OBSERVE``): the state this process last read or wrote is taken as
        the current one, so a learner alone on a state writes in one round trip; when another
        wrote since, Redis answers with what is there and the update is made again on that.
        """
        key, glob, seen = state_key(app, context), state_key(app, None), seen_key(query_id)
        models = list(models)
        current, seed, had = self._written.get(key, UNREAD), None, set[str]()
        while True:
            todo = [m for m in models if f"{key}|{m}" not in had]
            if not todo:
                return []
            new = None if current is UNREAD else fn(_seeded(current, seed, context), todo)
            mode = "unread" if current is UNREAD else "value" if current else "absent"
            reply = self._observe(keys=[key, seen, contexts_key(app), glob], args=[
                mode, current if isinstance(current, bytes) else b"", b"" if new is None else json.dumps(new),
                self.context_ttl_s if context else 0, self.ttl_s, context or "", time.time(),
                *(f"{key}|{m}" for m in todo)])
            if reply[0] == 1:
                break
            _, current, seed, members = reply  # another wrote since, or never read here: what is there
            had = {m.decode() if isinstance(m, bytes) else m for m in members}
            if current:
                self._remember_written(key, current)
        self._remember_written(key, json.dumps(new).encode())
        self._keep({(app, context or None): new})  # this process sees its own update at once
        if context and int(reply[1]) > self.max_contexts:
            self._cap_contexts(app, int(reply[1]) - self.max_contexts)
        return todo

    def _remember_written(self, key: str, raw: bytes) -> None:
        written = self._written
        written[key] = raw
        written.move_to_end(key)
        while len(written) > self._remember:
            written.popitem(last=False)

    def _cap_contexts(self, app: str, excess: int) -> None:
        """Delete the ``excess`` least recently updated contexts."""
        oldest = self.redis.zpopmin(contexts_key(app), excess)
        names = [c.decode() if isinstance(c, bytes) else c for c, _ in oldest]
        if names:
            self.redis.delete(*(state_key(app, c) for c in names))
        for name in names:
            self._written.pop(state_key(app, name), None)

    def save_predictions(self, query_id: str, record: dict[str, Any]) -> None:
        self.redis.set(pred_key(query_id), json.dumps(record), ex=self.ttl_s)

    def load_predictions(self, query_id: str) -> dict[str, Any] | None:
        raw = self.redis.get(pred_key(query_id))
        return json.loads(raw) if raw else None
