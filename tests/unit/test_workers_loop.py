"""The worker's pipeline with fake Kafka and Redis clients: outputs first, and an offset is
committed only after the broker acknowledged every record its batch produced."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipstream.settings import Settings
from registry.spec import load_spec
from schemas import Batch, BatchItem, BatchStats, DeadLetter, Predictions, Tensor, decode_as, encode
from clipstream.testing.models import make_profile_model
from topics.markers import RETIRE_PREFIX
from workers.backends import BatchModel, load_model
from workers.worker import Worker


class Msg:
    def __init__(self, value: bytes, offset: int, topic: str = "p.batches.sim") -> None:
        self._value, self._offset, self._topic = value, offset, topic

    def error(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return 0

    def topic(self) -> str:
        return self._topic


class FakeProducer:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, int | None, bytes]] = []
        self.unacked: list[Any] = []
        self.fail = fail
        self.log: list[str] = []

    def produce(self, topic: str, value: bytes, on_delivery: Any, partition: int | None = None) -> None:
        self.sent.append((topic, partition, value))
        self.unacked.append((on_delivery, topic))
        self.log.append("produce")

    def poll(self, timeout: float) -> int:
        return 0

    def pending(self) -> int:  # as an Emitter: records whose reports are not served yet
        return len(self.unacked)

    def flush(self, timeout: float) -> int:
        for callback, topic in self.unacked:
            callback("broker down" if self.fail else None, Msg(b"", 0, topic))
        self.unacked.clear()
        self.log.append("flush")
        return 0


class FakeConsumer:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.commits: list[int] = []
        self.seeks: list[int] = []
        self.fetched: list[Msg] = []  # what a poll returns next (the broker's next batches)

    def poll(self, timeout: float) -> Msg | None:
        return self.fetched.pop(0) if self.fetched else None

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.commits.append(offsets[0].offset)
        self.log.append("commit")

    def seek(self, tp: Any) -> None:
        self.seeks.append(tp.offset)


class FakeCacheWrites:
    """The worker's unanswered cache writes: each ``send`` is one write of every command."""

    def __init__(self) -> None:
        self.store: dict[str, Any] = {}

    def send(self, commands: list[tuple[Any, ...]]) -> None:
        self.store["writes"] = self.store.get("writes", 0) + 1
        for verb, key, value, ex_word, ex in commands:
            assert (verb, ex_word) == ("SET", "EX")
            self.store[key] = (value, ex)


def batch_bytes(n: int, items: int = 3, version: str | None = "1", created_us: int = 1) -> bytes:
    its = [BatchItem(query_id=f"b{n}q{i}", selector_partition=i % 2, deadline_us=10**18,
                     cache_key=f"k{n}.{i}", input=Tensor.of(np.full(4, i, dtype=np.float32)))
           for i in range(items)]
    return encode(Batch(batch_id=f"b{n}", model="sim", version=version, replica=0, created_us=created_us,
                        items=its))


def make_worker(tmp_path: Path, fail: bool = False, table: dict[int, float] | None = None,
                own_version_only: bool = False, model: BatchModel | None = None,
                ) -> tuple[Worker, FakeProducer, FakeConsumer, FakeCacheWrites]:
    """A worker of model ``sim`` version 1 (``model``, else a simulated one taking 4 floats)
    with fake clients; ``fail``: the broker never acknowledges."""
    if model is None:
        folder = make_profile_model(tmp_path, "sim", table=table or {1: 0.0}, shape=[4], labels=[0, 1])
        model = load_model(load_spec(folder))
    w = Worker(Settings(topic_prefix="p."), model, "sim", version="1", own_version_only=own_version_only)
    w.producer = producer = FakeProducer(fail)  # type: ignore[assignment]
    w.consumer = consumer = FakeConsumer(producer.log)  # type: ignore[assignment]
    w.cache_writes = cache = FakeCacheWrites()  # type: ignore[assignment]
    w.ws = w.ws.model_copy(update={"flush_timeout_s": 5.0})
    w.selector_partitions = 4
    w.start_pipeline()
    return w, producer, consumer, cache


def test_outputs_are_acknowledged_before_the_offset_is_committed(tmp_path: Path) -> None:
    w, producer, consumer, cache = make_worker(tmp_path)
    w.feed(Msg(batch_bytes(0), 10))
    w.feed(Msg(batch_bytes(1), 11))
    assert w.drain(5.0)
    w.housekeep()
    assert consumer.commits == []  # produced, not yet acknowledged
    producer.flush(0)
    w.housekeep()
    assert consumer.commits == [12]
    topics = [(t, p) for t, p, _ in producer.sent]
    assert topics.count(("p.predictions", 0)) == 2 and topics.count(("p.predictions", 1)) == 2
    assert topics.count(("p.batch-stats.sim", None)) == 2
    first = decode_as(Predictions, producer.sent[0][2])
    assert first.selector_partition == 0 and [p.query_id for p in first.items] == ["b0q0", "b0q2"]
    assert cache.store["writes"] == 2 and cache.store["k1.2"][1] == w.settings.cache_ttl_s


def test_the_device_runs_a_batch_while_the_next_is_read(tmp_path: Path) -> None:
    """With a 600 ms simulated device, a batch that arrives while the one before it runs is
    pipelined: the first one's outputs go to the emitter thread, and the third batch is read and
    checked while the second runs on the device thread. (The device time is what the main thread
    may be held off a core between two reads without the third batch finding the device idle.)"""
    w, producer, consumer, _ = make_worker(tmp_path, table={1: 600.0, 3: 600.0})
    consumer.fetched.append(Msg(batch_bytes(1), 1))  # arrives while batch 0 is on the device
    nxt = w.feed(Msg(batch_bytes(0), 0))
    assert nxt is not None and nxt.offset() == 1
    assert w.feed(nxt) is None
    assert w.feed(Msg(batch_bytes(2), 2)) is None  # returns while batch 1 is still on the device
    assert not any(v for t, _, v in producer.sent if t == "p.batch-stats.sim" and b"b2" in v)
    assert w.drain(5.0)
    stats = [decode_as(BatchStats, v) for t, _, v in producer.sent if t == "p.batch-stats.sim"]
    assert [s.batch_id for s in stats] == ["b0", "b1", "b2"] and all(s.service_us >= 590_000 for s in stats)


def test_an_idle_worker_serves_a_batch_on_its_main_thread(tmp_path: Path) -> None:
    """With nothing in the pipeline, a batch is run and written out before ``feed`` returns,
    by the calling thread: no hand-off wakes the device and emitter threads."""
    w, producer, consumer, cache = make_worker(tmp_path)
    threads: list[str] = []
    send = producer.produce

    def produce(*args: Any, **kwargs: Any) -> None:
        threads.append(threading.current_thread().name)
        send(*args, **kwargs)

    producer.produce = produce  # type: ignore[method-assign]
    assert w.feed(Msg(batch_bytes(0), 4)) is None
    assert [t for t, _, _ in producer.sent].count("p.batch-stats.sim") == 1  # done already
    assert set(threads) == {threading.current_thread().name} and cache.store["writes"] == 1
    producer.flush(0)
    w.housekeep()
    assert consumer.commits == [5]


def test_undelivered_outputs_mean_no_commit_and_a_redo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workers.worker.time.sleep", lambda s: None)
    w, producer, consumer, _ = make_worker(tmp_path, fail=True)
    w.feed(Msg(batch_bytes(0), 5))
    w.feed(Msg(batch_bytes(1), 6))
    assert w.drain(5.0)
    producer.flush(0)
    assert w.housekeep() is True
    assert consumer.commits == [] and consumer.seeks == [5]
    assert len(w.tracker) == 0  # read again from offset 5 after the seek


def test_garbage_batch_is_a_dead_letter_and_is_committed(tmp_path: Path) -> None:
    w, producer, consumer, _ = make_worker(tmp_path)
    w.feed(Msg(b"\x00garbage", 3))
    assert w.drain(5.0)
    producer.flush(0)
    w.housekeep()
    ((topic, _, value),) = producer.sent
    letter = decode_as(DeadLetter, value)
    assert topic == "p.deadletter" and letter.source_offset == 3 and letter.payload == b"\x00garbage"
    assert consumer.commits == [4]


def test_a_crashing_batch_is_dead_lettered_not_a_crash_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w, producer, consumer, _ = make_worker(tmp_path)

    def boom(*args: Any, **kwargs: Any) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr("workers.group.finish_batch", boom)  # where the worker finishes a batch
    w.feed(Msg(batch_bytes(0), 8))
    assert w.drain(5.0)
    producer.flush(0)
    w.housekeep()
    ((topic, _, value),) = producer.sent
    assert topic == "p.deadletter" and "KeyError" in decode_as(DeadLetter, value).reason
    assert consumer.commits == [9]


def test_offset_commits_are_spaced_but_the_last_one_is_made_when_stopping(tmp_path: Path) -> None:
    w, producer, consumer, _ = make_worker(tmp_path)
    w.ws = w.ws.model_copy(update={"commit_interval_s": 60.0})
    for offset in (10, 11):
        w.feed(Msg(batch_bytes(offset), offset))
        assert w.drain(5.0)
        producer.flush(0)
        w.housekeep()
    assert consumer.commits == [11]  # the second waits for the interval
    w.housekeep(asynchronous=False)  # what stopping does
    assert consumer.commits == [11, 12]


def _reported(w: Worker, producer: FakeProducer) -> list[BatchStats]:
    """Drain the worker, acknowledge what it produced, commit: the batches it reported."""
    assert w.drain(5.0)
    producer.flush(0)
    w.housekeep()
    return [decode_as(BatchStats, v) for t, _, v in producer.sent if t == "p.batch-stats.sim"]


def test_a_deployed_worker_serves_only_its_version_and_stops_at_the_handover(tmp_path: Path) -> None:
    """Beside version 2's worker, version 1's skips version 2's batches; the batcher's empty
    batch stamped 2, made after it was ready, means none of version 1's follow: it stops, and
    every offset it read, the skipped ones too, is committed."""
    w, producer, consumer, _ = make_worker(tmp_path, own_version_only=True)
    w.ready_us = 1000
    w.feed(Msg(batch_bytes(0, created_us=900, version="2"), 0))  # from before: skipped, and it serves on
    w.feed(Msg(batch_bytes(1, items=0, created_us=900, version="2"), 1))  # an old handover: no stop
    assert w.running
    w.feed(Msg(batch_bytes(2, created_us=1100), 2))  # its own version: served
    w.feed(Msg(batch_bytes(3, items=0, created_us=1200, version="2"), 3))  # the handover
    assert not w.running
    stats = _reported(w, producer)
    assert [s.batch_id for s in stats] == ["b2"] and consumer.commits == [4]


@pytest.mark.parametrize("own_version_only", [True, False])
def test_a_retired_replica_serves_the_batches_before_its_retirement_then_stops(
    tmp_path: Path, own_version_only: bool
) -> None:
    """Scaled down, the same version: the batcher's retirement on this partition, made after
    the worker was ready, follows the last batch sent to it; an older one is from before."""
    w, producer, consumer, _ = make_worker(tmp_path, own_version_only=own_version_only)
    w.ready_us = 1000
    # ids of the shape of batch_bytes's ("b1"): the batches' own batcher (``topics.markers.sender_of``)
    old = Batch(batch_id=f"{RETIRE_PREFIX}1", model="sim", version="1", replica=0, created_us=900, items=[])
    w.feed(Msg(encode(old), 0))  # a retirement from before this worker was ready: it serves on
    assert w.running
    w.feed(Msg(batch_bytes(1, created_us=1100), 1))
    w.feed(Msg(encode(Batch(batch_id=f"{RETIRE_PREFIX}2", model="sim", version="1", replica=0,
                            created_us=1200, items=[])), 2))
    assert not w.running
    stats = _reported(w, producer)
    assert [s.batch_id for s in stats] == ["b1"] and consumer.commits == [3]


def _sent(sender: str, n: int, items: int = 3, created_us: int = 1100) -> Msg:
    """Batch ``n`` of batcher ``sender``, as the batcher names it (a retirement when ``items`` is 0)."""
    batch_id = f"{RETIRE_PREFIX if not items else ''}{sender}-{n}"
    its = [BatchItem(query_id=f"{sender}{n}q{i}", selector_partition=0, deadline_us=10**18, cache_key=None,
                     input=Tensor.of(np.full(4, i, dtype=np.float32))) for i in range(items)]
    return Msg(encode(Batch(batch_id=batch_id, model="sim", version="1", replica=0, created_us=created_us,
                            items=its)), n)


def test_a_retired_replica_waits_for_every_batcher_that_sent_to_it(tmp_path: Path) -> None:
    """Two batcher members send to one partition and retire it a moment apart: the batch the
    later one sent after the first retirement is served, and the worker stops at the second."""
    w, producer, consumer, _ = make_worker(tmp_path)
    w.ready_us = 1000
    w.feed(_sent("m1", 1))
    w.feed(_sent("m2", 2))
    w.feed(_sent("m1", 3, items=0))  # the first member's retirement
    assert w.running and w.senders.waiting_for() == ["m2"]
    w.feed(_sent("m2", 4))  # the later member had not read the registry change yet
    assert w.running
    w.feed(_sent("m2", 5, items=0))
    assert not w.running
    stats = _reported(w, producer)
    assert [s.batch_id for s in stats] == ["m1-1", "m2-2", "m2-4"] and consumer.commits == [6]


def test_a_worker_given_only_a_folder_serves_any_version_but_never_an_empty_batch(tmp_path: Path) -> None:
    w, producer, consumer, _ = make_worker(tmp_path)
    w.ready_us = 1000
    w.feed(Msg(batch_bytes(0, version="7", created_us=2000), 0))
    w.feed(Msg(batch_bytes(1, items=0, version="7", created_us=2000), 1))
    assert w.running and w.drain(5.0)
    stats = [decode_as(BatchStats, v) for t, _, v in producer.sent if t == "p.batch-stats.sim"]
    assert [s.batch_id for s in stats] == ["b0"]


class Eof:
    def code(self) -> int:
        from confluent_kafka import KafkaError

        return KafkaError._PARTITION_EOF


class EofMsg(Msg):
    def __init__(self) -> None:
        super().__init__(b"", 0)

    def error(self) -> Any:  # type: ignore[override]
        return Eof()


class Polls:
    """A consumer whose polls return nothing a few times (a fetch under way), then ``last``."""

    def __init__(self, last: Any, empty: int = 3) -> None:
        self.results = [None] * empty + [last]

    def poll(self, timeout: float) -> Any:
        return self.results.pop(0) if len(self.results) > 1 else self.results[0]


def test_a_worker_is_ready_only_once_its_consumer_has_fetched(tmp_path: Path) -> None:
    """The first fetch after an assignment can take a second; until it came, a worker that said
    ready would leave a version change's first batches waiting. A batch read then is kept."""
    w, *_ = make_worker(tmp_path)
    w.consumer = Polls(EofMsg())  # type: ignore[assignment]
    assert w._first_fetch(5.0) is None  # caught up: the partition has nothing more
    first = Msg(batch_bytes(0), 0)
    w.consumer = Polls(first)  # type: ignore[assignment]
    assert w._first_fetch(5.0) is first  # fed before the next poll
    w.consumer = Polls(None, empty=0)  # type: ignore[assignment]
    with pytest.raises(Exception, match="nothing fetched"):
        w._first_fetch(0.2)
