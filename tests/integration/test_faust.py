"""One faust-streaming agent, in its own process, against the real broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer

from clipstream.clock import now_us
from schemas import QueryEvent, Response, Tensor, decode_as, encode
from topics import Catalogue, consumer_config, producer_config
from topics.admin import ensure_topics

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_faust_agent_answers_through_the_broker(settings, tmp_path):
    cat = Catalogue.from_settings(settings)
    in_spec, out_spec = cat._spec("echo-in", 1), cat._spec("echo-out", 1)
    ensure_topics(settings, [in_spec, out_spec])
    env = {
        **os.environ,
        "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix,
        "ECHO_IN": in_spec.name,
        "ECHO_OUT": out_spec.name,
        "ECHO_APP_ID": f"echo-{uuid.uuid4().hex[:8]}",
    }
    log = open(tmp_path / "faust.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faust_echo", "worker", "-l", "warn"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    consumer = Consumer(
        consumer_config(settings, f"echo-{uuid.uuid4().hex}", **{"auto.offset.reset": "earliest"})
    )
    consumer.subscribe([out_spec.name])
    producer = Producer(producer_config(settings))
    want = {f"q{i}": (i + 1) * 4 for i in range(5)}
    got: dict[str, int] = {}
    try:
        for i, qid in enumerate(want):
            event = QueryEvent(
                query_id=qid,
                app="echo",
                context=None,
                input=Tensor.of(np.zeros(i + 1, np.float32)),
                created_us=now_us(),
                deadline_us=now_us() + 50_000,
                reply_topic=None,
                reply_partition=None,
                trace={},
            )
            producer.produce(in_spec.name, value=encode(event))
        producer.flush(10)
        deadline = time.monotonic() + 90  # faust's first rebalance takes a few seconds
        while len(got) < len(want) and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "faust.log").read_text()[-3000:]
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            r = decode_as(Response, msg.value())
            got[r.query_id] = r.output
    finally:
        consumer.close()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    assert got == want, (tmp_path / "faust.log").read_text()[-3000:]
