"""A one-model app served with no selector at all (docs/design/0083): the gateway sends each
query to the model's batcher, the worker (or the batcher, for a cache hit) sends the prediction
to the gateway's reply topic, and the gateway answers and stores it for the feedback join.

Real Kafka, Redis, batcher, worker and gateway processes; no selector process runs, so every
answer here can only have come the short way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from clipstream.infra.ports import pick_free_ports
from clipstream.infra.redis import redis_answers, redis_url, start_redis
from clipstream.settings import Settings
from clipstream.testing.models import digits, make_onnx_digits_model
from clipstream.testing.procs import predict_admitted, stop_process, wait_until
from frontend.client import Client
from registry.spec import load_spec
from registry.topic import RegistryWriter
from schemas import Predictions, decode
from tests.integration.test_gateway import GatewayProcess
from topics import Catalogue, consumer_config
from topics.admin import watermarks
from workers.backends import load_model

pytestmark = pytest.mark.integration
CLI = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "clipstream")


def _stage(settings: Settings, log: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix,
           "CLIPSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap, "CLIPSTREAM_REDIS_URL": settings.redis_url,
           "CLIPSTREAM_WORKER_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([CLI, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_until(lambda: proc.poll() is not None or f"ready: {args[0]}" in log.read_text(), 120,
               f"the {args[0]} to start")  # a cold start imports ONNX Runtime on 2 busy cores
    assert proc.poll() is None, log.read_text()[-3000:]
    return proc


class Stages:
    """The batcher and the worker as processes this test can freeze, kill and start again."""

    ARGS = {"worker": ("worker", "--model", "logreg"),
            "batcher": ("batcher", "--model", "logreg", "--member", "batcher-1")}  # static: a restart rejoins at once

    def __init__(self, settings: Settings, logs: Path) -> None:
        self.settings, self.logs = settings, logs
        self.procs: dict[str, subprocess.Popen] = {}
        for name in ("worker", "batcher"):
            self.start(name)

    def start(self, name: str) -> subprocess.Popen:
        self.procs[name] = _stage(self.settings, self.logs / f"{name}-{time.monotonic_ns()}.log", *self.ARGS[name])
        return self.procs[name]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a frozen one must be able to hear SIGTERM
            stop_process(proc)


@contextmanager
def serving(settings: Settings, tmp_path: Path, slo_ms: float) -> Iterator[tuple[Client, GatewayProcess, Path, Stages]]:
    folder = make_onnx_digits_model(tmp_path / "models", "logreg", "1")
    with RegistryWriter(settings) as writer:
        writer.model("logreg", "1", folder)
        writer.app("digits", policy="single", slo_ms=slo_ms, default_output=-1)
        writer.link("digits", "logreg")
    stages = Stages(settings, tmp_path)
    gateway = GatewayProcess(settings, tmp_path / "gw.log", instance="direct")
    try:
        yield Client(gateway.url, timeout=90.0), gateway, folder, stages
    finally:
        gateway.stop()
        stages.stop()


@pytest.fixture
def served(settings: Settings, tmp_path: Path) -> Iterator[tuple[Client, GatewayProcess, Path, Stages]]:
    with serving(settings, tmp_path, slo_ms=2000) as parts:
        yield parts


@pytest.fixture
def served_slowly(settings: Settings, tmp_path: Path) -> Iterator[tuple[Client, GatewayProcess, Path, Stages]]:
    """An SLO long enough for a stage to be started again within it."""
    with serving(settings, tmp_path, slo_ms=45_000) as parts:
        yield parts


def fresh_digits(n: int) -> np.ndarray:
    """Digits no other test sent: the cache (shared Redis, same model and version) must miss."""
    return (digits()[0][200:200 + n] + np.random.default_rng().uniform(0.001, 0.01, (n, 1))).astype(np.float32)


def _records(settings: Settings, topic: str) -> list[object]:
    """Every record on partition 0 of ``topic``, decoded."""
    consumer = Consumer(consumer_config(settings, "direct-test-reader"))
    try:
        tp = TopicPartition(topic, 0, 0)
        high = watermarks(consumer, tp)[1]
        consumer.assign([tp])
        records: list[object] = []
        while len(records) < high:
            msg = wait_until(lambda: consumer.poll(0.5), 10, f"record {len(records)} of {topic}")
            if msg.error() is None:
                records.append(decode(msg.value()))
        return records
    finally:
        consumer.close()


def test_a_single_app_is_answered_by_its_model_with_no_selector(served, settings: Settings,
                                                                redis_client: redis.Redis) -> None:
    client, gateway, folder, _ = served
    x, y = digits()
    expected = load_model(load_spec(folder)).predict_batch(x[:6]).argmax(axis=1)
    answers = [predict_admitted(client, "digits", x[i]) for i in range(6)]
    for i, answer in enumerate(answers):
        assert answer["default"] is False, answer
        assert answer["output"] == int(expected[i]) and answer["models"] == {"answered": ["logreg"], "missing": []}
        assert len(answer["scores"]) == 10 and answer["confidence"] == 1.0
    again = predict_admitted(client, "digits", x[0])  # the same input: the batcher's cache answers
    assert again["default"] is False and again["output"] == answers[0]["output"]

    cat = Catalogue.from_settings(settings)
    assert _records(settings, cat.queries.name) == []  # no query went the selector's way
    replies = _records(settings, cat.replies("direct").name)
    statuses = [p.status for r in replies if isinstance(r, Predictions) for p in r.items]
    assert statuses.count("ok") == 6 and statuses.count("cached") == 1

    # stored for the feedback join, as the selector stores what it answers
    qid = answers[1]["query_id"]
    wait_until(lambda: redis_client.exists(f"cs:pred:{qid}"), 10, "the answer to be stored for feedback")
    ack = client.feedback("digits", qid, int(y[1]))
    assert ack["accepted"] is True and "applied" not in ack
    assert gateway.metric("clipstream_gateway_late_responses_total") == 0
    assert np.isfinite(answers[0]["latency_ms"])


@pytest.mark.parametrize("stage", ["worker", "batcher"])
def test_queries_a_stage_held_when_it_was_killed_are_answered_by_its_restart(served_slowly, settings: Settings,
                                                                              stage: str) -> None:
    """Frozen (as a wedged process is, until ``up`` kills it for its silent heartbeat), then
    killed and started again: the queries that reached it meanwhile are still in its input
    topic, uncommitted, and the restarted stage answers each of them, from the model, within
    their deadline. Nothing but the reply topic carries them back: no selector runs here."""
    client, gateway, folder, stages = served_slowly
    x = fresh_digits(5)
    expected = load_model(load_spec(folder)).predict_batch(x).argmax(axis=1)
    assert predict_admitted(client, "digits", x[0])["output"] == int(expected[0])

    cat = Catalogue.from_settings(settings)
    held_in = cat.batches("logreg", 1).name if stage == "worker" else cat.requests("logreg").name
    before = _records_in(settings, held_in)
    proc = stages.procs[stage]
    os.kill(proc.pid, signal.SIGSTOP)
    answers: dict[int, Any] = {}

    def call(i: int) -> None:
        try:
            answers[i] = predict_admitted(client, "digits", x[i])
        except Exception as exc:  # reported below, with the others
            answers[i] = exc

    callers = [threading.Thread(target=call, args=(i,)) for i in range(1, 5)]
    for caller in callers:
        caller.start()
    # the frozen stage's input holds them: every request, or the worker's first batch
    wait_until(lambda: _records_in(settings, held_in) >= before + (1 if stage == "worker" else 4), 30,
               f"the queries to reach {held_in}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    stages.start(stage)
    for caller in callers:
        caller.join(60)
    assert sorted(answers) == [1, 2, 3, 4], f"unanswered: {sorted(set(range(1, 5)) - set(answers))}"
    for i, answer in answers.items():
        assert isinstance(answer, dict) and answer["default"] is False, answer
        assert answer["output"] == int(expected[i]) and answer["models"]["answered"] == ["logreg"]
    assert _records(settings, cat.queries.name) == []


def _records_in(settings: Settings, topic: str) -> int:
    """Records ever written to ``topic``, over its partitions."""
    consumer = Consumer(consumer_config(settings, "direct-test-counter"))
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        return sum(watermarks(consumer, TopicPartition(topic, p))[1] for p in meta.partitions)
    finally:
        consumer.close()


FREEZE_S = 3.0


def test_a_frozen_redis_costs_the_short_way_no_answer_and_no_stored_prediction(settings: Settings,
                                                                              tmp_path: Path) -> None:
    """Redis stopped (SIGSTOP) while a one-model app is asked through the gateway: the batcher's
    cache lookups and the worker's fills give up on it, every query is still answered by the
    model, and the answers the gateway stored for feedback meanwhile reach Redis once it is
    back. The Redis is a private redis-server, so stopping it disturbs no other test."""
    (port,) = pick_free_ports(1)
    server = start_redis(port, tmp_path / "redis", die_with_parent=True)
    settings = settings.model_copy(update={"redis_url": redis_url(port)})
    try:
        wait_until(lambda: redis_answers(settings.redis_url), 20, "the private redis-server")
        with serving(settings, tmp_path, slo_ms=2000) as (client, _, folder, _stages):
            x = fresh_digits(60)
            expected = load_model(load_spec(folder)).predict_batch(x).argmax(axis=1)
            assert predict_admitted(client, "digits", x[0])["output"] == int(expected[0])
            os.kill(server.pid, signal.SIGSTOP)
            answers: list[tuple[int, dict[str, Any]]] = []
            try:
                with pytest.raises(redis.TimeoutError):  # it really is frozen
                    redis.Redis.from_url(settings.redis_url, socket_timeout=0.2).ping()
                end = time.monotonic() + FREEZE_S
                for i in range(1, len(x)):
                    if time.monotonic() > end:
                        break
                    answers.append((i, predict_admitted(client, "digits", x[i])))
            finally:
                os.kill(server.pid, signal.SIGCONT)
            assert len(answers) >= 10, f"only {len(answers)} queries answered in {FREEZE_S:g} s of freeze"
            for i, answer in answers:
                assert answer["default"] is False and answer["output"] == int(expected[i]), answer
            r = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
            keys = [f"cs:pred:{a['query_id']}" for _, a in answers]
            wait_until(lambda: r.exists(*keys) == len(keys), 30, "the answers given in the freeze to be stored")
    finally:
        os.kill(server.pid, signal.SIGCONT)  # never leave it stopped, whatever failed
        stop_process(server, 10)
