"""Serving while Redis is away: the guard, the remembered policy states, the stored
predictions written off the answer path, and feedback offsets that never pass what waits for
Redis. Pure logic with stand-ins for Redis and the consumer; the real freeze is
``tests/integration/test_redis_freeze.py``."""

from __future__ import annotations

import json
import threading
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from redis.exceptions import TimeoutError as RedisTimeout

from clipstream.redisclient import RedisGuard, client_options
from clipstream.settings import Settings
from clipstream.testing.procs import wait_until
from selector.learn import FeedbackOffsets, Learner
from clipstream.saver import PredictionSaver
from selector.store import StateStore, state_key
from tests.fakes import FakeMsg


class Flaky:
    """A Redis stand-in that times out while ``away`` is set."""

    def __init__(self, data: dict[str, str] | None = None) -> None:
        self.data = {k: v.encode() for k, v in (data or {}).items()}
        self.away = threading.Event()
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.away.is_set():
            raise RedisTimeout("Timeout reading from socket")

    def ping(self) -> bool:
        self._check()
        return True

    def get(self, key: str) -> bytes | None:
        self._check()
        return self.data.get(key)

    def mget(self, keys: list[str]) -> list[bytes | None]:
        self._check()
        return [self.data.get(k) for k in keys]

    def pipeline(self, transaction: bool = False) -> Any:
        flaky = self
        ops: list[tuple[str, str]] = []
        return SimpleNamespace(set=lambda k, v, ex: ops.append((k, v)),
                               execute=lambda: (flaky._check(), flaky.data.update({k: v.encode() for k, v in ops})))


def test_the_timeout_setting_reaches_every_client() -> None:
    opts = client_options(Settings(redis_timeout_ms=250))
    assert opts == {"socket_timeout": 0.25, "socket_connect_timeout": 0.25}
    with pytest.raises(ValueError):
        Settings(redis_timeout_ms=0)


def test_the_guard_is_down_from_a_failure_until_a_probe_answers() -> None:
    r = Flaky()
    guard = RedisGuard(r.ping, probe_every_s=0.01)
    assert guard.available()
    r.away.set()
    guard.failed(RedisTimeout("frozen"))
    guard.failed(RedisTimeout("again"))  # one outage, one prober
    assert not guard.available() and guard.outages == 1
    assert not guard.wait_available(0.1)  # the probes keep failing
    r.away.clear()
    assert guard.wait_available(5.0) and guard.since is None
    r.away.set()
    guard.failed(RedisTimeout("frozen again"))  # a second outage gets a prober again
    assert not guard.available() and guard.outages == 2
    r.away.clear()
    assert guard.wait_available(5.0)
    guard.close()


def test_states_are_recalled_from_what_was_last_read() -> None:
    data = {state_key("a", "c1"): json.dumps({"own": 1}), state_key("a", None): json.dumps({"glob": 1})}
    store = StateStore(Flaky(data))  # type: ignore[arg-type]
    read = store.load_many([("a", "c1"), ("a", None), ("b", None)])
    read[("a", "c1")]["own"] = 99  # a caller's change is not the remembered state
    recalled = store.recall([("a", "c1"), ("a", None), ("a", "never-read"), ("b", None), ("z", "x")])
    assert recalled == {("a", "c1"): {"own": 1}, ("a", None): {"glob": 1}, ("a", "never-read"): {"glob": 1},
                        ("b", None): None, ("z", "x"): None}
    small = StateStore(Flaky(data), remember=1)  # type: ignore[arg-type]
    small.load_many([("a", "c1")])
    small.load_many([("a", None)])
    assert small.recall([("a", "c1")]) == {("a", "c1"): {"glob": 1}}  # c1 was forgotten: the global


def test_the_selector_answers_from_memory_while_redis_is_away() -> None:
    from selector.service import Selector

    r = Flaky({state_key("app", None): json.dumps({"glob": 1})})
    store = StateStore(r)  # type: ignore[arg-type]
    guard = RedisGuard(r.ping, probe_every_s=0.01)
    sel = Selector(None, None, store, None, None, None, None, guard=guard)  # type: ignore[arg-type]
    assert sel.states([("app", "c")]) == {("app", "c"): {"glob": 1}}
    r.away.set()
    calls = r.calls
    assert sel.states([("app", "c")]) == {("app", "c"): {"glob": 1}}  # the failed MGET, then memory
    assert not guard.available() and r.calls == calls + 1
    probes = r.calls
    assert sel.states([("app", "d")]) == {("app", "d"): {"glob": 1}}
    assert r.calls - probes <= 5, "while away, the selector itself does not ask Redis"  # only the prober
    assert sel.stats["recalled_states"] == 2
    r.away.clear()
    assert guard.wait_available(5.0)
    guard.close()


def test_stored_predictions_wait_for_redis_and_go_out_after() -> None:
    r = Flaky()
    guard = RedisGuard(r.ping, probe_every_s=0.01)
    saver = PredictionSaver(r, 3600, guard, capacity=3).start()  # type: ignore[arg-type]
    saver.put("q0", {"app": "a"})
    wait_until(lambda: "cs:pred:q0" in r.data, 5, "q0 stored")
    r.away.set()
    for i in range(1, 5):  # one more than the capacity while away: the oldest goes
        saver.put(f"q{i}", {"app": "a", "i": i})
    wait_until(lambda: not guard.available(), 5, "the failed write to mark Redis away")
    assert saver.pending() == 3 and saver.stats["dropped"] == 1
    r.away.clear()
    wait_until(lambda: saver.pending() == 0, 5, "the queued predictions to be written")
    assert {k for k in r.data} == {"cs:pred:q0", "cs:pred:q2", "cs:pred:q3", "cs:pred:q4"}
    assert json.loads(r.data["cs:pred:q4"]) == {"app": "a", "i": 4}
    saver.close()
    guard.close()


def test_stored_predictions_answered_within_the_gather_window_share_one_round_trip() -> None:
    r = Flaky()
    executes: list[int] = []
    pipeline = r.pipeline

    def counted(transaction: bool = False) -> Any:
        p = pipeline(transaction)
        run = p.execute
        p.execute = lambda: (executes.append(1), run())
        return p

    r.pipeline = counted  # type: ignore[method-assign]
    guard = RedisGuard(r.ping, probe_every_s=0.01)
    saver = PredictionSaver(r, 3600, guard, gather_s=0.5).start()  # type: ignore[arg-type]
    for i in range(10):
        saver.put(f"q{i}", {"app": "a", "i": i})
    wait_until(lambda: saver.pending() == 0, 5, "the ten predictions to be written")
    assert len(executes) == 1 and len([k for k in r.data if k.startswith("cs:pred:")]) == 10
    saver.put("late", {"app": "a"})  # the writer waits on an empty queue again: put wakes it
    wait_until(lambda: "cs:pred:late" in r.data, 5, "a put after the group to be written")
    assert len(executes) == 2
    saver.close()
    guard.close()


Msg = partial(FakeMsg, b"", "fb")  # Msg(partition, offset) on the feedback topic


def test_feedback_offsets_never_pass_a_parked_record() -> None:
    o = FeedbackOffsets()
    assert o.done(Msg(0, 5)) == TopicPartition("fb", 0, 6)
    assert o.park(Msg(0, 6)) == TopicPartition("fb", 0, 6)
    assert o.done(Msg(0, 7)) == TopicPartition("fb", 0, 6)  # 6 still waits
    assert o.done(Msg(1, 3)) == TopicPartition("fb", 1, 4)  # other partitions go on
    assert o.finish_parked(Msg(0, 6)) == TopicPartition("fb", 0, 8)


class FakeConsumer:
    def __init__(self) -> None:
        self.stored: list[tuple[int, int]] = []
        self.paused = False
        self.seeks: list[tuple[int, int]] = []

    def store_offsets(self, offsets: list[TopicPartition]) -> None:
        self.stored += [(tp.partition, tp.offset) for tp in offsets]

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("fb", 0), TopicPartition("fb", 1)]

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused = True

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused = False

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.partition, tp.offset))


def test_the_learner_holds_feedback_while_redis_is_away_and_rewinds_after() -> None:
    r = Flaky()
    guard = RedisGuard(r.ping, probe_every_s=0.01)
    consumer = FakeConsumer()
    learner = Learner(consumer, None, None, None, guard=guard)  # type: ignore[arg-type]
    applied: list[tuple[int, int]] = []

    def handle(msg: FakeMsg, give_up_at: float | None = None) -> bool:
        r._check()  # what ``load_predictions`` does first
        applied.append((msg.partition(), msg.offset()))
        return True

    learner.handle = handle  # type: ignore[method-assign]
    learner._apply([Msg(0, 10), Msg(1, 20)])
    assert consumer.stored == [(0, 11), (1, 21)]
    r.away.set()
    learner._apply([Msg(0, 11), Msg(1, 21), Msg(0, 12)])
    assert consumer.paused and not guard.available()
    assert consumer.stored == [(0, 11), (1, 21)], "nothing stored past the feedback not applied"
    assert learner._rewind == {("fb", 0): 11, ("fb", 1): 21}
    r.away.clear()
    stop = threading.Event()
    runner = threading.Thread(target=learner.run, args=(stop, 0.01), daemon=True)
    consumer.poll = lambda timeout: (stop.set(), None)[1]  # type: ignore[attr-defined]
    consumer.consume = lambda n, timeout: []  # type: ignore[attr-defined]
    runner.start()
    runner.join(5)
    assert not consumer.paused and sorted(consumer.seeks) == [(0, 11), (1, 21)] and not learner._rewind
    assert applied == [(0, 10), (1, 20)]  # the held ones come again from Kafka, from the seek
    guard.close()
