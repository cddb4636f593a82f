"""What a selector member commits (only answered queries, in order) and what it hands over on a
rebalance (the join state of the partitions that went elsewhere, unanswered)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from confluent_kafka import TopicPartition

from clipstream.clock import now_us
from schemas import QueryEvent, Tensor, encode
from selector.handover import Handover, QueryOffsets
from selector.join import Asked, JoinState
from selector.policies import Single
from selector.service import Selector
from selector.settings import SelectorSettings
from selector.store import StateStore
from tests.unit.test_selector_state_loading import FakeProducer
from topics.catalogue import Catalogue


def test_an_offset_is_storable_only_once_every_query_below_it_is_answered() -> None:
    o = QueryOffsets()
    for off, qid in enumerate(["a", "b", "c"]):
        o.read(0, off, qid)
    o.read(1, 7, "x")
    o.answered("b")
    assert o.take() == {}  # "a" (offset 0) still waits
    o.answered("a")
    assert o.take() == {0: 2}  # a and b: commit up to (not including) c
    o.read(0, 3, None)  # undecodable: nothing to answer, but it waits behind c
    assert o.take() == {} and o.waiting(0) == 1
    o.answered("c")
    o.answered("x")
    assert o.take() == {0: 4, 1: 8}
    assert o.take() == {}  # only what moved since
    o.answered("nobody-asked")  # a Response for a query this member never read: ignored
    o.read(0, 2, "c-again")  # read again (below where reading is): its first reading counted
    assert o.position(0) == 4 and o.waiting(0) == 0


def test_forgotten_partitions_store_nothing_and_others_go_on() -> None:
    o = QueryOffsets()
    o.read(0, 0, "a")
    o.read(1, 0, "b")
    o.forget({0})
    o.answered("a")
    o.answered("b")
    assert o.take() == {1: 1} and o.partitions() == {1} and o.position(0) is None


def test_dropping_partitions_forgets_their_queries_unanswered() -> None:
    j = JoinState()
    j.register("a", ["m"], 10, asked=Asked(partition=0))
    j.register("b", ["m"], 20, asked=Asked(partition=1))
    assert j.drop_partitions({0}) == 1
    assert "a" not in j and "b" in j and not j.answered("a")
    assert [p.query_id for p in j.expired(100)] == ["b"]  # a's deadline fires no answer


class FakeConsumer:
    def __init__(self, committed: dict[tuple[str, int], int]) -> None:
        self._committed = committed
        self.assigned: list[TopicPartition] = []
        self.stored: list[tuple[str, int, int]] = []
        self.commits = 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self._committed.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, 500

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = list(partitions)

    def commit(self, offsets: Any = None, asynchronous: bool = True) -> None:
        self.commits += 1

    def store_offsets(self, offsets: list[TopicPartition]) -> None:
        self.stored += [(tp.topic, tp.partition, tp.offset) for tp in offsets]


def _tps(*pairs: tuple[str, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in pairs]


def test_a_rebalance_keeps_the_partitions_that_come_back_and_hands_over_the_rest() -> None:
    join, offsets = JoinState(), QueryOffsets()
    h = Handover("q", "p", offsets, join.drop_partitions)
    c = FakeConsumer({("q", 0): 40, ("q", 1): 90})
    h.on_assign(c, _tps(("q", 0), ("p", 0)))  # first assignment: where the group left off / the end
    assert {(tp.topic, tp.partition, tp.offset) for tp in c.assigned} == {("q", 0, 40), ("p", 0, 500)}
    for off, qid in ((40, "a"), (41, "b")):
        offsets.read(0, off, qid)
        join.register(qid, ["m"], 10**18, asked=Asked(partition=0))
    h.read_predictions(0, 510)
    join.finish("a")  # answered, and the broker took the Response
    offsets.answered("a")
    h.store(c)
    assert sorted(c.stored) == [("p", 0, 511), ("q", 0, 41)]  # b (41) is not answered yet

    commits = c.commits  # (the pin of p0's start was one)
    h.on_revoke(c, _tps(("q", 0), ("p", 0)))  # eager: everything goes, then most comes back
    assert c.commits == commits + 1 and "b" in join
    h.on_assign(c, _tps(("q", 0), ("p", 0), ("q", 1), ("p", 1)))
    got = {(tp.topic, tp.partition): tp.offset for tp in c.assigned}
    # its own partitions resume where it was reading (b is still in its join); the new ones
    # where their old owner committed (q1) or at the end (p1)
    assert got == {("q", 0): 42, ("p", 0): 511, ("q", 1): 90, ("p", 1): 500}
    assert "b" in join and h.dropped == 0

    h.on_revoke(c, _tps(("q", 0), ("p", 0), ("q", 1), ("p", 1)))
    h.on_assign(c, _tps(("q", 1), ("p", 1)))  # partition 0 went to another member
    assert "b" not in join and h.dropped == 1 and offsets.position(0) is None
    offsets.answered("b")  # a Response acknowledged after the handover stores nothing here
    before = list(c.stored)
    h.store(c)
    assert c.stored == before


def test_the_selector_commits_a_query_once_its_response_is_acknowledged() -> None:
    from clipstream.settings import get_settings

    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    app = SimpleNamespace(name="app", models=("m1",), default_output=-1)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, Single(), SimpleNamespace(kind="label", labels=None)))
    replies = FakeProducer()
    sel = Selector(None, FakeProducer(), StateStore(None), apps, SimpleNamespace(send=lambda *a, **k: None),  # type: ignore[arg-type]
                   cat, settings, reply_producer=replies, save=lambda *a: None)  # type: ignore[arg-type]
    sel._model_topics.add("m1")

    class Msg:
        def __init__(self, offset: int, value: bytes) -> None:
            self._o, self._v = offset, value

        def topic(self) -> str: return cat.queries.name
        def value(self) -> bytes: return self._v
        def partition(self) -> int: return 2
        def offset(self) -> int: return self._o
        def error(self) -> None: return None

    ev = QueryEvent(query_id="q", app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                    created_us=now_us() - 1_000_000, deadline_us=now_us() + 30_000_000)
    sel.handle([Msg(5, encode(ev)), Msg(6, b"garbage")])
    assert sel.offsets.take() == {}  # q is in flight; the garbage after it waits behind it
    sel.answer(sel.join.get("q"))
    (kw,) = replies.options
    kw["on_delivery"]("broker away", None)  # not taken: sent again, still not answered
    assert len(replies.options) == 2 and sel.offsets.take() == {}
    replies.options[1]["on_delivery"](None, SimpleNamespace(latency=lambda: 0.001))
    assert sel.offsets.take() == {2: 7}


def test_heartbeats_must_fit_the_session_three_times() -> None:
    with pytest.raises(ValueError, match="at most a third"):
        SelectorSettings(session_timeout_ms=1_000, heartbeat_interval_ms=500)
    assert SelectorSettings(session_timeout_ms=3_000, heartbeat_interval_ms=1_000).session_timeout_ms == 3_000


def test_the_selectors_groups_are_named_after_the_topic_prefix_unless_set() -> None:
    from clipstream.settings import Settings
    from selector.process import join_consumer_config

    assert SelectorSettings().join_group(Settings()) == "clipstream-selector"  # the default prefix, as before
    assert SelectorSettings().join_group(Settings(topic_prefix="staging.")) == "staging-selector"
    assert SelectorSettings(group="mine").join_group(Settings(topic_prefix="staging.")) == "mine"
    conf = join_consumer_config(Settings(topic_prefix="t1."), SelectorSettings())
    assert conf["group.id"] == "t1-selector"
