"""Hostile records against the real selector (the test plays batcher and worker) and batcher:
a policy import path that would run a command, records that do not decode or are of the wrong
type, a tensor with more than 64 dims, a query asking for its answer on the registry topic,
feedback sent 2,000 times or aimed at another context or with a label of the wrong type. Each
becomes a dead letter with its reason and source; a query among them still gets a Response,
and the stage goes on serving."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from clipstream.clock import now_us
from clipstream.settings import Settings
from frontend.producer import ResponseReader
from registry.topic import read_view
from schemas import (
    Batch,
    BatchStats,
    DeadLetter,
    Feedback,
    ModelRequest,
    Prediction,
    Predictions,
    QueryEvent,
    Tensor,
    encode,
)
from selector.store import StateStore, state_key
from tests.hostile import mutations, undecodable
from tests.integration.batcher_harness import uniq
from tests.integration.test_selector_service import (
    Client,
    fake_models,
    process,
    publish_app,
    python_models,
    state,
    wait_until,
)
from topics.admin import ensure_core_topics, ensure_topics
from topics.catalogue import Catalogue
from topics.deadletters import latest
from topics.deadletters_cli import deadletters

pytestmark = [pytest.mark.integration, pytest.mark.component]  # the test plays a neighbouring stage

HUGE = Tensor(dtype="float32", shape=[1] * 65, data=b"\0" * 4)  # more dims than numpy allows


def _dead(settings: Settings, where: str, timeout_s: float = 20.0, payload: bytes = b"") -> Any:
    """The dead letter whose reason contains ``where`` (and whose payload starts with
    ``payload``), once it is on the topic."""
    def find() -> Any:
        return next((d for d in latest(settings, 200, 5.0)
                     if where in d.reason and d.payload.startswith(payload)), None)
    return wait_until(find, timeout_s, f"a dead letter saying {where!r}")


def test_the_selector_survives_hostile_records_and_refuses_import_paths(
        settings: Settings, redis_client: Any, tmp_path: Path) -> None:
    ensure_core_topics(settings)
    cat = Catalogue.from_settings(settings)
    models = python_models(tmp_path)  # m1, m2, m3: played by ``fake_models``
    for m in models:
        ensure_topics(settings, cat.for_model(m))
    app, evil = f"app{uuid.uuid4().hex[:6]}", f"evil{uuid.uuid4().hex[:6]}"
    publish_app(settings, models, app, slo_ms=2000)
    # the registry hole: an App whose policy names subprocess:Popen (built with its policy_config)
    publish_app(settings, models, evil, policy="subprocess:Popen", slo_ms=2000, config={"shell": 1.0})
    stop = threading.Event()
    players = threading.Thread(target=fake_models, args=(settings, list(models), stop, set()), daemon=True)
    players.start()
    client = Client(settings)
    try:
        with process(["selector"], settings, 60):
            client.warm_up(app, slo_ms=2000)

            refused = client.query([0.1, 0.9], evil, slo_ms=2000)
            resp, _ = client.answer(refused.query_id)
            assert resp.is_default and resp.output == -1 and "refused" in resp.default_reason
            assert "subprocess:Popen" in resp.default_reason
            dead = _dead(settings, "'subprocess:Popen' refused")
            assert dead.stage == "selector" and dead.source_topic == cat.queries.name
            assert dead.source_offset is not None and dead.query_id == refused.query_id

            # on queries: bytes that are no record, a record of another type, a >64-dim tensor
            client.producer.produce(cat.queries.name, b"\x00garbage")
            client.producer.produce(cat.queries.name, encode(Feedback(
                query_id="x", app=app, context=None, label=1, reward=None, created_us=now_us())))
            now = now_us()
            huge = QueryEvent(query_id=uuid.uuid4().hex, app=app, context=None, input=HUGE, created_us=now,
                              deadline_us=now + 2_000_000, reply_topic=client.reply.name, reply_partition=0)
            client.producer.produce(cat.queries.name, encode(huge), key=huge.query_id.encode())
            # on predictions: bytes that are no record
            client.producer.produce(cat.predictions.name, b"\x01not predictions", partition=0)
            client.producer.flush(5)
            resp, _ = client.answer(huge.query_id)
            assert resp.is_default and resp.output == -1 and "64" in resp.default_reason
            _dead(settings, "maximum supported dimension")
            _dead(settings, "undecodable query", payload=b"\x00garbage")
            _dead(settings, "expected a QueryEvent record, got a Feedback")
            _dead(settings, "undecodable predictions")

            # a query that asks for its answer on the registry: a dead letter, its default on responses
            with ResponseReader(settings) as responses:
                now = now_us()
                astray = QueryEvent(query_id=uuid.uuid4().hex, app=app, context=None,
                                    input=Tensor.of(np.array([0.1, 0.9], np.float32)), created_us=now,
                                    deadline_us=now + 2_000_000, reply_topic=cat.registry.name, reply_partition=0)
                client.producer.produce(cat.queries.name, encode(astray), key=astray.query_id.encode())
                client.producer.flush(5)
                got = responses.collect({astray.query_id}, timeout_s=20)[astray.query_id]
            assert got.is_default and got.output == -1 and repr(cat.registry.name) in got.default_reason
            dead = _dead(settings, f"reply_topic {cat.registry.name!r}")
            assert dead.stage == "selector" and dead.query_id == astray.query_id
            assert read_view(settings).app(app) is not None  # the registry still reads

            # still serving: a good query gets every model's answer
            rec, _ = client.answer(client.query([0.1, 0.9], app, slo_ms=2000).query_id)
            assert not rec.is_default and rec.output == 1

            out = CliRunner().invoke(deadletters, ["-n", "50"], env={"CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix})
            assert out.exit_code == 0 and "'subprocess:Popen' refused" in out.output
            assert f"{cat.queries.name}[" in out.output
    finally:
        stop.set()
        players.join(5)
        client.close()


def test_feedback_is_applied_once_in_the_stored_context(settings: Settings, redis_client: Any, tmp_path: Path) -> None:
    ensure_core_topics(settings)
    cat = Catalogue.from_settings(settings)
    models = python_models(tmp_path)
    for m in models:
        ensure_topics(settings, cat.for_model(m))
    app = f"app{uuid.uuid4().hex[:6]}"
    publish_app(settings, models, app, slo_ms=2000)
    stop = threading.Event()
    players = threading.Thread(target=fake_models, args=(settings, list(models), stop, set()), daemon=True)
    players.start()
    client = Client(settings)
    try:
        with process(["selector"], settings, 60):
            client.warm_up(app, slo_ms=2000)
            first = client.query([0.1, 0.9], app, slo_ms=2000, context="user-1")
            second = client.query([0.1, 0.8], app, slo_ms=2000, context="user-1")
            for q in (first, second):
                client.answer(q.query_id)
            wait_until(lambda: redis_client.exists(f"cs:pred:{first.query_id}", f"cs:pred:{second.query_id}") == 2,
                       10, "stored predictions")
            # the same feedback 2,000 times (the try was 10,000: once is once either way),
            # naming another caller's context, all on one partition
            for _ in range(2_000):
                client.feedback(first.query_id, 0, app, context="victim", partition=0)
            client.feedback(first.query_id, "zebra", app, partition=0)  # not one of the labels [0, 1]
            client.feedback(second.query_id, 1, app, partition=0)  # after all of them, in order
            client.producer.flush(10)
            glob = f"cs:state:{app}:__global__"
            wait_until(lambda: (s := state(redis_client, glob)) and s["n_observed"] >= 2, 60, "both feedbacks applied")
            # label 0 once: m1, m2 lose 0.5 each; label 1 once: m3 loses 0.5, so all are even again.
            # Applied twice or more, m1 and m2 would stay behind.
            for key in (glob, f"cs:state:{app}:user-1"):
                s = state(redis_client, key)
                assert s["n_observed"] == 2 and s["log_w"] == pytest.approx([0.0, 0.0, 0.0]), (key, s)
            assert redis_client.ttl(f"cs:state:{app}:user-1") > 0 and redis_client.ttl(glob) == -1
            assert not redis_client.exists(f"cs:state:{app}:victim")
            _dead(settings, "feedback label refused: label 'zebra'")
    finally:
        stop.set()
        players.join(5)
        client.close()


def test_context_states_are_capped_and_expire(redis_client: Any) -> None:
    app = f"cap{uuid.uuid4().hex[:6]}"
    store = StateStore(redis_client, predictions_ttl_s=60, context_ttl_s=120, max_contexts=3)

    def bump(state: dict | None, models: list[str]) -> dict:
        return {"n_observed": (state or {}).get("n_observed", 0) + len(models)}

    for i in range(5):
        assert store.observe_once(app, f"c{i}", f"q{i}", ["m1", "m2"], bump) == ["m1", "m2"]
    assert store.observe_once(app, "c4", "q4", ["m1", "m2"], bump) == []  # a repeat: nothing
    assert store.observe_once(app, "c4", "q4", ["m1", "m2", "m3"], bump) == ["m3"]  # per (query, model)
    kept = [i for i in range(5) if redis_client.exists(state_key(app, f"c{i}"))]
    assert kept == [2, 3, 4]
    assert 0 < redis_client.ttl(state_key(app, "c4")) <= 120
    assert state(redis_client, state_key(app, "c4"))["n_observed"] == 3


def test_one_fetch_of_hostile_requests_loses_no_good_one(run_batcher: Any, wire: Any) -> None:
    model = uniq("hostile")
    w = wire(model, 1)
    run_batcher(model, "--version", "1", "--replicas", "1")
    topic = w.cat.requests(model).name
    # one burst: bad records between good ones, flushed together so one fetch brings them
    good = []
    for i in range(3):
        w.producer.produce(topic, b"\x02junk")
        huge = ModelRequest(query_id=f"huge{i}", app="a", model=model, input=HUGE, deadline_us=now_us() + 10_000_000,
                            selector_partition=0)
        w.producer.produce(topic, encode(huge))
        w.producer.produce(topic, encode(Feedback(query_id="f", app="a", context=None, label=1, reward=None,
                                                  created_us=now_us())))
        good.append(w.request(f"good{i}", np.array([float(i), 1.0], dtype=np.float32)))
    w.producer.flush(10)
    batches = w.take(w.cat.batches(model).name, Batch,
                     lambda got: sum(len(r.items) for r, _ in got) >= 3,
                     on=lambda batch, _: w.stats(batch, 1000))  # the worker's report: credit back
    assert sorted(it.query_id for r, _ in batches for it in r.items) == ["good0", "good1", "good2"]
    dead = w.take(w.cat.deadletter.name, DeadLetter, lambda got: len(got) >= 9)
    assert all(d.source_topic == topic and d.source_offset is not None for d, _ in dead)
    assert sum("maximum supported dimension" in d.reason for d, _ in dead) == 3


@hsettings(max_examples=1, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_records_on_every_selector_topic_are_dead_letters_and_it_serves_on(
        data: st.DataObject, settings: Settings, redis_client: Any, tmp_path: Path) -> None:
    """Hypothesis writes random and mutated records to queries, predictions and feedback (the
    topics the selector and its learner consume): each that does not decode is a dead letter
    naming its topic, and a good query is answered after all of them."""
    ensure_core_topics(settings)
    cat = Catalogue.from_settings(settings)
    models = python_models(tmp_path)
    for m in models:
        ensure_topics(settings, cat.for_model(m))
    app = f"app{uuid.uuid4().hex[:6]}"
    publish_app(settings, models, app, slo_ms=2000)
    now = now_us()
    valid = {
        cat.queries.name: encode(QueryEvent(query_id=uuid.uuid4().hex, app=app, context=None,
                                            input=Tensor.of(np.array([0.1, 0.9], dtype=np.float32)),
                                            created_us=now, deadline_us=now + 2_000_000)),
        cat.predictions.name: encode(Predictions(selector_partition=0, items=[Prediction(
            query_id=uuid.uuid4().hex, model="m1", version="1", status="ok",
            output=Tensor.of(np.array([0.2, 0.8], dtype=np.float32)))])),
        cat.feedback.name: encode(Feedback(query_id=uuid.uuid4().hex, app=app, context=None, label=1,
                                           reward=None, created_us=now)),
    }
    sent = {topic: data.draw(st.lists(mutations(v), min_size=20, max_size=20, unique=True), label=topic)
            for topic, v in valid.items()}
    stop = threading.Event()
    players = threading.Thread(target=fake_models, args=(settings, list(models), stop, set()), daemon=True)
    players.start()
    client = Client(settings)
    try:
        with process(["selector"], settings, 60):
            client.warm_up(app, slo_ms=2000)
            for topic, payloads in sent.items():
                for payload in payloads:
                    client.producer.produce(topic, payload, partition=0)
            client.producer.flush(10)
            expected = {(t, p) for t, ps in sent.items() for p in ps if undecodable(p)}
            assert expected, "every drawn record decoded: nothing hostile was sent"
            print(f"fuzz: {len(expected)} undecodable of {sum(map(len, sent.values()))} records sent")

            def missing() -> set[tuple[str, bytes]]:
                seen = {(d.source_topic, d.payload) for d in latest(settings, 2_000, 5.0)}
                return expected - seen

            wait_until(lambda: not missing(), 30, f"a dead letter for each of {len(expected)} undecodable records")
            rec, _ = client.answer(client.query([0.1, 0.9], app, slo_ms=2000).query_id)
            assert not rec.is_default and rec.output == 1
    finally:
        stop.set()
        players.join(5)
        client.close()


@hsettings(max_examples=1, deadline=None, database=None, phases=[Phase.generate],
           suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_records_on_the_batchers_topics_are_dead_letters_and_it_serves_on(
        data: st.DataObject, run_batcher: Any, wire: Any) -> None:
    """The same for the batcher: random and mutated records on ``requests.<model>`` and on its
    workers' ``batch-stats.<model>``, between good requests; each record that does not decode
    is a dead letter naming its topic, and every good request is batched."""
    model = uniq("fuzz")
    w = wire(model, 1)
    run_batcher(model, "--version", "1", "--replicas", "1")
    requests, stats = w.cat.requests(model).name, w.cat.batch_stats(model).name
    valid = {
        requests: encode(ModelRequest(query_id="v", app="a", model=model, input=Tensor.of(np.ones(2, np.float32)),
                                      deadline_us=now_us() + 10_000_000, selector_partition=0)),
        stats: encode(BatchStats(batch_id="b", model=model, replica=0, batch_size=1, service_us=1000,
                                 queue_wait_us=0, errors=0, worker_id="w", created_us=now_us())),
    }
    sent = {topic: data.draw(st.lists(mutations(v), min_size=20, max_size=20, unique=True), label=topic)
            for topic, v in valid.items()}
    good = []
    for i in range(20):
        for topic, payloads in sent.items():
            w.producer.produce(topic, payloads[i])
        good.append(w.request(f"good{i}", np.array([float(i), 1.0], dtype=np.float32)).query_id)
    w.producer.flush(10)
    expected = {(t, p) for t, ps in sent.items() for p in ps if undecodable(p)}
    assert expected, "every drawn record decoded: nothing hostile was sent"
    batched = w.take(w.cat.batches(model).name, Batch,
                     lambda got: {it.query_id for r, _ in got for it in r.items} >= set(good),
                     on=lambda batch, _: w.stats(batch, 1000))
    assert set(good) <= {it.query_id for r, _ in batched for it in r.items}
    w.take(w.cat.deadletter.name, DeadLetter, lambda got: expected <= {(d.source_topic, d.payload) for d, _ in got})


def test_a_bad_registry_record_is_a_dead_letter_and_the_follower_goes_on(settings: Settings) -> None:
    """Records on the registry topic that cannot be applied (garbage, a record of another type,
    an unknown key) change nothing; each is a dead letter, and a good record after them is read.
    (A record without a key never gets there: the compacted topic refuses it.)"""
    from confluent_kafka import Producer

    from registry.topic import RegistryFollower, RegistryWriter
    from topics.client import producer_config

    ensure_core_topics(settings)
    cat = Catalogue.from_settings(settings)
    ensure_topics(settings, [cat.deadletter])  # as every stage does at its start
    follower = RegistryFollower(settings).start()
    try:
        follower.wait_ready(30)
        app = f"app{uuid.uuid4().hex[:6]}"
        producer = Producer(producer_config(settings))
        bad = [(b"nosuchkind:x", b"\x00unknown key"), (f"app:{app}".encode(), b"\x00garbage"),
               (f"app:{app}".encode(), encode(Feedback(query_id="q", app=app, context=None, label=1, reward=None,
                                                        created_us=now_us())))]
        for key, value in bad:
            producer.produce(cat.registry.name, value, key=key)
        assert producer.flush(10) == 0
        with RegistryWriter(settings) as w:
            w.app(app, "single", 50.0, -1, {})
        wait_until(lambda: app in follower.view().apps, 20, "the good App record after the bad ones")
        letters = wait_until(lambda: (got := [d for d in latest(settings, 500, 5.0) if d.stage == "registry"
                                              and d.payload in {v for _, v in bad}]) and len(got) >= 3 and got,
                             20, "a dead letter for each bad registry record")
        assert all(d.source_topic == cat.registry.name and "registry record refused" in d.reason for d in letters)
    finally:
        follower.stop()
