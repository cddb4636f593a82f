"""The selector process on the real broker and Redis, with the test playing batcher and worker.

Checks the straggler cutoff (answer by the deadline, straggler named, lower confidence), the
feedback join (weights in Redis change), and two learners on one context losing no update.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer

from clipstream.clock import now_us
from clipstream.settings import Settings
from schemas import Feedback as FeedbackRecord
from schemas import ModelRequest, Prediction, Predictions, QueryEvent, Response, Tensor, decode_as, encode
from clipstream.testing.models import make_python_model
from clipstream.testing.procs import wait_until
from topics.admin import ensure_core_topics, ensure_topics
from topics.catalogue import Catalogue
from topics.client import consumer_config, producer_config

pytestmark = [pytest.mark.integration, pytest.mark.component]  # the test plays a neighbouring stage
ROOT = Path(__file__).resolve().parents[2]

MODEL_SRC = """
import time
import numpy as np

class Model:
    def __init__(self, path, config):
        self.flip = bool(config.get("flip", False))
        self.slow_s = float(config.get("slow_s", 0.0))

    def predict_batch(self, x):
        if self.slow_s and (x[:, 0] > 0.5).any():
            time.sleep(self.slow_s)  # a straggler on queries whose first feature is large
        p = np.clip(x[:, 1:2], 0.0, 1.0).astype(np.float32)
        out = np.concatenate([1.0 - p, p], axis=1)
        return out[:, ::-1].copy() if self.flip else out
"""



@contextmanager
def process(args: list[str], settings: Settings, timeout_s: float = 60.0) -> Iterator[subprocess.Popen]:
    """Run ``clipstream <args>`` until it prints ``ready: ...``; terminate it on exit."""
    env = dict(os.environ, CLIPSTREAM_TOPIC_PREFIX=settings.topic_prefix,
               CLIPSTREAM_KAFKA_BOOTSTRAP=settings.kafka_bootstrap, CLIPSTREAM_REDIS_URL=settings.redis_url)
    proc = subprocess.Popen([sys.executable, "-m", "clipstream.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    try:
        try:
            wait_until(lambda: any("ready: " in l for l in lines) or proc.poll() is not None, timeout_s,
                       f"{args} to be ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it printed:\n{''.join(lines)[-3000:]}") from None
        assert proc.poll() is None, f"{args} exited early:\n{''.join(lines)}"
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def python_models(tmp: Path, suffix: str = "", slow_s: float = 1.0, flip: bool = True) -> dict[str, Path]:
    """m1 and m2 agree; m3 is a straggler on queries with x[0] > 0.5 (and, with ``flip``, disagrees)."""
    names = [f"m{i}{suffix}" for i in (1, 2, 3)]
    return {
        names[0]: make_python_model(tmp, names[0], MODEL_SRC, labels=[0, 1], shape=(2,)),
        names[1]: make_python_model(tmp, names[1], MODEL_SRC, labels=[0, 1], shape=(2,)),
        names[2]: make_python_model(tmp, names[2], MODEL_SRC, labels=[0, 1], shape=(2,),
                                    extra={"slow_s": slow_s, "flip": flip}),
    }


def publish_app(settings: Settings, models: dict[str, Path], app: str, policy: str = "exp4",
                slo_ms: float = 400.0, config: dict[str, float] | None = None) -> None:
    from registry.topic import RegistryWriter, wait_for

    with RegistryWriter(settings) as w:
        for name, path in models.items():
            w.model(name, "1", path)
        w.app(app, policy=policy, slo_ms=slo_ms, default_output=-1, policy_config=config or {"eta": 0.5})
        for name in models:
            w.link(app, name)
    wait_for(settings, lambda v: app in v.apps and len(v.apps[app].models) == len(models))


class Client:
    """Sends queries and feedback; reads answers from its own reply topic."""

    def __init__(self, settings: Settings) -> None:
        self.cat = Catalogue.from_settings(settings)
        self.reply = self.cat.replies(uuid.uuid4().hex[:8])
        ensure_topics(settings, [self.reply])
        self.producer = Producer(producer_config(settings))
        self.consumer = Consumer(consumer_config(settings, uuid.uuid4().hex, **{"auto.offset.reset": "earliest"}))
        self.consumer.subscribe([self.reply.name])
        self.answers: dict[str, tuple[Response, int]] = {}

    def query(self, x: list[float], app: str, slo_ms: float = 400.0, context: str | None = None) -> QueryEvent:
        now = now_us()
        ev = QueryEvent(query_id=uuid.uuid4().hex, app=app, context=context,
                        input=Tensor.of(np.array(x, dtype=np.float32)), created_us=now,
                        deadline_us=now + int(slo_ms * 1000), reply_topic=self.reply.name, reply_partition=0,
                        trace={"produced": now})
        self.producer.produce(self.cat.queries.name, encode(ev), key=ev.query_id.encode())
        self.producer.flush(5)
        return ev

    def answer(self, query_id: str, timeout_s: float = 10.0) -> tuple[Response, int]:
        def poll() -> Any:
            msg = self.consumer.poll(0.05)
            if msg is not None and not msg.error():
                rec = decode_as(Response, msg.value())
                self.answers[rec.query_id] = (rec, now_us())
            return self.answers.get(query_id)

        return wait_until(poll, timeout_s, f"the answer to {query_id}")

    def warm_up(self, app: str, x: Callable[[], list[float]] = lambda: [0.1, 0.9], slo_ms: float = 400.0,
                timeout_s: float = 30.0) -> None:
        """Query until every model answers in time: the first query of a cold pipeline may meet
        group joins and metadata fetches on a loaded machine, which is not what the tests check."""
        def full_answer() -> bool:
            rec, _ = self.answer(self.query(x(), app, slo_ms=slo_ms).query_id, timeout_s=10 + slo_ms / 1000)
            return not rec.missing

        wait_until(full_answer, timeout_s, "a query that every model answers (warm-up)")

    def feedback(self, query_id: str, label: Any, app: str, context: str | None = None,
                 partition: int | None = None) -> None:
        rec = FeedbackRecord(query_id=query_id, app=app, context=context, label=label, reward=None,
                             created_us=now_us())
        kw = {"partition": partition} if partition is not None else {}
        self.producer.produce(self.cat.feedback.name, encode(rec), **kw)
        self.producer.poll(0)

    def close(self) -> None:
        self.producer.flush(5)
        self.consumer.close()


def fake_models(settings: Settings, models: list[str], stop: threading.Event, stragglers: set[str]) -> None:
    """Play batcher and worker: answer each request at once, except a straggler never answers."""
    cat = Catalogue.from_settings(settings)
    consumer = Consumer(consumer_config(settings, uuid.uuid4().hex, **{"auto.offset.reset": "earliest"}))
    consumer.subscribe([cat.requests(m).name for m in models])
    producer = Producer(producer_config(settings))
    while not stop.is_set():
        msg = consumer.poll(0.05)
        if msg is None or msg.error():
            continue
        req = decode_as(ModelRequest, msg.value())
        x = req.input.array()
        p = float(np.clip(x[1], 0, 1))
        for model in (req.model, *req.also):  # one record asks an ensemble's models (docs/design/0082)
            if model in stragglers:
                continue
            scores = np.array([1 - p, p] if model != "m3" else [p, 1 - p], dtype=np.float32)
            item = Prediction(query_id=req.query_id, model=model, version="1", status="ok",
                              output=Tensor.of(scores), error=None, trace={"worker_out": now_us()})
            producer.produce(cat.predictions.name, encode(Predictions(selector_partition=req.selector_partition,
                             items=[item])), partition=req.selector_partition)
        producer.poll(0)
    producer.flush(5)
    consumer.close()


def state(redis_client: Any, key: str) -> dict | None:
    raw = redis_client.get(key)
    return json.loads(raw) if raw else None


def test_straggler_cutoff_and_feedback_change_the_weights(settings: Settings, redis_client: Any, tmp_path: Path) -> None:
    ensure_core_topics(settings)
    models = python_models(tmp_path)
    for m in models:
        ensure_topics(settings, Catalogue.from_settings(settings).for_model(m))
    app = f"app{uuid.uuid4().hex[:8]}"  # Redis is shared by the session's tests: unique keys
    publish_app(settings, models, app)
    client, stop = Client(settings), threading.Event()
    stragglers: set[str] = set()
    fake = threading.Thread(target=fake_models, args=(settings, list(models), stop, stragglers), daemon=True)
    fake.start()
    try:
        with process(["selector"], settings):
            client.warm_up(app)
            stragglers.add("m3")
            ev = client.query([0.9, 0.8], app)
            resp, at = client.answer(ev.query_id)
            assert resp.missing == ["m3"] and sorted(resp.answered) == ["m1", "m2"]
            assert resp.output == 1 and resp.labels == ["0", "1"] and not resp.is_default
            assert resp.confidence == pytest.approx(2 / 3)
            # answered at the deadline less the reply budget (3 to 40 ms by default)
            assert ev.deadline_us - 42_000 <= at <= ev.deadline_us + 150_000, "answered at the deadline"
            assert "joined" in resp.trace and "dispatched" in resp.trace

            stragglers.clear()  # everyone answers: no wait for the deadline; m3 disagrees
            ev2 = client.query([0.1, 0.9], app)
            resp2, at2 = client.answer(ev2.query_id)
            assert resp2.missing == [] and at2 < ev2.deadline_us
            assert resp2.output == 1 and resp2.confidence == pytest.approx(2 / 3)

            before = state(redis_client, f"cs:state:{app}:__global__")
            client.feedback(ev2.query_id, 1, app)
            after = wait_until(lambda: (s := state(redis_client, f"cs:state:{app}:__global__")) and
                               s["n_observed"] >= 1 and s, 10, "the feedback to be observed")
            assert before is None and after["models"] == ["m1", "m2", "m3"]
            assert after["log_w"][2] == pytest.approx(-0.5) and after["log_w"][:2] == [0.0, 0.0]

            client.feedback("no-such-query", 1, app)  # unknown query id: dead-lettered, the stage goes on
            stragglers.update(models)  # nobody answers: the default, by the deadline
            ev3 = client.query([0.9, 0.9], app, slo_ms=200)
            resp3, at3 = client.answer(ev3.query_id)
            assert resp3.is_default and resp3.output == -1 and resp3.confidence == 0.0
            assert resp3.default_reason == "no prediction arrived by the deadline"
            assert sorted(resp3.missing) == ["m1", "m2", "m3"]

            ev4 = client.query([0.1, 0.9], app="nope")  # unknown app: default answer at once
            resp4, _ = client.answer(ev4.query_id)
            assert resp4.is_default and "unknown app" in resp4.default_reason
    finally:
        stop.set()
        fake.join(10)
        client.close()


def test_two_learners_on_one_context_lose_no_update(settings: Settings, redis_client: Any, tmp_path: Path) -> None:
    ensure_core_topics(settings)
    models = python_models(tmp_path)
    app = f"app{uuid.uuid4().hex[:8]}"
    publish_app(settings, models, app, config={"eta": 0.01})
    context, n = f"user-{uuid.uuid4().hex[:8]}", 80
    ids = [f"{context}-{i}" for i in range(n)]
    for qid in ids:  # stored predictions, as the join leaves them
        redis_client.set(f"cs:pred:{qid}", json.dumps({
            "app": app, "context": context, "answer": {"value": 1, "scores": None},
            "predictions": {m: {"value": int(m == "m1"), "scores": None} for m in models}}), ex=600)
    client = Client(settings)
    try:
        with process(["selector", "--learn-only"], settings), process(["selector", "--learn-only"], settings):
            parts = settings.selector_partitions
            for i, qid in enumerate(ids):  # spread over every partition: both learners work at once
                client.feedback(qid, 1, app, context=context, partition=i % parts)
            client.producer.flush(5)
            key = f"cs:state:{app}:{context}"
            try:
                wait_until(lambda: (s := state(redis_client, key)) and s["n_observed"] >= n, 60, "all feedback")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: state {state(redis_client, key)}") from None
            final = state(redis_client, key)
            assert final["n_observed"] == n
            # every feedback said m1 was right and m2, m3 wrong: each lost eta per feedback
            assert final["log_w"] == pytest.approx([0.0, -0.01 * n, -0.01 * n])
            glob = wait_until(lambda: (s := state(redis_client, f"cs:state:{app}:__global__")) and
                              s["n_observed"] >= n and s, 10, "the global state")
            assert glob["n_observed"] == n
    finally:
        client.close()


def test_feedback_on_a_query_no_model_was_asked_for_is_no_dead_letter(settings: Settings, redis_client: Any,
                                                                      tmp_path: Path) -> None:
    """A query out of time when the selector reads it gets the default with no model asked.
    Its feedback is a caller's fine one with nothing to teach: no dead letter, no weight
    changed. A feedback on an unknown query id, sent after it, still is one."""
    from schemas.reasons import EXPIRED_ON_ARRIVAL
    from topics.deadletters import latest

    ensure_core_topics(settings)
    models = python_models(tmp_path)
    app = f"app{uuid.uuid4().hex[:8]}"
    publish_app(settings, models, app)
    client = Client(settings)
    try:
        with process(["selector"], settings):
            now = now_us()
            late = QueryEvent(query_id=uuid.uuid4().hex, app=app, context=None,
                              input=Tensor.of(np.array([0.1, 0.9], dtype=np.float32)), created_us=now - 2_000_000,
                              deadline_us=now - 1_000_000, reply_topic=client.reply.name, reply_partition=0)
            client.producer.produce(client.cat.queries.name, encode(late), key=late.query_id.encode())
            client.producer.flush(5)
            resp, _ = client.answer(late.query_id, timeout_s=30)
            assert resp.is_default and resp.default_reason == EXPIRED_ON_ARRIVAL and resp.answered == []
            stored = wait_until(lambda: state(redis_client, f"cs:pred:{late.query_id}"), 10, "the stored default")
            assert stored["app"] == app and stored["predictions"] == {} and stored["missing"] == []

            client.feedback(late.query_id, 1, app)
            unknown = f"no-such-{uuid.uuid4().hex[:8]}"
            client.feedback(unknown, 1, app)
            client.producer.flush(5)
            wait_until(lambda: any(d.query_id == unknown for d in latest(settings, 200, 5.0)), 30,
                       "the unknown query's dead letter")
            letters = [d for d in latest(settings, 200, 5.0) if d.query_id == late.query_id]
            assert letters == [], [d.reason for d in letters]
            assert state(redis_client, f"cs:state:{app}:__global__") is None  # no weight changed
    finally:
        client.close()
