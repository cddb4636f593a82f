"""The worker process against the real broker and Redis; the test plays the batcher's part.

It produces ``Batch`` records by hand to ``batches.<model>`` and reads what the worker emits:
``Predictions`` at the items' selector partitions, cache entries, ``BatchStats`` and dead letters.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from clipstream.clock import now_us
from clipstream.settings import Settings
from clipstream.testing.models import digits, digits_logreg, make_onnx_digits_model, make_profile_model
from clipstream.testing.procs import stop_process
from registry.spec import load_spec
from schemas import (
    Batch,
    BatchItem,
    BatchStats,
    DeadLetter,
    Prediction,
    Predictions,
    Tensor,
    decode_as,
    encode,
)
from tests.hostile import mutations, undecodable
from topics import Catalogue
from topics.admin import ensure_core_topics
from topics.client import admin_config, consumer_config, producer_config
from workers.backends import load_model

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / ".venv" / "bin" / "clipstream")


class WorkerProc:
    """A ``clipstream worker`` subprocess whose output goes to a file we can poll."""

    def __init__(self, settings: Settings, log_path: Path, model: str, folder: Path | None, *args: str) -> None:
        self.log_path = log_path
        self.log = open(log_path, "a")
        env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix,
               "CLIPSTREAM_WORKER_THREADS": "1"}
        where = ["--path", str(folder)] if folder is not None else []
        self.proc = subprocess.Popen([CLI, "worker", "--model", model, *where, *args],
                                     cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, timeout_s: float = 90) -> str:
        deadline = time.monotonic() + timeout_s
        while "ready: worker" not in self.output():
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, f"worker not ready:\n{self.output()[-3000:]}"
            time.sleep(0.05)
        return next(line for line in self.output().splitlines() if line.startswith("ready: worker"))

    def stop(self) -> int:
        code = stop_process(self.proc)
        self.log.close()
        return code  # type: ignore[return-value]


@pytest.fixture
def run_worker(settings: Settings, tmp_path: Path) -> Iterator[Callable[..., WorkerProc]]:
    started: list[WorkerProc] = []

    def start(model: str, folder: Path | None, *args: str) -> WorkerProc:
        w = WorkerProc(settings, tmp_path / f"worker-{model}-{len(started)}.log", model, folder, *args)
        started.append(w)
        w.wait_ready()
        return w

    yield start
    for w in started:
        w.stop()
        print(f"--- {w.log_path.name}\n{w.output()[-3000:]}")  # shown by pytest when a test fails


class Reader:
    """Reads every partition of one topic from the start and decodes records of one type."""

    def __init__(self, settings: Settings, topic: str, partitions: int, kind: type) -> None:
        self.kind = kind
        self.consumer = Consumer(consumer_config(settings, f"test-{uuid.uuid4().hex}",
                                                 **{"enable.auto.commit": False}))
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.records: list[tuple[int, Any]] = []

    def until(self, done: Callable[[list[tuple[int, Any]]], bool], timeout_s: float = 60) -> list[tuple[int, Any]]:
        deadline = time.monotonic() + timeout_s
        while not done(self.records):
            assert time.monotonic() < deadline, f"timed out; have {len(self.records)} {self.kind.__name__} records"
            for msg in self.consumer.consume(100, 0.2):
                if msg.error() is None:
                    self.records.append((msg.partition(), decode_as(self.kind, msg.value())))
        return self.records

    def close(self) -> None:
        self.consumer.close()


def make_item(qid: str, array: np.ndarray, part: int, cache_key: str | None = None) -> BatchItem:
    return BatchItem(query_id=qid, selector_partition=part, deadline_us=now_us() + 10**7,
                     cache_key=cache_key, input=Tensor.of(array), trace={"batched": now_us()})


def send_batches(settings: Settings, topic: str, batches: list[list[BatchItem]], model: str) -> None:
    producer = Producer(producer_config(settings))
    for n, items in enumerate(batches):
        record = Batch(batch_id=f"b{n}-{uuid.uuid4().hex[:6]}", model=model, version="1",
                       replica=0, created_us=now_us(), items=items)
        producer.produce(topic, encode(record), partition=0)
    assert producer.flush(30) == 0


def received(records: list[tuple[int, Predictions]]) -> dict[str, tuple[int, Prediction]]:
    """query id -> (partition it was read from, Prediction), checking each record sits at its
    own selector partition."""
    out = {}
    for part, rec in records:
        assert rec.selector_partition == part
        for pred in rec.items:
            out[pred.query_id] = (part, pred)
    return out


def output_of(pred: Prediction) -> np.ndarray:
    assert pred.output is not None, pred
    return pred.output.array()


def test_worker_serves_a_batch_and_fills_the_cache(settings: Settings, tmp_path: Path, run_worker, redis_client) -> None:
    folder = make_onnx_digits_model(tmp_path / "repo")
    worker = run_worker("logreg", folder)
    assert worker.output().count("ready: worker") == 1
    assert worker.wait_ready() == "ready: worker logreg replica 0 device cpu"
    cat = Catalogue.from_settings(settings)
    preds = Reader(settings, cat.predictions.name, cat.predictions.partitions, Predictions)
    stats = Reader(settings, cat.batch_stats("logreg").name, 1, BatchStats)
    x, _ = digits()
    keys = [f"cs:cache:logreg:1:{uuid.uuid4().hex}" for _ in range(8)]
    items = [make_item(f"q{i}", x[i], part=i % 4, cache_key=keys[i]) for i in range(8)]
    send_batches(settings, cat.batches("logreg").name, [items], "logreg")

    got = received(preds.until(lambda r: len(received(r)) == 8))
    expected = load_model(load_spec(folder)).predict_batch(x[:8])
    for i in range(8):
        part, pred = got[f"q{i}"]
        assert part == i % 4 and pred.status == "ok" and pred.model == "logreg"
        row = output_of(pred)
        np.testing.assert_allclose(row, expected[i], rtol=1e-5)
        assert row.argmax() == digits_logreg().predict(x[i : i + 1])[0]
        assert pred.trace["batched"] <= pred.trace["worker_in"] <= pred.trace["worker_out"]
        cached = redis_client.get(keys[i])
        assert cached is not None
        np.testing.assert_array_equal(decode_as(Tensor, cached).array(), row)
        assert 0 < redis_client.ttl(keys[i]) <= settings.cache_ttl_s
    (_, stat), = stats.until(lambda r: len(r) >= 1)
    assert stat.batch_size == 8 and stat.errors == 0 and stat.service_us > 0
    assert stat.queue_wait_us >= 0 and stat.replica == 0
    preds.close(), stats.close()
    assert worker.stop() == 0  # SIGTERM: a clean exit


def test_bad_items_and_garbage_go_to_dead_letters(settings: Settings, tmp_path: Path, run_worker) -> None:
    folder = make_onnx_digits_model(tmp_path / "repo")
    run_worker("logreg", folder)
    cat = Catalogue.from_settings(settings)
    preds = Reader(settings, cat.predictions.name, cat.predictions.partitions, Predictions)
    letters = Reader(settings, cat.deadletter.name, 1, DeadLetter)
    x, _ = digits()
    items = [make_item("ok0", x[0], 0), make_item("bad", x[1][:5], 1), make_item("ok2", x[2], 2)]
    producer = Producer(producer_config(settings))
    producer.produce(cat.batches("logreg").name, b"not an avro record", partition=0)
    assert producer.flush(30) == 0
    send_batches(settings, cat.batches("logreg").name, [items], "logreg")

    got = {q: pred for q, (_, pred) in received(preds.until(lambda r: len(received(r)) == 3)).items()}
    assert got["ok0"].status == "ok" and got["ok2"].status == "ok"
    assert got["bad"].status == "error" and "shape [5]" in (got["bad"].error or "")
    dead = [rec for _, rec in letters.until(lambda r: len(r) >= 2)]
    reasons = sorted(d.reason for d in dead)
    assert any(r.startswith("undecodable batch") for r in reasons)
    assert any(d.query_id == "bad" and "shape" in d.reason for d in dead)
    assert all(d.stage == "worker" for d in dead)
    preds.close(), letters.close()


def test_killed_worker_restarts_without_losing_a_request(settings: Settings, tmp_path: Path, run_worker) -> None:
    folder = make_profile_model(tmp_path / "repo", "sim", fixed_ms=40.0, per_item_ms=0.5)
    worker = run_worker("sim", folder)
    cat = Catalogue.from_settings(settings)
    preds = Reader(settings, cat.predictions.name, cat.predictions.partitions, Predictions)
    rng = np.random.default_rng(0)
    batches = [[make_item(f"b{b}i{i}", rng.random(64, dtype=np.float32), part=(b + i) % 4) for i in range(5)]
               for b in range(40)]
    wanted = {it.query_id for items in batches for it in items}
    send_batches(settings, cat.batches("sim").name, batches, "sim")

    preds.until(lambda r: len(received(r)) >= 25)  # mid-stream: some batches answered, most not
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait(10)
    before = set(received(preds.records))
    assert before < wanted  # the kill really happened mid-stream
    restarted = run_worker("sim", folder)
    got = received(preds.until(lambda r: wanted <= set(received(r)), timeout_s=90))
    assert wanted <= set(got)
    assert all(got[q][1].status == "ok" for q in wanted)
    assert restarted.proc.poll() is None
    preds.close()


def test_worker_finds_its_model_in_the_registry(settings: Settings, tmp_path: Path, run_worker) -> None:
    folder = make_profile_model(tmp_path / "repo", "reg", "4", table={1: 1.0}, kind="label", labels=[0, 1, 2])
    # a fresh registry topic briefly has no leader, and the registry follower does not retry
    # that: create the topic and wait for its leader first
    ensure_core_topics(settings)
    admin, registry = AdminClient(admin_config(settings)), Catalogue.from_settings(settings).registry.name
    deadline = time.monotonic() + 30
    while admin.list_topics(registry, timeout=10).topics[registry].partitions[0].leader < 0:
        assert time.monotonic() < deadline, "registry topic has no leader"
        time.sleep(0.1)
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix}
    deploy = subprocess.run([CLI, "deploy-model", "reg", str(folder), "--version", "4", "--replicas", "2"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    worker = run_worker("reg", None, "--replica", "1")  # no --path: the registry says where
    assert worker.wait_ready() == "ready: worker reg replica 1 device cpu"
    cat = Catalogue.from_settings(settings)
    preds = Reader(settings, cat.predictions.name, cat.predictions.partitions, Predictions)
    x = np.ones(64, dtype=np.float32)
    producer = Producer(producer_config(settings))
    record = Batch(batch_id="r1", model="reg", version=None, replica=1, created_us=now_us(),
                   items=[make_item("only", x, 3)])
    producer.produce(cat.batches("reg", 2).name, encode(record), partition=1)
    assert producer.flush(30) == 0
    _, only = received(preds.until(lambda r: "only" in received(r)))["only"]
    expected = load_model(load_spec(folder)).compute(x[None])[0]
    assert only.version == "4" and int(output_of(only)) == expected
    preds.close()


@hsettings(max_examples=1, deadline=None, database=None, phases=[Phase.generate],
           suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_batches_are_dead_letters_and_the_worker_serves_on(
        data: st.DataObject, settings: Settings, tmp_path: Path, run_worker) -> None:
    """Hypothesis writes random and mutated records to ``batches.<model>``: each that does not
    decode is a dead letter naming the topic, and a good batch sent after them is answered."""
    folder = make_onnx_digits_model(tmp_path / "repo")
    run_worker("logreg", folder)
    cat = Catalogue.from_settings(settings)
    topic = cat.batches("logreg").name
    x, _ = digits()
    valid = encode(Batch(batch_id="v", model="logreg", version="1", replica=0, created_us=now_us(),
                         items=[make_item("v", x[0], 0)]))
    payloads = data.draw(st.lists(mutations(valid), min_size=20, max_size=20, unique=True))
    preds = Reader(settings, cat.predictions.name, cat.predictions.partitions, Predictions)
    letters = Reader(settings, cat.deadletter.name, 1, DeadLetter)
    producer = Producer(producer_config(settings))
    for p in payloads:
        producer.produce(topic, p, partition=0)
    assert producer.flush(30) == 0
    send_batches(settings, topic, [[make_item("after", x[3], 1)]], "logreg")

    expected = {p for p in payloads if undecodable(p)}
    assert expected, "every drawn record decoded: nothing hostile was sent"
    got = received(preds.until(lambda r: "after" in received(r)))
    assert got["after"][1].status == "ok"
    letters.until(lambda r: expected <= {d.payload for _, d in r if d.source_topic == topic})
    preds.close(), letters.close()
