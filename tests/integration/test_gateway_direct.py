"""A one-model app served with no selector at all (docs/design/0083): the gateway sends each
query to the model's batcher, the worker (or the batcher, for a cache hit) sends the prediction
to the gateway's reply topic, and the gateway answers and stores it for the feedback join.

Real Kafka, Redis, batcher, worker and gateway processes; no selector process runs, so every
answer here can only have come the short way.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

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


@pytest.fixture
def served(settings: Settings, tmp_path: Path) -> Iterator[tuple[Client, GatewayProcess, Path]]:
    folder = make_onnx_digits_model(tmp_path / "models", "logreg", "1")
    with RegistryWriter(settings) as writer:
        writer.model("logreg", "1", folder)
        writer.app("digits", policy="single", slo_ms=2000, default_output=-1)
        writer.link("digits", "logreg")
    procs = [_stage(settings, tmp_path / "worker.log", "worker", "--model", "logreg"),
             _stage(settings, tmp_path / "batcher.log", "batcher", "--model", "logreg")]
    gateway = GatewayProcess(settings, tmp_path / "gw.log", instance="direct")
    client = Client(gateway.url)
    try:
        yield client, gateway, folder
    finally:
        gateway.stop()
        for proc in procs:
            stop_process(proc)


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
    client, gateway, folder = served
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
