"""A request that names a gateway's reply topic (a one-model app's query sent straight,
docs/design/0083), without a broker: its batch item keeps the target, a prediction the batcher
makes itself goes there, and a target that is no reply topic is a dead letter."""

import asyncio

import numpy as np

from clipstream.clock import now_us
from schemas import Batch, DeadLetter, ModelRequest, Predictions, Tensor, decode_as, encode
from tests.unit.test_batchers_fan_out import service
from tests.unit.test_batchers_offsets import T, DeliveringProducer, owned


def request(qid: str, reply: str, deadline_us: int) -> bytes:
    return encode(ModelRequest(query_id=qid, app="a", model="m", input=Tensor.of(np.zeros(1, np.float32)),
                               deadline_us=deadline_us, selector_partition=0, trace={"produced": 1},
                               reply_topic=reply, reply_partition=0))


def test_a_reply_target_rides_with_the_request_and_only_a_reply_topic_is_one() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(1)
        svc = service(producer, offsets)
        svc.accept_group([(request("late", "p.replies.gw", 1), (T, 1, 10)),
                          (request("ok", "p.replies.gw", now_us() + 10**9), (T, 1, 11)),
                          (request("evil", "p.registry", now_us() + 10**9), (T, 1, 12))])
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(c()) for c in (svc.lookup_loop, svc.batch_loop)]
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(producer.sent) == 3:
                break
        by_topic = {topic: (value, partition) for topic, value, partition in producer.sent}
        assert sorted(by_topic) == ["p.batches.m", "p.deadletter", "p.replies.gw"]
        (item,) = decode_as(Batch, by_topic["p.batches.m"][0]).items
        assert (item.query_id, item.reply_topic, item.reply_partition) == ("ok", "p.replies.gw", 0)
        expired, partition = by_topic["p.replies.gw"]
        assert partition == 0
        assert [(p.query_id, p.status) for p in decode_as(Predictions, expired).items] == [("late", "expired")]
        letter = decode_as(DeadLetter, by_topic["p.deadletter"][0])
        assert letter.query_id == "evil" and "'p.registry' is no gateway's reply topic" in letter.reason
        producer.deliver()
        assert [(tp.partition, tp.offset) for tp in offsets.take()] == [(1, 13)]  # every record served
        for t in tasks:
            t.cancel()

    asyncio.run(run())


def test_a_request_for_a_partition_predictions_lacks_is_a_dead_letter_and_is_committed() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(1)
        svc = service(producer, offsets)
        svc.predictions_partitions = 4
        lost = encode(ModelRequest(query_id="far", app="a", model="m", input=Tensor.of(np.zeros(1, np.float32)),
                                   deadline_us=now_us() + 10**9, selector_partition=7))
        svc.accept_group([(lost, (T, 1, 20))])
        svc._send_all(svc.outbox)
        svc.outbox.clear()
        ((topic, value, _),) = producer.sent
        letter = decode_as(DeadLetter, value)
        assert topic == "p.deadletter" and letter.query_id == "far"
        assert "selector_partition 7 is outside [0, 4)" in letter.reason
        producer.deliver()
        assert [(tp.partition, tp.offset) for tp in offsets.take()] == [(1, 21)]  # not held for good

    asyncio.run(run())


def test_a_kafka_clients_input_that_is_not_finite_is_refused_as_bad_input_not_sent_to_the_model() -> None:
    from pathlib import Path

    from batchers.service import BatcherService, ModelSetup
    from batchers.settings import BatcherSettings
    from clipstream.settings import Settings
    from registry.spec import ModelSpec, OutputSpec, TensorSpec
    from tests.unit.test_batchers_version import Guard

    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(1)
        spec = ModelSpec(Path("/m"), "python", TensorSpec("float32", (2,)), OutputSpec("regression"), cls="x:Y")
        svc = BatcherService(Settings(topic_prefix="p."), BatcherSettings(),
                             ModelSetup("m", "1", 1, latency_objective_ms=20, max_batch_size=8, batch_delay_ms=0,
                                        cache=False, spec=spec), producer, guard=Guard(), offsets=offsets)
        nan = encode(ModelRequest(query_id="nan", app="a", model="m", input=Tensor.of(np.array([1, np.nan], np.float32)),
                                  deadline_us=now_us() + 10**9, selector_partition=0))
        svc.accept_group([(nan, (T, 1, 30))])
        assert [p.status for _, p in svc.failed] == ["error"]
        assert "not finite numbers" in (svc.failed[0][1].error or "")
        assert "not finite numbers" in decode_as(DeadLetter, svc.outbox[0][1]).reason

    asyncio.run(run())
