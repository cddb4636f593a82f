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


def test_a_removed_model_is_taken_out_of_every_apps_states_and_learnt_afresh(redis_client: Any) -> None:
    """``remove-model``: deployed again, its versions start at 1, and an old version 1's weight
    (kept for a rollback) must not come back with the new model."""
    from clipstream.redisclient import forget_model_weights, policy_state_key
    from selector.policies import Exp3, align_state

    tag = uuid.uuid4().hex[:6]
    flip, app = f"flip{tag}", f"probe{tag}"
    glob, ctx = policy_state_key(app, None), policy_state_key(app, "u1")
    state = {"policy": "exp3", "models": ["good", flip], "log_w": [0.0, -9.0], "n_observed": 100,
             "versions": {"good": "1", flip: "2"}, "left": {f"{flip}@1": 0.0, "good@0": -1.0}}
    redis_client.set(glob, json.dumps(state))
    redis_client.set(ctx, json.dumps({**state, "models": ["good"], "log_w": [0.0]}), ex=600)
    redis_client.set(policy_state_key(f"other{tag}", None), json.dumps({"policy": "exp3", "models": ["x"], "log_w": [0.0]}))
    assert forget_model_weights(redis_client, flip) == 2
    after = json.loads(redis_client.get(glob))
    assert after["models"] == ["good"] and after["log_w"] == [0.0] and after["n_observed"] == 100
    assert after["left"] == {"good@0": -1.0} and after["versions"] == {"good": "1"}
    assert 0 < redis_client.ttl(ctx) <= 600  # a context's state keeps its expiry
    assert forget_model_weights(redis_client, flip) == 0  # nothing of it is left
    # deployed again as version 1 and linked: it starts at the best weight, as a model never seen
    again = align_state(Exp3(), after, ["good", flip], {"good": "1", flip: "1"})
    assert again["log_w"] == [0.0, 0.0]
