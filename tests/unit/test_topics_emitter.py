"""The output side of the Kafka runtime every stage shares (``topics.emitter``,
``topics.deadletters``), with a fake librdkafka producer: no broker."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

import pytest

import topics.emitter as emitter_mod
from clipstream.settings import Settings
from clipstream.testing.procs import wait_until
from schemas import DeadLetter, decode_as
from tests.fakes import FakeMsg as Msg
from topics.deadletters import COUNTS, DeadLetters, dead_letter_record, dead_letter_value, source_of
from topics.emitter import DeliveryFailed, Emitter


# -- the emitter ----------------------------------------------------------------------------------
class FakeProducer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf, self.sent, self.polls, self.reports = conf, [], 0, []

    def produce(self, topic: str, value: bytes | None = None, **kw: Any) -> None:
        self.sent.append((topic, value, kw))
        self.reports.append((kw.get("on_delivery"), topic))

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout: float = 0) -> int:
        return len(self.reports)

    def list_topics(self, *a: Any, **k: Any) -> str:
        return "meta"

    def report(self, err: Any) -> None:
        for callback, topic in self.reports:
            callback(err, Msg(None, topic))
        self.reports.clear()


def test_the_emitter_is_configured_once_and_counts_what_the_broker_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emitter_mod, "Producer", FakeProducer)
    e = Emitter(Settings(kafka_bootstrap="k:1"), name="t", **{"message.timeout.ms": 10})
    p: FakeProducer = e.producer  # type: ignore[assignment]
    assert p.conf["bootstrap.servers"] == "k:1" and p.conf["linger.ms"] == 0 and p.conf["message.timeout.ms"] == 10
    e.send("x", b"1", key=b"k", partition=3, poll=True)
    assert p.sent[0][:2] == ("x", b"1") and p.sent[0][2]["key"] == b"k" and p.sent[0][2]["partition"] == 3
    assert p.polls == 1
    p.report("broker down")
    assert e.errors == 1
    e.produce("y", b"2")  # the producer's own call, as it is
    assert p.sent[-1] == ("y", b"2", {}) and e.list_topics() == "meta"


def test_delivered_settles_a_future_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emitter_mod, "Producer", FakeProducer)
    e = Emitter(Settings())

    async def main(err: Any) -> None:
        report, fut = e.delivered(asyncio.get_running_loop())
        e.send("f", b"x", on_delivery=report)
        t = threading.Thread(target=e.producer.report, args=(err,))  # type: ignore[attr-defined]
        t.start()
        try:
            await asyncio.wait_for(fut, 5)
        finally:
            t.join()

    asyncio.run(main(None))
    with pytest.raises(DeliveryFailed, match="nope"):
        asyncio.run(main("nope"))


def test_send_waiting_polls_while_the_local_queue_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emitter_mod, "Producer", FakeProducer)
    e = Emitter(Settings())
    p: FakeProducer = e.producer  # type: ignore[assignment]
    full = [True, True]
    real = p.produce

    def produce(topic: str, value: bytes | None = None, **kw: Any) -> None:
        if full:
            full.pop()
            raise BufferError("full")
        real(topic, value, **kw)

    p.produce = produce  # type: ignore[method-assign]
    e.send_waiting("x", b"1")
    assert len(p.sent) == 1 and p.polls == 2


def test_the_polling_thread_stops_at_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emitter_mod, "Producer", FakeProducer)
    e = Emitter(Settings()).start_polling(0.001)
    wait_until(lambda: e.producer.polls > 0, 5, "the polling thread to poll")  # type: ignore[attr-defined]
    assert e.close(0.1) == 0
    polls = e.producer.polls  # type: ignore[attr-defined]
    threading.Event().wait(0.02)
    assert polls > 0 and e.producer.polls == polls  # type: ignore[attr-defined]


# -- dead letters -----------------------------------------------------------------------------------
def test_a_dead_letter_is_the_record_the_schema_wants() -> None:
    record = dead_letter_record(stage="batcher", reason="bad", source=("t", 1, 2), query_id="q", payload=b"x")
    assert replace(record, created_us=0) == DeadLetter(
        stage="batcher", reason="bad", source_topic="t", source_partition=1, source_offset=2,
        query_id="q", payload=b"x", created_us=0)
    decoded = decode_as(DeadLetter, dead_letter_value(stage="worker", reason="r"))
    assert decoded.stage == "worker" and decoded.source_topic is None
    assert decoded.created_us > 0 and source_of(None) is None


def test_dead_letters_are_sent_with_where_the_message_came_from() -> None:
    p = FakeProducer({})
    dead = DeadLetters(p, "p.deadletter", stage="selector", max_payload=4)
    dead.send(reason="undecodable", msg=Msg(b"123456", "queries", 3, 77), query_id="q1")
    dead.send(reason="no message", stage="learn")
    assert dead.count == 2 and p.polls == 2 and [t for t, _, _ in p.sent] == ["p.deadletter"] * 2
    first, second = (decode_as(DeadLetter, v) for _, v, _ in p.sent)
    assert (first.stage, first.source_topic, first.source_partition, first.source_offset,
            first.query_id, first.payload) == ("selector", "queries", 3, 77, "q1", b"1234")
    assert second.stage == "learn" and second.payload is None
    with pytest.raises(ValueError):
        DeadLetters(p, "d").send(reason="which stage?")


def test_a_dead_letter_that_cannot_be_sent_does_not_stop_the_stage() -> None:
    class Full:
        def produce(self, *a: Any, **k: Any) -> None:
            raise BufferError("queue full")

        def poll(self, timeout: float) -> int:
            return 0

    before = sum(COUNTS.values())
    DeadLetters(Full(), "d", stage="batcher").send(reason="bad input: x")  # logged, not raised
    assert sum(COUNTS.values()) == before + 1
