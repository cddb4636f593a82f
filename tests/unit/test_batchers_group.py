"""A group's batcher (docs/design/0088), without a broker: a query's request for the group's
members becomes one item of one batch, naming the members that missed the cache; the rest of
the request passes on; each request's record is committable once everything serving it is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np

from batchers.group import GroupService
from batchers.service import BatcherService, ModelSetup
from batchers.settings import BatcherSettings
from clipstream.cachekey import cache_key, input_digest
from clipstream.clock import now_us
from clipstream.settings import Settings
from schemas import Batch, DeadLetter, ModelRequest, Predictions, Tensor, decode_as, encode
from tests.unit.test_batchers_offsets import T, DeliveringProducer, owned
from topics.markers import ready_marker
from tests.unit.test_batchers_version import Guard

X = Tensor.of(np.arange(4, dtype=np.float32))
MEMBERS = {"a": "1", "b": "2", "c": "1"}


class Cache:
    """Redis's MGET over a dict, as ``redis.asyncio`` answers it."""

    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values
        self.asked: list[list[str]] = []

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        self.asked.append(list(keys))
        return [self.values.get(k) for k in keys]


def group(producer: DeliveringProducer, offsets: Any, cache: Cache | None = None) -> GroupService:
    setup = ModelSetup("g", "gv1", 1, latency_objective_ms=20, max_batch_size=8, batch_delay_ms=0,
                       cache=cache is not None, members=dict(MEMBERS))
    return GroupService(Settings(topic_prefix="p."), BatcherSettings(), setup, producer, cache,  # type: ignore[arg-type]
                        guard=Guard(), offsets=offsets)


def request(model: str, also: list[str], deadline_us: int = 2**62) -> bytes:
    return encode(ModelRequest(query_id="q", app="app", model=model, input=X, deadline_us=deadline_us,
                               selector_partition=1, trace={"dispatched": 5}, also=also))


async def serve(services: list[BatcherService], done: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(c()) for svc in services for c in (svc.lookup_loop, svc.batch_loop)]
    for _ in range(100):
        await asyncio.sleep(0.01)
        if done():
            break
    for t in tasks:
        t.cancel()


def test_a_querys_members_share_one_item_and_the_other_models_pass_on() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(3)
        svc = group(producer, offsets)
        svc.siblings = {"g": svc, "a": svc, "b": svc, "c": svc}
        svc.accept_group([(request("b", ["a", "x", "b"]), (T, 3, 10))])
        await serve([svc], lambda: len(producer.sent) == 2)
        by_topic = {topic: value for topic, value, _ in producer.sent}
        assert sorted(by_topic) == ["p.batches.g", "p.requests.x"]
        batch = decode_as(Batch, by_topic["p.batches.g"])
        (item,) = batch.items
        assert (batch.model, batch.version, item.models, item.cache_key) == ("g", "gv1", ["b", "a"], None)
        assert decode_as(ModelRequest, by_topic["p.requests.x"]).model == "x"
        assert offsets.take() == []
        producer.deliver()  # the batch and the forwarded part: the record is done
        assert [tp.offset for tp in offsets.take()] == [11]

    asyncio.run(run())


def test_members_that_hit_the_cache_are_answered_and_the_batch_asks_only_the_others() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(3)
        hit = Tensor.of(np.array([0.25, 0.75], np.float32))
        cache = Cache({cache_key("a", "1", X): encode(hit), cache_key("b", "2", X): b"not a record"})
        svc = group(producer, offsets, cache)
        svc.accept_group([(request("a", ["b", "c"]), (T, 3, 4))])
        await serve([svc], lambda: len(producer.sent) == 2)
        assert cache.asked == [[cache_key(m, MEMBERS[m], X) for m in ("a", "b", "c")]]  # one MGET
        by_topic = {topic: (value, partition) for topic, value, partition in producer.sent}
        cached, partition = by_topic["p.predictions"]
        (pred,) = decode_as(Predictions, cached).items
        assert (pred.model, pred.version, pred.status, pred.output, partition) == ("a", "1", "cached", hit, 1)
        (item,) = decode_as(Batch, by_topic["p.batches.g"][0]).items
        assert item.models == ["b", "c"] and item.cache_key == input_digest(X)  # the worker fills b's and c's keys
        producer.reports[:1] = []  # only the cached answer is acknowledged: the batch's part is open
        producer.deliver()
        assert offsets.take() == []
        # one request, part of it batched: not counted as answered from the cache
        assert (svc.counts["requests"], svc.counts["cached"], svc.counts["batched"]) == (1, 0, 1), svc.counts

    asyncio.run(run())


def test_a_request_every_member_answers_from_the_cache_makes_no_batch() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(3)
        hit = encode(Tensor.of(np.array([1.0], np.float32)))
        svc = group(producer, offsets, Cache({cache_key(m, v, X): hit for m, v in MEMBERS.items()}))
        svc.accept_group([(request("c", ["a"]), (T, 3, 0))])
        await serve([svc], lambda: len(producer.sent) == 1)
        ((topic, value, _),) = producer.sent
        assert topic == "p.predictions"
        assert sorted(p.model for p in decode_as(Predictions, value).items) == ["a", "c"]
        producer.deliver()
        assert [tp.offset for tp in offsets.take()] == [1]
        assert (svc.counts["requests"], svc.counts["cached"]) == (1, 1), svc.counts  # once, not per member

    asyncio.run(run())


def test_an_expired_request_is_answered_for_each_member_in_one_record() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(3)
        svc = group(producer, offsets)
        svc.accept_group([(request("a", ["b", "c"], deadline_us=1), (T, 3, 2))])
        await serve([svc], lambda: len(producer.sent) == 1)
        ((topic, value, _),) = producer.sent
        preds = decode_as(Predictions, value).items
        assert topic == "p.predictions" and [(p.model, p.version, p.status) for p in preds] == [
            ("a", "1", "expired"), ("b", "2", "expired"), ("c", "1", "expired")]
        producer.deliver()
        assert [tp.offset for tp in offsets.take()] == [3]

    asyncio.run(run())


def test_a_model_served_alone_hands_a_groups_members_one_part() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(3)
        g = group(producer, offsets)
        alone = BatcherService(Settings(topic_prefix="p."), BatcherSettings(),
                               ModelSetup("m", "1", 1, latency_objective_ms=20, max_batch_size=8,
                                          batch_delay_ms=0, cache=False),
                               producer, guard=Guard(), offsets=offsets)  # type: ignore[arg-type]
        siblings = {"m": alone, "g": g, "a": g, "b": g, "c": g}
        alone.siblings = g.siblings = siblings
        alone.accept_group([(request("m", ["c", "a"]), (T, 3, 8))])
        await serve([alone, g], lambda: len(producer.sent) == 2)
        batches = {t: decode_as(Batch, v) for t, v, _ in producer.sent}
        assert sorted(batches) == ["p.batches.g", "p.batches.m"]
        assert [i.models for i in batches["p.batches.g"].items] == [["c", "a"]]
        producer.deliver()
        assert [tp.offset for tp in offsets.take()] == [9]

    asyncio.run(run())


def test_a_request_for_none_of_the_members_is_a_dead_letter() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(3)
        svc = group(producer, offsets)
        svc.accept_group([(request("z", []), (T, 3, 6))])
        await serve([svc], lambda: len(producer.sent) == 1)
        ((topic, value, _),) = producer.sent
        assert topic == "p.deadletter" and "group g serves ['a', 'b', 'c']" in decode_as(DeadLetter, value).reason
        producer.deliver()
        assert [tp.offset for tp in offsets.take()] == [7]

    asyncio.run(run())


def test_cache_keys_take_a_members_new_version_when_the_batches_do() -> None:
    async def run() -> None:
        producer, offsets = DeliveringProducer(), owned(3)
        cache = Cache({})
        svc = group(producer, offsets, cache)
        svc.follow("gv2", {**MEMBERS, "b": "3"})  # the registry: b's version 3 makes the group gv2
        svc.resize(1, "gv2")
        svc.accept_group([(request("b", []), (T, 3, 0))])
        await serve([svc], lambda: len(cache.asked) == 1)
        svc.accept_stats([(encode(ready_marker("g", "gv2", 0, "w", now_us())), ("p.batch-stats.g", 0, 0))])
        assert svc.core.version == "gv2"
        svc.accept_group([(request("b", []), (T, 3, 1))])
        await serve([svc], lambda: len(cache.asked) == 2)
        # before gv2's worker was ready, b's key was version 2's; after, version 3's
        assert cache.asked == [[cache_key("b", "2", X)], [cache_key("b", "3", X)]]

    asyncio.run(run())
