"""Policy state loading in the selector: one MGET per poll group, none for stateless policies."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np

from clipstream.clock import now_us
from schemas import ModelRequest, QueryEvent, Response, Tensor, decode_as, encode
from selector.policies import Exp3, Single
from selector.policies import is_stateless
from selector.service import Selector
from selector.store import StateStore, state_key
from tests.fakes import FakeMsg as Msg
from topics.catalogue import Catalogue


class FakeRedis:
    def __init__(self, data: dict[str, str] | None = None) -> None:
        self.data = {k: v.encode() for k, v in (data or {}).items()}
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def get(self, key: str) -> bytes | None:
        self.calls.append(("get", (key,)))
        return self.data.get(key)

    def mget(self, *keys: Any) -> list[bytes | None]:
        flat = tuple(keys[0]) if len(keys) == 1 and isinstance(keys[0], list) else tuple(keys)
        self.calls.append(("mget", flat))
        return [self.data.get(k) for k in flat]


def test_load_many_matches_load_for_every_pair() -> None:
    data = {state_key("a", "c1"): json.dumps({"own": 1}), state_key("a", None): json.dumps({"glob": 1}),
            state_key("b", None): json.dumps({"b": 1})}
    pairs = [("a", "c1"), ("a", "c2"), ("a", None), ("a", ""), ("b", "x"), ("z", None), ("a", "c1")]
    many = StateStore(FakeRedis(data)).load_many(pairs)
    one = StateStore(FakeRedis(data))
    assert all(many[(app, ctx or None)] == one.load(app, ctx) for app, ctx in pairs)
    r = FakeRedis(data)
    StateStore(r).load_many(pairs)
    assert [c[0] for c in r.calls] == ["mget"] and len(set(r.calls[0][1])) == len(r.calls[0][1])
    assert StateStore(r).load_many([]) == {}


def test_which_policies_are_stateless() -> None:
    assert is_stateless(Single()) and not is_stateless(Exp3({}))

    class Mine(Single):  # a user's subclass that reads state says so
        stateless = False

    class Declared:
        stateless = True

    assert not is_stateless(Mine()) and is_stateless(Declared()) and not is_stateless(object())


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.options: list[dict[str, Any]] = []  # each produce's keyword arguments
        self.polls = 0

    def produce(self, topic: str, value: bytes, **kw: Any) -> None:
        self.sent.append((topic, value))
        self.options.append(kw)

    def poll(self, timeout: float) -> None:
        self.polls += 1


def _selector(policy: Any, redis: FakeRedis, settings: Any) -> tuple[Selector, FakeProducer]:
    app = SimpleNamespace(name="app", models=("m1", "m2"), default_output=None)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, policy, SimpleNamespace(kind="label", labels=None)))
    producer = FakeProducer()
    dead = SimpleNamespace(send=lambda *a, **k: None)
    sel = Selector(None, producer, StateStore(redis), apps, dead, Catalogue.from_settings(settings), settings)  # type: ignore[arg-type]
    sel._model_topics |= {"m1", "m2"}
    return sel, producer


def _query(i: int, context: str | None) -> Msg:
    ev = QueryEvent(query_id=f"q{i}", app="app", context=context, input=Tensor.of(np.zeros(2, np.float32)),
                    created_us=now_us() - 1_000_000, deadline_us=now_us() + 30_000_000)
    return Msg(encode(ev), "queries")


def test_group_loads_state_once_and_single_never(monkeypatch: Any) -> None:
    from clipstream.settings import get_settings

    settings = get_settings()
    queries = Catalogue.from_settings(settings).queries.name
    msgs = [Msg(_query(i, ctx).value(), queries) for i, ctx in enumerate(["c1", "c2", "c1", None])]

    r = FakeRedis({state_key("app", "c1"): json.dumps({"policy": "exp3", "models": ["m2"], "log_w": [0.0],
                                                       "n_observed": 3})})
    sel, producer = _selector(Exp3({}), r, settings)
    sel.handle(msgs, queries)
    assert [c[0] for c in r.calls] == ["mget"]
    assert len(producer.sent) == 4 and producer.polls == 1
    states = [sel.join.get(f"q{i}").asked.state for i in range(4)]
    assert states[0] == states[2] and states[0] is not states[2]  # each query its own copy
    assert states[0]["models"] == ["m1", "m2"] and states[1]["n_observed"] == 0

    r = FakeRedis({state_key("app", "c1"): json.dumps({"policy": "single", "models": ["m2"], "n_observed": 3})})
    sel, producer = _selector(Single(), r, settings)
    sel.handle(msgs, queries)
    sel.dispatch(_query(9, "c1"))  # dispatch on its own works as before
    assert r.calls == []
    assert len(producer.sent) == 5 and all(t == Catalogue.from_settings(settings).requests("m1").name
                                           for t, _ in producer.sent)


def test_the_weights_gauge_shows_the_models_the_app_links_now() -> None:
    """The stored state still names a model unlinked since (m3): the gauge shows what the next
    query is selected with, m1 and m2, as soon as the registry says so."""
    from clipstream.settings import get_settings

    r = FakeRedis({state_key("app", None): json.dumps({"policy": "exp3", "models": ["m1", "m3"],
                                                       "log_w": [0.0, -10.0], "n_observed": 7})})
    sel, _ = _selector(Exp3({}), r, get_settings())
    sel.store.load_many([("app", None)])
    sel.metrics.latest_state["app"] = None  # a query of the app was dispatched
    shown = {s.labels["model"]: s.value for s in sel.metrics.registry.collect()
             for s in s.samples if s.name == "clipstream_policy_weight"}
    assert shown == {"m1": 0.5, "m2": 0.5}
    # the app removed (or left with no model): it selects nothing, and shows no weights
    from clipstream.errors import ConfigError

    def gone(name: str) -> Any:
        raise ConfigError(f"unknown app {name!r}")

    sel.apps.get = gone
    assert not [s for s in sel.metrics.registry.collect() for s in s.samples if s.name == "clipstream_policy_weight"]


def test_the_selectors_metrics_start_without_an_error(caplog: Any) -> None:
    from selector.metrics import SelectorMetrics

    with caplog.at_level("ERROR"):
        SelectorMetrics()
    assert not caplog.records, caplog.text


def test_answers_leave_on_their_own_producer() -> None:
    """Responses must not queue behind the ModelRequests of newer queries on one connection."""
    from clipstream.settings import get_settings

    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    app = SimpleNamespace(name="app", models=("m1", "m2"), default_output=-1)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, Single(), SimpleNamespace(kind="label", labels=None)))
    requests, replies = FakeProducer(), FakeProducer()
    sel = Selector(None, requests, StateStore(FakeRedis()), apps, SimpleNamespace(send=lambda *a, **k: None),  # type: ignore[arg-type]
                   cat, settings, reply_producer=replies, save=lambda *a: None)  # type: ignore[arg-type]
    sel._model_topics |= {"m1", "m2"}
    sel.handle([Msg(_query(0, None).value(), cat.queries.name)], cat.queries.name)
    sel.answer(sel.join.get("q0"))  # the deadline passed with nothing arrived: the default
    assert [t for t, _ in requests.sent] == [cat.requests("m1").name]
    assert [t for t, _ in replies.sent] == [cat.responses.name] and replies.polls == 1


def test_a_reply_emitter_with_nothing_pending_is_still_the_one_answers_use() -> None:
    """``Selector`` falls back on the request producer only when it is given no reply producer:
    a real emitter with no record in flight must count as given."""
    from clipstream.settings import Settings
    from topics.emitter import Emitter

    class Idle:  # librdkafka's queue with nothing in it (a real one soon holds connection errors)
        def __len__(self) -> int:
            return 0

    settings = Settings(kafka_bootstrap="127.0.0.1:9")  # nothing is sent: no broker needed
    requests, replies = Emitter(settings, name="requests"), Emitter(settings, name="replies")
    producer, replies.producer = replies.producer, Idle()  # type: ignore[assignment]
    try:
        assert replies.pending() == 0
        sel = Selector(None, requests, StateStore(FakeRedis()), SimpleNamespace(),  # type: ignore[arg-type]
                       SimpleNamespace(send=lambda *a, **k: None), Catalogue.from_settings(settings),  # type: ignore[arg-type]
                       settings, reply_producer=replies)
        assert sel.reply_producer is replies
    finally:
        replies.producer = producer
        requests.close(0)
        replies.close(0)


def test_answers_now_due_go_before_the_new_queries_of_a_group() -> None:
    """A group's new queries (each a fan-out of requests) must not delay a straggler cutoff."""
    import time

    from clipstream.clock import now_us
    from clipstream.settings import get_settings

    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    sel, producer = _selector(Single(), FakeRedis(), settings)
    due = now_us() + 20_000

    def query(i: int, deadline: int) -> Msg:
        ev = QueryEvent(query_id=f"q{i}", app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                        created_us=now_us(), deadline_us=deadline)
        return Msg(encode(ev), cat.queries.name)

    sel.handle([query(0, due)], cat.queries.name)
    while now_us() < due:  # q0's deadline passes with its prediction still missing
        time.sleep(0.001)
    sel.handle([query(1, now_us() + 30_000_000)], cat.queries.name)
    order = [(t, decode_as(Response, v).query_id if t == cat.responses.name else decode_as(ModelRequest, v).query_id)
             for t, v in producer.sent]
    assert order == [(cat.requests("m1").name, "q0"), (cat.responses.name, "q0"), (cat.requests("m1").name, "q1")]


class Clock:
    """``time.monotonic`` for the store, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_states_read_within_the_freshness_window_come_from_memory(monkeypatch: Any) -> None:
    from clipstream.settings import get_settings
    from selector import store as store_mod

    clock = Clock()
    monkeypatch.setattr(store_mod.time, "monotonic", clock)
    settings = get_settings()
    queries = Catalogue.from_settings(settings).queries.name
    glob = json.dumps({"policy": "exp3", "models": ["m1", "m2"], "log_w": [0.0, -1.0], "n_observed": 5})
    r = FakeRedis({state_key("app", None): glob})
    sel, _ = _selector(Exp3({}), r, settings)
    sel.state_fresh_s = 0.25

    sel.handle([Msg(_query(0, None).value(), queries)], queries)
    clock.now += 0.2  # within the window: no round trip, the same state
    sel.handle([Msg(_query(1, None).value(), queries)], queries)
    assert [c[0] for c in r.calls] == ["mget"]
    first, second = (sel.join.get(f"q{i}").asked.state for i in (0, 1))
    assert second == first and second is not first and second["n_observed"] == 5

    sel.handle([Msg(_query(2, "c1").value(), queries)], queries)  # a pair not read yet: Redis
    assert [c[0] for c in r.calls] == ["mget", "mget"]

    r.data[state_key("app", None)] = json.dumps({**json.loads(glob), "n_observed": 9}).encode()
    clock.now += 0.3  # the global state (read again with c1's) is now 0.3 s old: read again, the new one used
    sel.handle([Msg(_query(3, None).value(), queries)], queries)
    assert [c[0] for c in r.calls] == ["mget", "mget", "mget"]
    assert sel.join.get("q3").asked.state["n_observed"] == 9

    sel.state_fresh_s = 0.0  # off: every group reads
    sel.handle([Msg(_query(4, None).value(), queries)], queries)
    assert len(r.calls) == 4


def test_a_state_learnt_in_this_process_is_fresh_at_once(monkeypatch: Any) -> None:
    from selector import store as store_mod

    clock = Clock()
    monkeypatch.setattr(store_mod.time, "monotonic", clock)

    class ScriptRedis(FakeRedis):
        """``observe_once``'s script, as Redis runs it when nobody else writes: a state never
        read is answered with what is there; else the new state is set."""

        def register_script(self, source: str) -> Any:
            def observe(keys: list[str], args: list[Any]) -> list[Any]:
                if args[0] == "unread":
                    return [0, self.data.get(keys[0]), self.data.get(keys[3]), []]
                self.data[keys[0]] = args[2].encode()
                return [1, 1]

            return observe

    store = StateStore(ScriptRedis())
    assert store.fresh([("app", None)], 0.25) is None  # never read
    applied = store.observe_once("app", None, "q1", ["m1"], lambda state, models: {"n_observed": 1})
    assert applied == ["m1"]
    assert store.fresh([("app", None)], 0.25) == {("app", None): {"n_observed": 1}}
    assert store.fresh([("app", None)], 0) is None  # a window of 0 always asks Redis
    clock.now += 0.3
    assert store.fresh([("app", None)], 0.25) is None
    store.observe_once("app", "c1", "q2", ["m1"], lambda state, models: {"n_observed": 2})
    assert store.fresh([("app", "c1")], 0.25) == {("app", "c1"): {"n_observed": 2}}
    assert store.fresh([("app", "c1"), ("app", None)], 0.25) is None  # the global one is old


def test_model_topics_made_sure_of_at_start_cost_the_first_query_no_admin_client(monkeypatch: Any) -> None:
    from clipstream.settings import get_settings
    from selector import service as service_mod

    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    batches: list[list[str]] = []  # each admin round trip: the topics it made sure of
    monkeypatch.setattr(service_mod, "ensure_topics", lambda s, specs: batches.append([t.name for t in specs]))
    sel, producer = _selector(Single(), FakeRedis(), settings)
    sel._model_topics.clear()

    sel.prepare_model_topics(["m2", "m1", "m2"])
    sel.prepare_model_topics(["m1"])  # known already: no second round trip
    assert batches == [[t.name for m in ("m1", "m2") for t in cat.for_model(m, 1)]]
    sel.handle([Msg(_query(0, None).value(), cat.queries.name)], cat.queries.name)
    assert batches[1:] == [] and [t for t, _ in producer.sent] == [cat.requests("m1").name]

    sel._model_topics.discard("m1")  # a model linked after the start: made sure of at its first query
    sel.handle([Msg(_query(1, None).value(), cat.queries.name)], cat.queries.name)
    assert batches[1:] == [[t.name for t in cat.for_model("m1", 1)]]
