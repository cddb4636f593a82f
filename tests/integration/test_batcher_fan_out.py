"""An ensemble query's requests in one record (docs/design/0082), against the real broker: the
batcher process that reads it batches the part of every model it serves, passes the other
model's part on to that model's topic at the same partition, and commits the record once every
part is out. A name in ``also`` that could not be a model's is a dead letter."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition

from clipstream.clock import now_us
from clipstream.settings import Settings
from schemas import Batch, DeadLetter, ModelRequest, Tensor, decode_as, encode
from tests.integration.batcher_harness import uniq
from topics import consumer_config
from topics.admin import ensure_model_topics

pytestmark = [pytest.mark.integration, pytest.mark.component]  # the test plays a neighbouring stage


def test_one_record_is_batched_for_each_model_served_and_forwarded_for_the_other(
    run_batcher: Any, wire: Any, settings: Settings, tmp_path: Path
) -> None:
    from clipstream.testing.models import make_python_model
    from registry.topic import RegistryWriter, wait_for

    a, b, c = uniq("fa"), uniq("fb"), uniq("fc")
    wa, wb = wire(a), wire(b)
    ensure_model_topics(settings, c, 1)  # served by no process here
    src = "class Model:\n    def __init__(self, path, config): pass\n"
    with RegistryWriter(settings) as reg:
        for name in (a, b):
            reg.model(name, "1", make_python_model(tmp_path, name, src, labels=[0, 1], shape=(2,)))
    wait_for(settings, lambda v: a in v.models and b in v.models)
    run_batcher(a, "--model", b, "--no-cache", "--batch-delay-ms", "0")

    forwarded = Consumer(consumer_config(settings, uniq("test"), **{"auto.offset.reset": "earliest"}))
    forwarded.subscribe([wa.cat.requests(c).name])
    request = ModelRequest(query_id="q1", app="ens", model=a, input=Tensor.of(np.zeros(2, np.float32)),
                           deadline_us=now_us() + 10_000_000, selector_partition=1,
                           trace={"dispatched": now_us()}, also=[b, c, "no such/model"])
    requests_a = wa.cat.requests(a).name
    wa.producer.produce(requests_a, encode(request), key=b"q1", partition=2)
    try:
        for w, model in ((wa, a), (wb, b)):
            (batch, _), = w.take(w.cat.batches(model).name, Batch, lambda g: len(g) >= 1)
            assert batch.model == model and [i.query_id for i in batch.items] == ["q1"]
            assert batch.items[0].selector_partition == 1
        deadline = time.monotonic() + 30
        msg = None
        while msg is None or msg.error():
            assert time.monotonic() < deadline, f"nothing forwarded to {c}'s topic"
            msg = forwarded.poll(0.2)
        part = decode_as(ModelRequest, msg.value())
        assert (part.model, part.also, part.query_id, msg.partition()) == (c, [], "q1", 2)

        (dead, _), = wa.take(wa.cat.deadletter.name, DeadLetter, lambda g: len(g) >= 1)
        assert "no such/model" in dead.reason and dead.source_topic == requests_a and dead.query_id == "q1"

        # committed once all three parts were acknowledged (the group's auto-commit, every second)
        group = Consumer(consumer_config(settings, f"{settings.topic_prefix}batcher.{'+'.join(sorted((a, b)))}.requests"))
        deadline = time.monotonic() + 30
        while (done := group.committed([TopicPartition(requests_a, 2)], timeout=10)[0].offset) != 1:
            assert time.monotonic() < deadline, f"the record's offset was not committed (at {done})"
            time.sleep(0.2)
        group.close()
    finally:
        forwarded.close()
