"""The Kafka runtime every stage shares (``topics.intake``, ``offsets``, ``stage``), with fake
librdkafka clients: no broker. The emitter and the dead letters: ``test_topics_emitter.py``."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

import topics.intake as intake_mod
import topics.stage as stage_mod
from clipstream.errors import DecodeError, InfraError
from clipstream.settings import Settings
from tests.fakes import FakeMsg as Msg
from topics.intake import Intake, raw_record
from topics.offsets import SpacedCommits, assign_at_end, committed_offset, pin_and_assign
from topics.stage import FATAL_EXIT, announce_ready, ready_line, run_tasks, stop_on_signals


class FakeConsumer:
    """committed/watermarks/assign/commit as librdkafka answers them, and a scripted poll."""

    def __init__(self, committed: dict[tuple[str, int], int] | None = None, high: int = 42,
                 fail: Exception | None = None, since: dict[tuple[str, int], int] | None = None) -> None:
        self._committed, self._since = committed or {}, since or {}
        self.high, self.fail = high, fail
        self.asked_since: list[int] = []
        self.assigned: list[TopicPartition] = []
        self.commits: list[tuple[list[tuple[str, int, int]], bool]] = []
        self.fetches: list[list[Msg]] = []
        self.closed = False

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.fail is not None:
            raise self.fail
        return [TopicPartition(tp.topic, tp.partition, self._committed.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = 0) -> tuple[int, int]:
        return 0, self.high

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        """The first offset at or after each partition's time; -1 where no record is that recent."""
        self.asked_since += [tp.offset for tp in partitions]
        return [TopicPartition(tp.topic, tp.partition, self._since.get((tp.topic, tp.partition), -1))
                for tp in partitions]

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = list(partitions)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append(([(tp.topic, tp.partition, tp.offset) for tp in offsets], asynchronous))

    def subscribe(self, topics: list[str], on_assign: Any) -> None:
        self.subscribed, self.on_assign = topics, on_assign

    def poll(self, timeout: float) -> Msg | None:
        if not self.fetches:
            threading.Event().wait(min(timeout, 0.01))
            return None
        group = self.fetches.pop(0)
        self._rest = group[1:]
        return group[0]

    def consume(self, n: int, timeout: float) -> list[Msg]:
        rest, self._rest = self._rest[:n], []
        return rest

    def close(self) -> None:
        self.closed = True


class Eof:
    def code(self) -> int:
        return KafkaError._PARTITION_EOF


def offsets(tps: list[TopicPartition]) -> list[tuple[str, int, int]]:
    return [(tp.topic, tp.partition, tp.offset) for tp in tps]


# -- start offsets and commits ---------------------------------------------------------------
def test_a_partition_without_a_committed_offset_starts_at_its_end_as_a_number_and_the_pin_is_committed() -> None:
    c = FakeConsumer(committed={("a", 0): 7}, high=42)
    pin_and_assign(c, [TopicPartition("a", 0), TopicPartition("a", 1)])  # type: ignore[arg-type]
    assert offsets(c.assigned) == [("a", 0, 7), ("a", 1, 42)]
    assert c.commits == [([("a", 1, 42)], False)]


def test_a_new_groups_partition_starts_at_its_first_record_since_the_time_given() -> None:
    c = FakeConsumer(committed={("a", 0): 7}, high=42, since={("a", 1): 30})
    pin_and_assign(c, [TopicPartition(t, p) for t, p in (("a", 0), ("a", 1), ("a", 2))],  # type: ignore[arg-type]
                   since_ms=1_000)
    # committed: where the group left off; new: the first record since then, else the end now
    assert offsets(c.assigned) == [("a", 0, 7), ("a", 1, 30), ("a", 2, 42)]
    assert c.asked_since == [1_000, 1_000]  # only the partitions the group never committed
    assert c.commits == [([("a", 1, 30), ("a", 2, 42)], False)]


def test_pins_are_not_committed_when_asked_not_to_and_nothing_is_committed_with_no_pin() -> None:
    c = FakeConsumer(high=5)
    pin_and_assign(c, [TopicPartition("a", 0)], commit=False)  # type: ignore[arg-type]
    assert offsets(c.assigned) == [("a", 0, 5)] and c.commits == []
    c = FakeConsumer(committed={("a", 0): 3})
    pin_and_assign(c, [TopicPartition("a", 0)])  # type: ignore[arg-type]
    assert c.commits == []


def test_a_broker_that_cannot_say_leaves_the_reset_policy_to_librdkafka() -> None:
    c = FakeConsumer(fail=KafkaException(KafkaError(KafkaError._TIMED_OUT)))
    parts = [TopicPartition("a", 0)]
    assert pin_and_assign(c, parts) == parts  # type: ignore[arg-type]
    assert c.assigned == parts and c.commits == []


def test_assign_at_end_pins_each_partition_and_reports_a_broker_that_cannot_say(monkeypatch: pytest.MonkeyPatch) -> None:
    c = FakeConsumer(high=9)
    assign_at_end(c, [TopicPartition("r", 0)])  # type: ignore[arg-type]
    assert offsets(c.assigned) == [("r", 0, 9)]

    def fail(consumer: Any, tp: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    monkeypatch.setattr("topics.offsets.watermarks", fail)
    with pytest.raises(InfraError, match=r"r\[0\]"):
        assign_at_end(c, [TopicPartition("r", 0)])  # type: ignore[arg-type]


def test_committed_offset_retries_until_the_group_coordinator_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("topics.offsets.time.sleep", lambda s: None)
    answers: list[Any] = [KafkaException(KafkaError(KafkaError.NOT_COORDINATOR)), 17]

    class C:
        def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
            a = answers.pop(0)
            if isinstance(a, Exception):
                raise a
            return [TopicPartition(tps[0].topic, tps[0].partition, a)]

    assert committed_offset(C(), TopicPartition("b", 1), 5.0) == 17  # type: ignore[arg-type]
    answers[:] = [-1001]
    assert committed_offset(C(), TopicPartition("b", 1), 5.0) == OFFSET_BEGINNING  # type: ignore[arg-type]
    answers[:] = [KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))] * 3
    with pytest.raises(InfraError, match=r"b\[1\]"):
        committed_offset(C(), TopicPartition("b", 1), -1.0)  # type: ignore[arg-type]


def test_spaced_commits_send_at_most_one_per_interval_and_the_last_when_stopping() -> None:
    c = FakeConsumer()
    commits = SpacedCommits("b", 0)
    commits.offer(None)
    assert not commits.commit(c, 60.0)  # type: ignore[arg-type]
    commits.offer(5)
    assert commits.commit(c, 60.0)  # type: ignore[arg-type]
    commits.offer(6)
    assert not commits.commit(c, 60.0)  # type: ignore[arg-type]  # within the interval
    assert commits.commit(c, 60.0, asynchronous=False)  # type: ignore[arg-type]  # stopping
    assert c.commits == [([("b", 0, 5)], True), ([("b", 0, 6)], False)]


# -- the intake ---------------------------------------------------------------------------------
def make_intake(monkeypatch: pytest.MonkeyPatch, fake: FakeConsumer, deliver: Any, **kw: Any) -> Intake:
    monkeypatch.setattr(intake_mod, "Consumer", lambda conf: fake)
    return Intake(Settings(), kw.pop("topics", ["a", "b"]), "g", deliver, **kw)


def test_each_fetch_reaches_the_loop_in_one_call_without_eof_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeConsumer()
    fake.fetches = [[Msg(b"1", "a", 0, 1), Msg(None, "a", 0, 2, error=Eof()), Msg(b"2", "b", 3, 9)],
                    [Msg(b"3", "a", 0, 3)]]

    async def main() -> list[tuple[list[Any], bool]]:
        got: list[tuple[list[Any], bool]] = []
        done = asyncio.Event()
        loop_thread = threading.get_ident()

        def deliver(records: list[Any]) -> None:
            got.append((records, threading.get_ident() == loop_thread))
            if len(got) == 2:
                done.set()

        intake = make_intake(monkeypatch, fake, deliver)
        intake.start(asyncio.get_running_loop())
        await asyncio.wait_for(done.wait(), 5)
        intake.stop()
        return got

    got = asyncio.run(main())
    assert got == [([(b"1", ("a", 0, 1)), (b"2", ("b", 3, 9))], True), ([(b"3", ("a", 0, 3))], True)]
    assert fake.closed


def test_undecodable_records_are_dropped_on_the_consumer_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeConsumer()
    fake.fetches = [[Msg(b"bad", "r"), Msg(b"good", "r")]]

    def convert(msg: Any) -> bytes:
        if msg.value() == b"bad":
            raise DecodeError("not a record")
        return msg.value().upper()

    async def main() -> list[Any]:
        got: list[Any] = []
        done = asyncio.Event()
        intake = make_intake(monkeypatch, fake, lambda r: (got.append(r), done.set()), topics="r",
                             convert=convert, assign=[TopicPartition("r", 0)])
        intake.start(asyncio.get_running_loop())
        assert intake.ready.is_set() and offsets(fake.assigned) == [("r", 0, 42)]
        await asyncio.wait_for(done.wait(), 5)
        intake.stop()
        return got

    assert asyncio.run(main()) == [[b"GOOD"]]


def test_ready_once_every_topic_has_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, calls = FakeConsumer(), []
    intake = make_intake(monkeypatch, fake, lambda r: None, on_ready=lambda: calls.append(1))
    loop = asyncio.new_event_loop()
    try:
        intake.start(loop)
        assert fake.subscribed == ["a", "b"]
        fake.on_assign(fake, [TopicPartition("a", 0)])
        assert not intake.ready.is_set() and calls == []
        fake.on_assign(fake, [TopicPartition("a", 0), TopicPartition("b", 0)])
        fake.on_assign(fake, [TopicPartition("a", 0), TopicPartition("b", 0)])  # a later rebalance
        assert intake.ready.is_set() and calls == [1]
        assert offsets(fake.assigned) == [("a", 0, 42), ("b", 0, 42)]
    finally:
        intake.stop()
        loop.close()


def test_raw_record_is_the_value_and_where_it_came_from() -> None:
    assert raw_record(Msg(b"v", "t", 2, 5)) == (b"v", ("t", 2, 5))


# -- the stage --------------------------------------------------------------------------------------
def test_the_ready_line_keeps_its_format(capsys: pytest.CaptureFixture[str]) -> None:
    assert ready_line("selector") == "ready: selector"
    announce_ready("worker", "m replica 0 device cpu")
    assert capsys.readouterr().out == "ready: worker m replica 0 device cpu\n"


def test_sigterm_sets_the_stop_event_and_calls_the_callback() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        calls: list[int] = []
        event = stop_on_signals(lambda *a: calls.append(a[0]))
        os.kill(os.getpid(), signal.SIGTERM)
        assert event.wait(2) and calls == [signal.SIGTERM]
        mine = threading.Event()
        assert stop_on_signals(mine) is mine
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])


def _serving(closed: list[str]) -> Any:
    """A task that serves until cancelled and says so when it closes."""
    async def serving() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            closed.append("serving")
    return serving


def test_run_tasks_stops_on_sigterm_and_lets_every_task_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stage_mod, "_FAILED", [])
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    closed: list[str] = []

    async def terminated() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # as `up` stops a stage
            await asyncio.Event().wait()
        finally:
            closed.append("terminated")

    try:
        assert run_tasks([_serving(closed), terminated]) == 0
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
    assert sorted(closed) == ["serving", "terminated"]


def test_a_task_that_raises_stops_the_stage_to_be_restarted(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(stage_mod, "_FAILED", [])
    # ``fail`` arms a watchdog that ends a stage still stopping 30 s on: here, it would end pytest
    monkeypatch.setattr(stage_mod, "_exit_now", lambda reason: None)
    closed: list[str] = []

    async def broken() -> None:
        await asyncio.sleep(0)
        raise ValueError("no such replica")

    assert run_tasks([_serving(closed), broken]) == FATAL_EXIT
    assert closed == ["serving"]
    err = capsys.readouterr().err
    assert "task broken raised ValueError('no such replica')" in err and "to be restarted" in err
