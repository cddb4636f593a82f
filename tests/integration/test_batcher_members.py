"""Two batcher members for one model of two replicas under steady load; one is SIGKILLed.

A real selector answers every query (``clipstream.Producer`` in, ``ResponseReader`` out); the
test plays the workers: replica 0 reports fast batches, replica 1 slow ones, so each replica's
AIMD settles apart in every member. The ledger must show none lost, none yielded twice, and
real answers on the killed member's request partitions once the group has moved them to the
survivor, which replays what the dead one had read and not served (docs/design/0024).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer as KafkaProducer, TopicPartition
from confluent_kafka.admin import AdminClient

from batchers.settings import BatcherSettings
from clipstream.clock import now_us
from clipstream.settings import Settings
from clipstream.testing.models import make_python_model
from clipstream.testing.procs import wait_until
from frontend.producer import Producer, ResponseReader
from registry.topic import RegistryWriter, wait_for
from schemas import Batch, BatchStats, ModelRequest, Prediction, Predictions, Response, Tensor, decode_as, encode
from topics.admin import ensure_core_topics, ensure_model_topics, watermarks
from topics.catalogue import Catalogue
from topics.client import admin_config, consumer_config, producer_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RATE_QPS = 40
SLO_MS = 300.0
BEFORE_KILL_S = 3.0
AFTER_RESUME_S = 2.0
# the survivor gets the dead member's partitions once its session times out; the slack covers
# the rejoin and a machine whose two cores every process here shares
RESUME_BOUND_S = BatcherSettings().session_timeout_ms / 1000 + 4.0
SERVICE_US = {0: 1_000, 1: 40_000}  # replica 1 misses the 20 ms objective: its AIMD stays at 1
MODEL_SRC = "class Model:\n    def __init__(self, path, config): pass\n"


@contextmanager
def stage(args: list[str], settings: Settings) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """``clipstream <args>`` until it prints ``ready:``, with the lines it printed."""
    env = dict(os.environ, CLIPSTREAM_TOPIC_PREFIX=settings.topic_prefix, CLIPSTREAM_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
               CLIPSTREAM_REDIS_URL=settings.redis_url, CLIPSTREAM_BATCHER_STATS_LOG_INTERVAL_S="0.3")
    proc = subprocess.Popen([sys.executable, "-m", "clipstream.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()  # type: ignore[union-attr]
    try:
        wait_until(lambda: any(x.startswith("ready: ") for x in lines) or proc.poll() is not None, 90,
                   f"{args} to be ready")
        assert proc.poll() is None, f"{args} exited early:\n{''.join(lines)[-3000:]}"
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def play_workers(settings: Settings, model: str, stop: threading.Event) -> None:
    """Answer every batch at once: an ok prediction per item, a report per batch."""
    cat = Catalogue.from_settings(settings)
    consumer = Consumer(consumer_config(settings, uuid.uuid4().hex, **{"auto.offset.reset": "earliest"}))
    consumer.subscribe([cat.batches(model).name])
    producer = KafkaProducer(producer_config(settings))
    while not stop.is_set():
        msg = consumer.poll(0.05)
        if msg is None or msg.error():
            continue
        batch = decode_as(Batch, msg.value())
        if not batch.items:
            continue
        parts: dict[int, list[Prediction]] = {}
        for item in batch.items:
            x = item.input.array()
            parts.setdefault(item.selector_partition, []).append(Prediction(
                query_id=item.query_id, model=model, version="1", status="ok",
                output=Tensor.of(np.array([1 - x[1], x[1]], np.float32)), error=None, trace={}))
        for part, items in parts.items():
            producer.produce(cat.predictions.name, encode(Predictions(selector_partition=part, items=items)),
                             partition=part)
        producer.produce(cat.batch_stats(model).name, encode(BatchStats(
            batch_id=batch.batch_id, model=model, replica=batch.replica, batch_size=len(batch.items),
            service_us=SERVICE_US[batch.replica], queue_wait_us=0, errors=0, worker_id=f"w{batch.replica}",
            created_us=now_us())))
        producer.poll(0)
    producer.flush(5)
    consumer.close()


def owners(settings: Settings, group: str) -> dict[str, set[int]]:
    """client id -> the request partitions it owns, as the group coordinator says."""
    admin = AdminClient(admin_config(settings))
    (desc,) = [f.result(10) for f in admin.describe_consumer_groups([group]).values()]
    return {m.client_id: {tp.partition for tp in m.assignment.topic_partitions} for m in desc.members}


def request_partitions(settings: Settings, topic: str) -> dict[str, int]:
    """query id -> the request partition it went to (the first time: replays are not new)."""
    c = Consumer(consumer_config(settings, uuid.uuid4().hex, **{"enable.auto.commit": False}))
    parts = range(Catalogue.from_settings(settings).requests("x").partitions)
    ends = {p: watermarks(c, TopicPartition(topic, p))[1] for p in parts}
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    where: dict[str, int] = {}
    read = {p: 0 for p in parts}
    deadline = time.monotonic() + 30
    while any(read[p] < ends[p] for p in parts) and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is not None and not msg.error():
            where.setdefault(decode_as(ModelRequest, msg.value()).query_id, msg.partition())
            read[msg.partition()] = msg.offset() + 1
    c.close()
    return where


def last_stats(lines: list[str]) -> dict[str, Any]:
    return json.loads([x for x in lines if x.startswith("stats: ")][-1][len("stats: "):])


def test_a_killed_batcher_member_loses_no_query_and_each_replica_keeps_its_aimd(settings: Settings,
                                                                               tmp_path: Path) -> None:
    ensure_core_topics(settings)
    cat = Catalogue.from_settings(settings)
    model, app = f"bm{uuid.uuid4().hex[:8]}", f"app{uuid.uuid4().hex[:8]}"
    ensure_model_topics(settings, model, 2)
    path = make_python_model(tmp_path, model, MODEL_SRC, labels=[0, 1], shape=(2,))
    with RegistryWriter(settings) as w:
        w.model(model, "1", path, replicas=2)
        w.app(app, policy="single", slo_ms=SLO_MS, default_output=-1)
        w.link(app, model)
    wait_for(settings, lambda v: app in v.apps and len(v.apps[app].models) == 1)
    stop = threading.Event()
    workers = threading.Thread(target=play_workers, args=(settings, model, stop), daemon=True)
    workers.start()
    producer, reader = Producer(settings=settings), ResponseReader(settings)
    acked: set[str] = set()
    sent_at: dict[str, float] = {}
    got: dict[str, Response] = {}
    yielded: list[str] = []

    def send() -> str:
        qid = uuid.uuid4().hex
        sent_at[qid] = time.time()
        producer.send_query(app, np.array([0.1, float(np.random.rand())], np.float32), slo_ms=SLO_MS,
                            query_id=qid, on_delivery=lambda q, err: acked.add(q) if err is None else None)
        return qid

    def read(until: Any) -> None:
        while not until():
            r = reader.poll(0.05)
            if r is not None:
                yielded.append(r.query_id)
                got.setdefault(r.query_id, r)

    group = f"{settings.topic_prefix}batcher.{model}.requests"
    batcher = ["batcher", "--model", model, "--version", "1", "--replicas", "2"]
    try:
        with ExitStack() as stack:
            stack.enter_context(stage(["selector", "--group", f"sel-{uuid.uuid4().hex[:8]}"], settings))
            a, a_lines = stack.enter_context(stage(batcher, settings))
            b, _ = stack.enter_context(stage(batcher, settings))
            own = wait_until(lambda: (o := owners(settings, group)) and len(o) == 2 and all(o.values()) and o,
                             60, "both members to own request partitions")
            killed = next(ps for cid, ps in own.items() if cid.endswith(f"-{b.pid}"))

            def warm() -> bool:  # a burst: full batches let the fast replica's AIMD grow
                ids = [send() for _ in range(30)]
                read(lambda: all(q in got for q in ids) or time.time() - sent_at[ids[0]] > 5)
                return all(q in got and not got[q].is_default for q in ids)

            wait_until(warm, 60, "real answers through both members (warm-up)")
            first = len(sent_at)
            kill_at = [0.0]
            load_stop = threading.Event()

            def load() -> None:
                start, i = time.monotonic(), 0
                while not load_stop.is_set():
                    send()
                    i += 1
                    if not kill_at[0] and time.monotonic() - start >= BEFORE_KILL_S:
                        kill_at[0] = time.time()
                        os.kill(b.pid, signal.SIGKILL)
                    time.sleep(max(0.0, start + i / RATE_QPS - time.monotonic()))

            loader = threading.Thread(target=load, daemon=True)
            loader.start()
            where: dict[str, int] = {}

            def resumed() -> float | None:
                """When the first real answer to a query on the killed partitions, sent after the
                kill, was made (None: not yet)."""
                real = [(q, r) for q, r in got.items() if kill_at[0] and sent_at[q] > kill_at[0] and not r.is_default]
                if any(q not in where for q, _ in real):
                    where.update(request_partitions(settings, cat.requests(model).name))
                times = [r.created_us / 1e6 for q, r in real if where.get(q) in killed]
                return min(times) if times else None

            checked = [0.0]

            def until_resumed() -> bool:  # twice a second: it reads the requests topic
                if time.monotonic() - checked[0] < 0.5:
                    return False
                checked[0] = time.monotonic()
                return resumed() is not None or time.time() - (kill_at[0] or time.time()) > RESUME_BOUND_S + 10

            read(until_resumed)
            resume_at = resumed()
            stop_reading = time.monotonic() + AFTER_RESUME_S
            read(lambda: time.monotonic() > stop_reading)
            load_stop.set()
            loader.join(10)
            producer.flush(10)
            drain_until = time.monotonic() + 15
            read(lambda: all(q in got for q in acked) or time.monotonic() > drain_until)
            quiet_until = time.monotonic() + 1.0  # late second Responses count too
            read(lambda: time.monotonic() > quiet_until)
            assert a.poll() is None, "the surviving member died"
            survivor = last_stats(a_lines)
    finally:
        stop.set()
        workers.join(10)
        reader.close()
        producer.close()

    run = [q for q in list(sent_at)[first:] if q in acked]
    lost = [q for q in run if q not in got]
    dupes = len(yielded) - len(set(yielded))
    defaults = [got[q] for q in run if q in got and got[q].is_default]
    where = request_partitions(settings, cat.requests(model).name)
    on_killed = [q for q in run if where.get(q) in killed]
    gap = None if resume_at is None else resume_at - kill_at[0]
    replicas = {r["replica"]: r for r in survivor["replicas"]}
    print(f"\nledger: sent {len(run)} (killed member's request partitions {sorted(killed)}: {len(on_killed)}), "
          f"answered {len(run) - len(lost)}, lost {len(lost)}, duplicates yielded {dupes}, defaults {len(defaults)} "
          f"({sorted({d.default_reason for d in defaults})}), real answers on the killed partitions resumed "
          f"{gap if gap is None else round(gap, 2)} s after the kill (bound {RESUME_BOUND_S:g} s); survivor's "
          f"replicas {replicas}")
    assert run and on_killed, "the load reached the killed member's partitions"
    assert not lost, f"{len(lost)} of {len(run)} queries got no Response"
    assert dupes == 0
    assert all(d.default_reason for d in defaults), "every default says why"
    assert gap is not None and gap <= RESUME_BOUND_S, f"real answers resumed {gap} s after the kill"
    # AIMD per replica: the fast one grew on full batches, the slow one stayed at 1; both served
    assert replicas[0]["batches"] > 0 and replicas[1]["batches"] > 0
    assert replicas[0]["max_batch_size"] > 1 == replicas[1]["max_batch_size"]
