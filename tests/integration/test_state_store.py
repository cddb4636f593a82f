"""The learner's compare-and-set on a real Redis: no update lost between learners, each
(query, model) applied once per state, and one round trip per feedback for a learner alone."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import redis

from selector.store import StateStore, seen_key, state_key


class CountingRedis(redis.Redis):
    """A real client that counts the commands it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return super().execute_command(*args, **options)


def bump(state: dict | None, models: list[str]) -> dict:
    return {"n_observed": (state or {}).get("n_observed", 0) + len(models)}


def count(client: Any, key: str) -> int:
    return json.loads(client.get(key))["n_observed"]


def test_a_learner_working_from_an_old_state_loses_no_update(redis_client: Any) -> None:
    app = f"cas{uuid.uuid4().hex[:6]}"
    a, b = StateStore(redis_client), StateStore(redis_client)
    assert a.observe_once(app, None, "q1", ["m1"], bump) == ["m1"]
    assert b.observe_once(app, None, "q2", ["m1"], bump) == ["m1"]  # a's last write is now old
    assert a.observe_once(app, None, "q3", ["m1"], bump) == ["m1"]
    assert count(redis_client, state_key(app, None)) == 3
    # a feedback sent again, to the learner that did not apply it: nothing changes
    assert b.observe_once(app, None, "q1", ["m1"], bump) == []
    assert b.observe_once(app, None, "q1", ["m1", "m2"], bump) == ["m2"]
    assert count(redis_client, state_key(app, None)) == 4
    assert redis_client.smembers(seen_key("q1")) == {f"{state_key(app, None)}|m1".encode(),
                                                     f"{state_key(app, None)}|m2".encode()}


def test_learners_at_once_on_one_state_apply_every_feedback_once(redis_client: Any, infra: Any) -> None:
    app = f"cas{uuid.uuid4().hex[:6]}"
    learners, each = 4, 25
    applied: list[list[str]] = []
    barrier = threading.Barrier(learners)

    def learn(n: int) -> None:
        client = redis.Redis.from_url(infra.redis_url)
        store = StateStore(client)
        barrier.wait()
        for i in range(each):
            applied.append(store.observe_once(app, "ctx", f"{app}-q{i}", [f"m{n}"], bump))
            applied.append(store.observe_once(app, "ctx", f"{app}-q{i}", [f"m{n}"], bump))  # a repeat
        client.close()

    threads = [threading.Thread(target=learn, args=(n,)) for n in range(learners)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert sum(1 for a in applied if a) == learners * each and sum(1 for a in applied if not a) == learners * each
    assert count(redis_client, state_key(app, "ctx")) == learners * each


def test_a_new_context_starts_from_the_global_state_with_a_count_of_its_own(redis_client: Any) -> None:
    app = f"cas{uuid.uuid4().hex[:6]}"
    redis_client.set(state_key(app, None), json.dumps({"n_observed": 7, "log_w": [0.5, -0.5]}))
    store = StateStore(redis_client, context_ttl_s=120)
    seen: list[dict | None] = []

    def keep(state: dict | None, models: list[str]) -> dict:
        seen.append(state)
        return bump(state, models)

    assert store.observe_once(app, "user-1", "q1", ["m1"], keep) == ["m1"]
    assert seen == [{"n_observed": 0, "log_w": [0.5, -0.5]}]
    assert count(redis_client, state_key(app, "user-1")) == 1 and 0 < redis_client.ttl(state_key(app, "user-1")) <= 120
    assert redis_client.zscore(f"cs:contexts:{app}", "user-1") is not None
    # its state expired (or was evicted) under this learner: it starts again from the global one
    redis_client.delete(state_key(app, "user-1"))
    assert store.observe_once(app, "user-1", "q2", ["m1"], keep) == ["m1"]
    assert count(redis_client, state_key(app, "user-1")) == 1


def test_a_learner_alone_writes_in_one_round_trip_and_survives_a_script_flush(infra: Any) -> None:
    app = f"cas{uuid.uuid4().hex[:6]}"
    client = CountingRedis.from_url(infra.redis_url)
    try:
        store = StateStore(client)
        store.observe_once(app, None, "q0", ["m1"], bump)  # its first read of the state
        client.sent.clear()
        for i in range(1, 6):
            assert store.observe_once(app, None, f"{app}-q{i}", ["m1", "m2"], bump) == ["m1", "m2"]
        assert client.sent == ["EVALSHA"] * 5, client.sent
        client.script_flush()  # as after a restart of Redis
        assert store.observe_once(app, None, f"{app}-q6", ["m1"], bump) == ["m1"]
        assert count(client, state_key(app, None)) == 12
    finally:
        client.close()
