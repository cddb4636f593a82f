"""The record size limit without a broker (docs/design/0106): a batch cut to its byte budget,
predictions split to fit, a record librdkafka refuses for its size let go rather than crashing
the batcher, and an input no record could carry refused where it enters."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, KafkaException
from fastapi.testclient import TestClient

from batchers.core import BatcherCore, Pending
from batchers.dispatch import Dispatcher
from batchers.queue import DeadlineQueue
from batchers.service import BatcherService, ModelSetup
from batchers.settings import BatcherSettings
from clipstream.clock import now_us
from clipstream.settings import Settings
from frontend.gateway import create_app
from frontend.settings import GatewaySettings
from schemas import ModelRequest, Prediction, Predictions, QueryEvent, Response, Tensor, decode_as, encode
from tests.fakes import FakeMsg
from tests.unit.test_batchers_offsets import DeliveringProducer, owned
from tests.unit.test_batchers_version import Guard
from tests.unit.test_gateway_http import FakeBus, FakeRegistry, _pong, answer
from tests.unit.test_selector_bad_replies import _recording
from topics.sizes import fitted, input_limit, item_bytes, producer_limit, too_large, topic_limit

LIMIT = 64 * 1024


def _request(qid: str, width: int, deadline_us: int = 10**18) -> ModelRequest:
    return ModelRequest(query_id=qid, app="a", model="m", input=Tensor.of(np.zeros(width, np.uint8)),
                        deadline_us=deadline_us, selector_partition=0)


def test_the_queue_takes_requests_up_to_a_budget_and_always_the_first() -> None:
    q: DeadlineQueue[tuple[int, int]] = DeadlineQueue(lambda item: item[0])
    for deadline, size in ((1, 40), (2, 40), (3, 40), (4, 500)):
        q.push((deadline, size))
    taken, _ = q.take(10, 0, weight=lambda item: item[1], budget=100)
    assert taken == [(1, 40), (2, 40)]  # a third would pass 100
    taken, _ = q.take(10, 0, weight=lambda item: item[1], budget=100)
    assert taken == [(3, 40)]  # the 500 waits: it goes alone
    taken, _ = q.take(10, 0, weight=lambda item: item[1], budget=100)
    assert taken == [(4, 500)] and len(q) == 0


def test_a_batch_is_cut_to_its_byte_budget_and_an_input_over_it_is_set_aside_with_its_twins() -> None:
    budget = 10_000
    core = BatcherCore("m", "1", Dispatcher(1, lambda: SimpleNamespace(max_batch_size=32), max_in_flight=8),
                       weigh=lambda p: item_bytes(len(p.request.input.data)), batch_bytes=budget)
    for i in range(6):
        core.admit(Pending(_request(f"q{i}", 3000), f"k{i}", 0))
    core.admit(Pending(_request("big", 9500), "kb", 0))
    core.admit(Pending(_request("big-twin", 9500), "kb", 0))  # the same input: it waits on the first
    sizes, too_large_ids = [], []
    for _ in range(10):
        step = core.poll(10**6)
        sizes += [len(b.record.items) for b in step.batches]
        too_large_ids += [p.request.query_id for p in step.too_large]
        if not core.queue:
            break
    assert sizes == [2, 2, 2], sizes  # 2 x 4024 fit 10,000; a third would not
    assert sorted(too_large_ids) == ["big", "big-twin"]


def test_predictions_are_split_to_fit_and_one_too_large_alone_becomes_its_models_error() -> None:
    items = [Prediction(f"q{i}", "m", "1", "ok", Tensor.of(np.zeros(1000, np.float32)), None, {}) for i in range(10)]
    parts = fitted(Predictions(2, items), 10_000)
    assert len(parts) > 1 and all(len(p) <= 10_000 for p in parts)
    decoded = [decode_as(Predictions, p) for p in parts]
    assert [i.query_id for d in decoded for i in d.items] == [f"q{i}" for i in range(10)]  # all, in order
    assert {d.selector_partition for d in decoded} == {2}
    huge = Prediction("h", "m", "1", "ok", Tensor.of(np.zeros(5000, np.float32)), None, {"worker_out": 1})
    (only,) = fitted(Predictions(0, [huge]), 10_000)
    (item,) = decode_as(Predictions, only).items
    assert item.status == "error" and item.output is None and item.trace == {"worker_out": 1}
    assert "over the record limit of 10000 bytes (CLIPSTREAM_MAX_RECORD_BYTES)" in (item.error or "")


def test_the_limits_nest_so_that_what_a_stage_writes_fits_its_topic() -> None:
    assert input_limit(LIMIT) + 4096 + 1024 == LIMIT  # one input alone, with its record, fits
    assert LIMIT < producer_limit(LIMIT) < topic_limit(LIMIT)
    from topics.catalogue import Catalogue

    cat = Catalogue.from_settings(Settings(max_record_bytes=LIMIT))
    assert cat.batches("m").config["max.message.bytes"] == str(topic_limit(LIMIT))
    assert "max.message.bytes" not in cat.registry.config  # compacted, small: the broker's own


class RefusingProducer(DeliveringProducer):
    """Refuses records over ``limit`` at produce, as librdkafka does past message.max.bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def produce(self, topic: str, value: bytes, partition: int | None = None, on_delivery: Any = None) -> None:
        if len(value) > self.limit:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        super().produce(topic, value, partition, on_delivery)


def test_a_record_refused_for_its_size_is_let_go_and_the_batcher_goes_on() -> None:
    assert too_large(KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)))
    assert not too_large(KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION)))
    producer, offsets = RefusingProducer(1000), owned(0)
    svc = BatcherService(Settings(topic_prefix="p.", max_record_bytes=LIMIT), BatcherSettings(),
                         ModelSetup("m", "1", 1, latency_objective_ms=20, max_batch_size=8, batch_delay_ms=0,
                                    cache=False), producer, guard=Guard(), offsets=offsets)  # type: ignore[arg-type]
    where = ("p.requests.m", 0, 5)
    offsets.read(where)
    svc._send_all([("p.batches.m", b"x" * 2000, 0, [where]), ("p.predictions", b"small", None, None)])
    assert [t for t, _, _ in producer.sent] == ["p.predictions"]  # the next record still went
    assert svc.counts["send_errors"] == 1
    assert [tp.offset for tp in offsets.take()] == [6]  # the request is let go, not held


def test_the_gateway_refuses_an_input_no_record_could_carry_with_a_413_naming_the_setting() -> None:
    app = create_app(GatewaySettings(instance="unit", max_loop_lag_ms=1000.0, max_body_bytes=4 << 20),
                     Settings(topic_prefix="t.", max_record_bytes=LIMIT), registry=FakeRegistry(),
                     bus=FakeBus(answer), redis_ping=_pong)
    with TestClient(app) as c:
        r = c.post("/v1/apps/big/predict", json={"input": np.zeros((200, 100)).tolist()})  # 80,000 bytes
        assert r.status_code == 413, r.text
        assert "an input of 80000 bytes is over the 60416 bytes a query may carry" in r.text
        assert "CLIPSTREAM_MAX_RECORD_BYTES" in r.text
        assert c.post("/v1/apps/pets/predict", json={"input": [[1, 2, 3], [4, 5, 6]]}).status_code == 200


def test_the_selector_refuses_a_kafka_clients_query_no_request_could_carry() -> None:
    sel, requests, replies, cat, dead = _recording()
    sel.settings = Settings(max_record_bytes=LIMIT)
    sel.max_input_bytes = input_limit(LIMIT)  # as the selector reads it from its settings at start
    ev = QueryEvent(query_id="q", app="app", context=None, input=Tensor.of(np.zeros(input_limit(LIMIT) + 1, np.uint8)),
                    created_us=now_us(), deadline_us=now_us() + 1_000_000)
    sel.dispatch(FakeMsg(encode(ev), cat.queries.name))
    assert requests.sent == []
    assert "a query may carry" in dead[0]["reason"]
    ((_, value),) = replies.sent
    assert decode_as(Response, value).is_default
