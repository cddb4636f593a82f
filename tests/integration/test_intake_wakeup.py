"""The intake polled by the event loop, woken through librdkafka's queue pipe, on the real broker."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

import topics.intake as intake_mod
import topics.wakeup as wakeup_mod
from clipstream.settings import Settings
from topics import consumer_config, producer_config
from topics.admin import ensure_topics
from topics.catalogue import TopicSpec
from topics.intake import Intake
from topics.stage import IDLE_POLL_S
from topics.wakeup import attach

pytestmark = pytest.mark.integration


def _topic(settings: Settings) -> str:
    name = f"{settings.topic_prefix}wakeup-{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, [TopicSpec(name, 1, {})])
    return name


def _send(settings: Settings, topic: str, values: list[bytes]) -> None:
    producer = Producer(producer_config(settings))
    for v in values:
        producer.produce(topic, v, partition=0)
    assert producer.flush(10) == 0


async def _collect(intake: Intake, want: int, send: Any) -> tuple[list[bytes], set[int]]:
    """Start ``intake``, wait until it has partitions, send, and gather ``want`` values."""
    got: list[bytes] = []
    threads: set[int] = set()
    done = asyncio.Event()

    def deliver(records: list[Any]) -> None:
        threads.add(threading.get_ident())
        got.extend(value for value, _ in records)
        if len(got) >= want:
            done.set()

    intake._deliver = deliver
    loop = asyncio.get_running_loop()
    intake.start(loop)
    await asyncio.wait_for(loop.run_in_executor(None, intake.ready.wait, 30), 35)
    await loop.run_in_executor(None, send)
    await asyncio.wait_for(done.wait(), 20)
    return got, threads


def test_the_loop_polls_a_group_member_itself_and_gets_every_record(settings: Settings,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # no idle poll to fall back on: only librdkafka's pipe can wake the loop for the records
    monkeypatch.setattr(intake_mod, "IDLE_POLL_S", 600.0)
    topic = _topic(settings)
    values = [f"r{i}".encode() for i in range(50)]

    async def main() -> tuple[list[bytes], set[int], bool, list[str]]:
        intake = Intake(settings, topic, f"g-{uuid.uuid4().hex[:6]}", lambda r: None, max_group=7, name="wakeup-test")
        try:
            got, threads = await _collect(intake, len(values), lambda: _send(settings, topic, values))
            names = [t.name for t in threading.enumerate()]
            return got, threads - {threading.get_ident()}, intake.on_loop, names
        finally:
            intake.stop()

    got, other_threads, on_loop, names = asyncio.run(main())
    assert on_loop and "wakeup-test" not in names
    assert got == values  # in order, none twice, across groups of at most 7
    assert other_threads == set()  # delivered on the loop's own thread


def test_a_reply_topic_read_by_assignment_is_polled_on_the_loop(settings: Settings) -> None:
    topic = _topic(settings)

    async def main() -> tuple[list[bytes], set[int], bool]:
        intake = Intake(settings, topic, f"g-{uuid.uuid4().hex[:6]}", lambda r: None, assign=[TopicPartition(topic, 0)])
        try:
            got, threads = await _collect(intake, 3, lambda: _send(settings, topic, [b"a", b"b", b"c"]))
            return got, threads, intake.on_loop
        finally:
            intake.stop()

    got, threads, on_loop = asyncio.run(main())
    assert on_loop and got == [b"a", b"b", b"c"] and threads == {threading.main_thread().ident}


def test_switched_off_the_intake_keeps_a_thread_that_hands_fetches_to_the_loop(settings: Settings) -> None:
    topic = _topic(settings)
    off = settings.model_copy(update={"kafka_loop_wakeup": False})

    async def main() -> tuple[list[bytes], bool, bool]:
        intake = Intake(off, topic, f"g-{uuid.uuid4().hex[:6]}", lambda r: None, name="threaded-intake")
        try:
            got, threads = await _collect(intake, 2, lambda: _send(settings, topic, [b"x", b"y"]))
            running = "threaded-intake" in [t.name for t in threading.enumerate()]
            return got, intake.on_loop, running and threads == {threading.get_ident()}
        finally:
            intake.stop()

    got, on_loop, thread_then_loop = asyncio.run(main())
    assert got == [b"x", b"y"] and not on_loop and thread_then_loop


def test_stopped_from_another_thread_the_pipe_is_closed_and_later_records_go_nowhere(settings: Settings) -> None:
    topic = _topic(settings)

    async def main() -> tuple[list[bytes], int, list[bytes]]:
        intake = Intake(settings, topic, f"g-{uuid.uuid4().hex[:6]}", lambda r: None, assign=[TopicPartition(topic, 0)])
        got, _ = await _collect(intake, 1, lambda: _send(settings, topic, [b"before"]))
        assert intake._wakeup is not None
        fd = intake._wakeup.fd
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, intake.stop)  # as the gateway's close does
        after: list[bytes] = []
        intake._deliver = lambda records: after.extend(v for v, _ in records)
        await loop.run_in_executor(None, _send, settings, topic, [b"after"])
        # give a wrongly kept reader the chance to fire: past an idle poll, twice over
        await asyncio.sleep(2 * IDLE_POLL_S)
        return got, fd, after

    got, fd, after = asyncio.run(main())
    assert got == [b"before"] and after == []
    with pytest.raises(OSError):
        os.fstat(fd)


def test_attach_takes_only_a_consumer_whose_handle_names_its_client_id(settings: Settings,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = Consumer(consumer_config(settings, "g-attach", **{"client.id": "attach-probe"}))
    producer = Producer(producer_config(settings))
    try:
        assert attach(producer, "attach-probe") is None
        assert attach(object(), "attach-probe") is None
        assert attach(consumer, "someone-else") is None
        with monkeypatch.context() as m:  # a release whose object layout is not known here
            m.setattr(wakeup_mod.confluent_kafka, "version", lambda: ("3.0.0", 0x03000000))
            assert attach(consumer, "attach-probe") is None
        with monkeypatch.context() as m:  # a layout that moved: the pointer read is not mapped
            m.setattr(wakeup_mod, "_HANDLE_OFFSET", wakeup_mod._HANDLE_OFFSET + 8)
            m.setattr(wakeup_mod, "readable", lambda address, span: False)
            assert attach(consumer, "attach-probe") is None
        wakeup = attach(consumer, "attach-probe")
        assert wakeup is not None
        wakeup.close()
        wakeup.close()  # twice is harmless
    finally:
        consumer.close()


def test_a_deliver_that_raises_does_not_stop_the_records_after_it(settings: Settings) -> None:
    topic = _topic(settings)

    async def main() -> list[bytes]:
        got: list[bytes] = []
        done, raised = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: None)  # the failure is expected here

        def deliver(records: list[Any]) -> None:
            values = [v for v, _ in records]
            if b"boom" in values:
                raised.set()
                raise RuntimeError("a stage's bug")
            got.extend(values)
            done.set()

        intake = Intake(settings, topic, f"g-{uuid.uuid4().hex[:6]}", deliver, assign=[TopicPartition(topic, 0)])
        try:
            intake.start(loop)
            await loop.run_in_executor(None, _send, settings, topic, [b"boom"])
            await asyncio.wait_for(raised.wait(), 20)
            await loop.run_in_executor(None, _send, settings, topic, [b"fine"])
            await asyncio.wait_for(done.wait(), 20)
            return got
        finally:
            intake.stop()

    assert asyncio.run(main()) == [b"fine"]
