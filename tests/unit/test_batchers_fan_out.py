"""An ensemble query's requests in one record (``ModelRequest.also``, docs/design/0082), without a
broker: each model served here takes its part, the others' parts go on to their own topics, and
the record is committable only once every part is served."""

import asyncio
from pathlib import Path

import numpy as np

from batchers.metrics import read
from batchers.service import BatcherService, ModelSetup
from batchers.settings import BatcherSettings
from clipstream.settings import Settings
from clipstream.testing.models import make_profile_model
from registry.spec import load_spec
from schemas import Batch, DeadLetter, ModelRequest, Tensor, decode_as, encode
from tests.unit.test_batchers_offsets import T, DeliveringProducer, owned
from tests.unit.test_batchers_version import Guard

def service(producer: DeliveringProducer, offsets: object, name: str = "m") -> BatcherService:
    """A batcher service of model ``name`` under the prefix ``p.``, with no cache and no delay."""
    return BatcherService(Settings(topic_prefix="p."), BatcherSettings(),
                          ModelSetup(name, "1", 1, latency_objective_ms=20, max_batch_size=8, batch_delay_ms=0,
                                     cache=False),
                          producer, guard=Guard(), offsets=offsets)  # type: ignore[arg-type]


def test_a_record_of_several_parts_is_stored_once_every_part_is_done() -> None:
    o = owned(0)
    o.read((T, 0, 7))
    o.more((T, 0, 7), 2)  # three models asked in one record
    o.read((T, 0, 8))
    o.done([(T, 0, 7), (T, 0, 8)])
    assert o.take() == [] and o.waiting() == 1
    o.done([(T, 0, 7)])
    assert o.take() == []  # one part still open: a crash now must replay the record
    o.done([(T, 0, 7)])
    assert [tp.offset for tp in o.take()] == [9] and o.waiting() == 0


def test_a_partition_given_up_forgets_its_records_parts() -> None:
    o = owned(0, 1)
    o.read((T, 0, 3))
    o.more((T, 0, 3), 1)
    o.own({(T, 1)})
    o.own({(T, 0), (T, 1)})  # back again: read anew from the committed offset
    o.read((T, 0, 3))
    o.done([(T, 0, 3)])
    assert [tp.offset for tp in o.take()] == [4]


def test_the_models_served_here_take_their_parts_and_the_others_go_on_to_their_topics() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(2)
        services = {
            name: service(producer, offsets, name) for name in ("m", "n")
        }
        for svc in services.values():
            svc.siblings = services
        r = ModelRequest(query_id="q", app="a", model="m", input=Tensor.of(np.zeros(1, np.float32)),
                         deadline_us=2**62, selector_partition=1, trace={"dispatched": 5},
                         also=["n", "m", "x", "no such/name"])
        services["m"].accept_group([(encode(r), (T, 2, 40))])
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(c()) for svc in services.values() for c in (svc.lookup_loop, svc.batch_loop)]
        for _ in range(50):
            await asyncio.sleep(0.01)
            if len(producer.sent) == 4:
                break
        by_topic = {topic: (value, partition) for topic, value, partition in producer.sent}
        assert sorted(by_topic) == ["p.batches.m", "p.batches.n", "p.deadletter", "p.requests.x"]
        for model in ("m", "n"):
            (item,) = decode_as(Batch, by_topic[f"p.batches.{model}"][0]).items
            assert item.query_id == "q" and item.selector_partition == 1
        forwarded, partition = by_topic["p.requests.x"]
        part = decode_as(ModelRequest, forwarded)
        assert (part.model, part.also, part.query_id, partition) == ("x", [], "q", 2)
        assert part.trace["dispatched"] == 5 and "batcher_in" in part.trace
        assert "no such/name" in decode_as(DeadLetter, by_topic["p.deadletter"][0]).reason
        assert services["n"].counts["requests"] == 1
        assert sorted(read(services)[0]["clipstream_batcher_forwarded"]) == [(("m",), 1), (("n",), 0)]
        assert offsets.take() == [] and offsets.waiting() == 1  # sent, not yet acknowledged
        producer.deliver()
        assert [(tp.partition, tp.offset) for tp in offsets.take()] == [(2, 41)]
        for t in tasks:
            t.cancel()

    asyncio.run(run())


def test_a_part_that_cannot_be_passed_on_is_a_dead_letter_and_lets_the_record_commit() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(0)
        svc = service(producer, offsets)
        r = ModelRequest(query_id="q", app="a", model="m", input=Tensor.of(np.zeros(1, np.float32)),
                         deadline_us=2**62, selector_partition=0, also=["gone"])
        svc.accept_group([(encode(r), (T, 0, 5))])
        (topic, value, _), = producer.sent
        report, = producer.reports
        producer.reports.clear()
        assert topic == "p.requests.gone"
        msg = type("Msg", (), {"topic": lambda self: topic, "value": lambda self: value})()
        report("Broker: Unknown topic or partition", msg)  # librdkafka gave up on it
        tasks = [asyncio.get_running_loop().create_task(c()) for c in (svc.lookup_loop, svc.batch_loop)]
        for _ in range(50):
            await asyncio.sleep(0.01)
            if len(producer.sent) == 3:
                break
        dead = [decode_as(DeadLetter, v) for t, v, _ in producer.sent if t == "p.deadletter"]
        assert len(dead) == 1 and "p.requests.gone" in dead[0].reason and "Unknown topic" in dead[0].reason
        assert svc.counts["send_errors"] == 1
        producer.deliver()  # the batch of m's own part, and the dead letter
        assert [tp.offset for tp in offsets.take()] == [6]
        for t in tasks:
            t.cancel()

    asyncio.run(run())


def test_an_ensembles_bad_input_is_a_dead_letter_per_model_naming_it(tmp_path: Path) -> None:
    """One record asks two models served here; its input fits neither: each model's dead letter
    and error answer names that model, so the two are told apart."""
    spec = load_spec(make_profile_model(tmp_path, "m", fixed_ms=1.0, shape=[4], labels=[0, 1]))

    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(0)
        services = {name: service(producer, offsets, name) for name in ("m", "n")}
        for svc in services.values():
            svc.siblings = services
            svc.model.spec = spec
        r = ModelRequest(query_id="q", app="a", model="m", input=Tensor.of(np.zeros(3, np.float32)),
                         deadline_us=2**62, selector_partition=0, trace={}, also=["n"])
        services["m"].accept_group([(encode(r), (T, 0, 1))])
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(c()) for svc in services.values() for c in (svc.lookup_loop, svc.batch_loop)]
        for _ in range(100):
            await asyncio.sleep(0.01)
            dead = [decode_as(DeadLetter, v).reason for t, v, _ in producer.sent if t == "p.deadletter"]
            if len(dead) == 2:
                break
        for t in tasks:
            t.cancel()
        assert sorted(reason.split(":")[0] for reason in dead) == ["bad input for model m", "bad input for model n"]
        assert all("(3,)" in reason or "[3]" in reason for reason in dead), dead
        assert all(reason.endswith("(a query of app 'a')") for reason in dead), dead  # the topic names a model only

    asyncio.run(run())
