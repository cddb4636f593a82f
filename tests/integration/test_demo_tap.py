"""The demo's tap counts only what the demo caused: records from before it (`up`'s warm-up)
are skipped, those after are counted, on a real broker."""

from __future__ import annotations

import time

import numpy as np
import pytest
from confluent_kafka import Producer

from clipstream.demo.tap import Tap
from clipstream.settings import Settings
from clipstream.testing.procs import wait_until
from schemas import BatchStats, Prediction, Predictions, Tensor, encode
from topics import Catalogue, producer_config
from topics.admin import ensure_core_topics, ensure_model_topics

pytestmark = pytest.mark.integration


def _predictions(query: str, status: str) -> bytes:
    out = Tensor.of(np.array([0.1, 0.9], dtype=np.float32)) if status != "expired" else None
    item = Prediction(query_id=query, model="m", version="1", status=status, output=out)
    return encode(Predictions(selector_partition=0, items=[item]))


def _stats(size: int) -> bytes:
    return encode(BatchStats(batch_id=f"b{size}", model="m", replica=0, batch_size=size,
                             service_us=100, queue_wait_us=0, errors=0, worker_id="w", created_us=0))


def test_the_tap_skips_what_came_before_it_and_counts_what_follows(settings: Settings) -> None:
    ensure_core_topics(settings)
    ensure_model_topics(settings, "m")
    cat = Catalogue.from_settings(settings)
    producer = Producer(producer_config(settings))

    def send(topic: str, value: bytes) -> None:
        producer.produce(topic, value=value)
        assert producer.flush(10) == 0

    send(cat.predictions.name, _predictions("warm", "ok"))  # the warm-up, before the tap
    send(cat.batch_stats("m").name, _stats(7))
    time.sleep(0.005)  # the tap's cutoff (ms) must fall after those stamps
    tap = Tap(settings, ["m"], [0, 1]).start()
    try:
        assert tap.wait_assigned(30)
        send(cat.predictions.name, _predictions("q1", "cached"))
        send(cat.predictions.name, _predictions("q2", "expired"))
        send(cat.batch_stats("m").name, _stats(3))
        wait_until(lambda: sum(tap.snapshot()[1].values()) >= 2 and tap.snapshot()[2], 20,
                   "the tap to read the demo's records")
        answers, status, sizes = tap.snapshot()
    finally:
        tap.stop()
    assert status == {"cached": 1, "expired": 1}
    assert sizes == [3]
    assert answers == {"q1": {"m": 1}}


def test_the_tap_waits_for_the_predictions_the_answers_named(settings: Settings) -> None:
    ensure_core_topics(settings)
    ensure_model_topics(settings, "m")
    cat = Catalogue.from_settings(settings)
    producer = Producer(producer_config(settings))
    tap = Tap(settings, ["m"], [0, 1]).start()
    try:
        assert tap.wait_assigned(30)
        assert tap.wait_for({"a1": ["m"]}, timeout_s=0.3) == 1  # nothing sent yet: short at the deadline
        producer.produce(cat.predictions.name, value=_predictions("a1", "ok"))
        assert producer.flush(10) == 0
        assert tap.wait_for({"a1": ["m"]}, timeout_s=20) == 0
        assert tap.wait_for({"a1": ["m"], "never": ["m"], "none-answered": []}, timeout_s=0.3) == 1
    finally:
        tap.stop()
