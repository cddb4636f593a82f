"""The batcher's integration harness: a ``clipstream batcher`` subprocess and the topics around
it, where the test plays the worker's part. Its fixtures (``run_batcher``, ``wire``) are
registered for every test by ``tests/conftest.py``; the batcher tests and the batcher + worker
tests both use them."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer

from clipstream.clock import now_us
from clipstream.settings import Settings
from schemas import Batch, BatchStats, ModelRequest, Prediction, Tensor, decode_as, encode
from topics import Catalogue, consumer_config, producer_config
from topics.admin import ensure_core_topics, ensure_model_topics
from clipstream.testing.procs import stop_process

ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / ".venv" / "bin" / "clipstream")


class Batcher:
    """A ``clipstream batcher`` subprocess whose stdout goes to a file we can poll."""

    def __init__(self, settings: Settings, tmp: Path, model: str, *args: str) -> None:
        self.log_path = tmp / f"batcher-{model}.log"
        self.log = open(self.log_path, "w")
        env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix,
               "CLIPSTREAM_BATCHER_STATS_LOG_INTERVAL_S": "0.3"}
        self.proc = subprocess.Popen([CLI, "batcher", "--model", model, *args], cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, text: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output():
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output()[-3000:]}"
            time.sleep(0.1)

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


@pytest.fixture
def run_batcher(settings: Settings, tmp_path: Path) -> Iterator[Callable[..., Batcher]]:
    started: list[Batcher] = []

    def start(model: str, *args: str) -> Batcher:
        b = Batcher(settings, tmp_path, model, *args)
        started.append(b)
        b.wait_for(f"ready: batcher {model}")
        assert b.output().count("ready: batcher") == 1
        return b

    yield start
    for b in started:
        b.stop()


class Wire:
    """Producer and consumers for one model's topics."""

    def __init__(self, settings: Settings, model: str, replicas: int) -> None:
        ensure_core_topics(settings)
        ensure_model_topics(settings, model, replicas)
        self.cat = Catalogue.from_settings(settings)
        self.model = model
        self.producer = Producer(producer_config(settings))
        self.consumers: dict[str, Consumer] = {}
        for name in (self.cat.batches(model).name, self.cat.predictions.name, self.cat.deadletter.name):
            c = Consumer(consumer_config(settings, f"test-{uuid.uuid4().hex}",
                                         **{"auto.offset.reset": "earliest"}))
            c.subscribe([name])
            self.consumers[name] = c

    def request(self, qid: str, x: np.ndarray, deadline_us: int | None = None, part: int = 1) -> ModelRequest:
        r = ModelRequest(query_id=qid, app="a", model=self.model, input=Tensor.of(x),
                         deadline_us=deadline_us or now_us() + 10_000_000, selector_partition=part,
                         trace={"dispatched": now_us()})
        self.producer.produce(self.cat.requests(self.model).name, encode(r))
        self.producer.poll(0)
        return r

    def raw(self, topic: str, value: bytes) -> None:
        self.producer.produce(topic, value)
        self.producer.flush(10)

    def stats(self, batch: Batch, service_us: int) -> None:
        s = BatchStats(batch_id=batch.batch_id, model=self.model, replica=batch.replica,
                       batch_size=len(batch.items), service_us=service_us, queue_wait_us=0,
                       errors=0, worker_id="test", created_us=now_us())
        self.producer.produce(self.cat.batch_stats(self.model).name, encode(s))
        self.producer.poll(0)

    def take(self, topic: str, kind: type, until: Callable[[list[Any]], bool], timeout_s: float = 30,
             on: Callable[[Any, Any], None] | None = None) -> list[Any]:
        """Consume ``kind`` records (a ``schemas`` record type), each with its message, until
        ``until(records)`` holds."""
        self.producer.flush(10)
        got: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while not until(got):
            assert time.monotonic() < deadline, f"timed out on {topic}; got {got}"
            msg = self.consumers[topic].poll(0.1)
            if msg is None or msg.error():
                continue
            rec = decode_as(kind, msg.value())
            got.append((rec, msg))
            if on is not None:
                on(rec, msg)
        return got

    def quiet_for(self, topic: str, seconds: float) -> list[Any]:
        """Everything that arrives on ``topic`` within ``seconds`` (expected: nothing)."""
        got = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            msg = self.consumers[topic].poll(0.1)
            if msg is not None and not msg.error():
                got.append(msg.value())
        return got

    def close(self) -> None:
        self.producer.flush(10)
        for c in self.consumers.values():
            # librdkafka's close has no timeout and was once seen never to return: a test's
            # teardown waits for it a bounded time, then goes on (pytest-timeout's alarm cannot
            # interrupt a call inside librdkafka)
            closing = threading.Thread(target=c.close, daemon=True)
            closing.start()
            closing.join(30)


@pytest.fixture
def wire(settings: Settings) -> Iterator[Callable[[str, int], Wire]]:
    made: list[Wire] = []

    def make(model: str, replicas: int = 1) -> Wire:
        w = Wire(settings, model, replicas)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def uniq(name: str) -> str:
    """Model names unique per test run: the session Redis is shared and the cache key carries
    the model name but not the topic prefix, so entries of an earlier run must not answer."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def preds_of(got: list[Any]) -> dict[str, tuple[Prediction, int]]:
    """query id -> (its Prediction, the partition it came on), from taken ``Predictions``."""
    return {p.query_id: (p, msg.partition()) for rec, msg in got for p in rec.items}
