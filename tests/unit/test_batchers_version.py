"""A model's batches move to a new version only once its workers said they are ready."""

from __future__ import annotations

from typing import Any

from batchers.service import BatcherService, ModelSetup
from batchers.settings import BatcherSettings
from batchers.version import MARKER_LEAD_US, VersionSwitch, start_version
from clipstream.clock import now_us
from clipstream.settings import Settings
from schemas import Batch, BatchStats, decode_as, encode
from topics.markers import handover, is_handover, is_retirement, marker_version, ready_marker

S = 1_000_000


def test_the_batches_stay_on_the_old_version_until_every_new_replica_is_ready() -> None:
    sw = VersionSwitch("1", timeout_us=60 * S)
    sw.want("2", 2, now_us=100 * S)
    assert sw.due(101 * S) is None and sw.missing() == [0, 1]
    sw.mark_ready("2", 0, 102 * S)
    assert sw.due(102 * S) is None and sw.missing() == [1]
    sw.mark_ready("1", 1, 103 * S)  # the old version's replica restarted: not the new one's
    assert sw.due(103 * S) is None
    sw.mark_ready("2", 1, 104 * S)
    assert sw.due(104 * S) == "ready"
    assert sw.switch() == "1" and sw.current == "2" and sw.target is None and sw.due(105 * S) is None


def test_a_marker_from_an_earlier_attempt_does_not_count() -> None:
    sw = VersionSwitch("1", timeout_us=600 * S)
    sw.mark_ready("2", 0, 100 * S)  # version 2 was deployed, then undone before it served
    sw.want("2", 1, now_us=100 * S + MARKER_LEAD_US + S)  # deployed again, much later
    assert sw.due(100 * S + MARKER_LEAD_US + S) is None and sw.missing() == [0]
    sw.mark_ready("2", 0, 100 * S + MARKER_LEAD_US + 2 * S)
    assert sw.due(100 * S + MARKER_LEAD_US + 2 * S) == "ready"


def test_a_rollback_waits_for_the_old_version_to_start_again() -> None:
    sw = VersionSwitch("1", timeout_us=600 * S)
    sw.mark_ready("1", 0, 100 * S)  # version 1's worker at its start
    sw.want("2", 1, now_us=101 * S)
    sw.mark_ready("2", 0, 104 * S)
    assert sw.due(104 * S) == "ready" and sw.switch() == "1"  # version 1's worker is told to leave
    rolled_back = 100 * S + MARKER_LEAD_US - S  # its marker is still within the lead
    sw.want("1", 1, now_us=rolled_back)
    assert sw.due(rolled_back) is None and sw.missing() == [0]
    sw.mark_ready("1", 0, rolled_back + 3 * S)  # a new worker of version 1, loaded
    assert sw.due(rolled_back + 3 * S) == "ready" and sw.switch() == "2"


def test_a_marker_just_ahead_of_the_registry_change_counts() -> None:
    sw = VersionSwitch("1", timeout_us=600 * S)
    sw.mark_ready("2", 0, 100 * S)  # the worker read the registry before this batcher did
    sw.want("2", 1, now_us=101 * S)
    assert sw.due(101 * S) == "ready"


def test_a_deploy_undone_before_it_was_ready_moves_nothing_and_a_timeout_moves_anyway() -> None:
    sw = VersionSwitch("1", timeout_us=30 * S)
    sw.want("2", 1, now_us=0)
    sw.want("1", 1, now_us=5 * S)  # rolled back while version 2 was loading
    assert sw.target is None and sw.due(100 * S) is None and sw.current == "1"
    sw.want("3", 1, now_us=200 * S)
    assert sw.due(229 * S) is None and sw.due(230 * S) == "timeout"


def test_a_version_a_worker_could_not_load_never_takes_the_batches_for_want_of_markers() -> None:
    """Version 2's replica said it failed to load: the timeout no longer moves the batches to
    it; a ready marker from every replica still does, and another version times out as before.
    A failure said for an earlier attempt of the same version does not count."""
    sw = VersionSwitch("1", timeout_us=30 * S)
    sw.mark_failed("2", 100 * S - MARKER_LEAD_US - S)  # an earlier attempt at version 2
    sw.want("2", 2, now_us=100 * S)
    assert not sw.failed() and sw.due(130 * S) == "timeout"
    sw.mark_failed("2", 105 * S)
    assert sw.failed() and sw.due(130 * S) is None and sw.due(1000 * S) is None and sw.current == "1"
    sw.mark_ready("2", 0, 1001 * S)
    sw.mark_ready("2", 1, 1002 * S)  # both replicas loaded it after all (a restart)
    assert sw.due(1002 * S) == "ready"
    sw.want("3", 1, now_us=2000 * S)  # another version: its own failures only
    assert not sw.failed() and sw.due(2030 * S) == "timeout"


def test_a_failure_marker_is_an_ordinary_report_that_no_batch_is_credited_for() -> None:
    from topics.markers import FAILED_PREFIX, failed_marker

    marker = decode_as(BatchStats, encode(failed_marker("m", "2", 1, "host:m.1", 5)))
    assert marker_version(marker, FAILED_PREFIX) == "2" and marker_version(marker) is None
    assert marker_version(ready_marker("m", "2", 1, "host:m.1", 5), FAILED_PREFIX) is None


def test_markers_and_handovers_are_ordinary_records_of_their_topics() -> None:
    marker = decode_as(BatchStats, encode(ready_marker("m", "2", 1, "host:1:m.1", 5)))
    assert marker_version(marker) == "2" and marker.replica == 1 and marker.batch_size == 0
    report = BatchStats("ready/2", "m", 0, 3, 10, 0, 0, "w", 5)  # a real batch: its size says so
    assert marker_version(report) is None
    moved = decode_as(Batch, encode(handover("m", "2", 1, "h-1", 7)))
    assert is_handover(moved) and moved.version == "2" and moved.replica == 1


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, int | None]] = []

    def produce(self, topic: str, value: bytes, partition: int | None = None, on_delivery: Any = None) -> None:
        self.sent.append((topic, value, partition))

    def poll(self, timeout: float) -> int:
        return 0


class Guard:
    def available(self) -> bool:
        return True


def service(version: str, replicas: int) -> tuple[BatcherService, FakeProducer]:
    producer = FakeProducer()
    setup = ModelSetup("m", version, replicas, latency_objective_ms=20, max_batch_size=8, batch_delay_ms=0,
                       cache=False)
    svc = BatcherService(Settings(topic_prefix="p."), BatcherSettings(), setup, producer,  # type: ignore[arg-type]
                         guard=Guard())  # type: ignore[arg-type]
    return svc, producer


def stats_record(stats: BatchStats) -> tuple[bytes, tuple[str, int, int]]:
    return encode(stats), ("p.batch-stats.m", 0, 0)


def test_the_service_moves_version_and_replicas_together_and_hands_each_partition_over() -> None:
    svc, producer = service("1", 1)
    svc.resize(2, "2")  # the registry: version 2 with two replicas
    assert svc.core.version == "1" and len(svc.core.dispatcher.replicas) == 1 and producer.sent == []
    svc.accept_stats([stats_record(ready_marker("m", "2", 0, "w0", now_us()))])
    assert svc.core.version == "1"  # replica 1 of version 2 is still loading
    svc.resize(2, "2")  # read again a second later: still waiting
    svc.accept_stats([stats_record(ready_marker("m", "2", 1, "w1", now_us()))])
    assert svc.core.version == "2" and len(svc.core.dispatcher.replicas) == 2
    moved = [(topic, partition, decode_as(Batch, value)) for topic, value, partition in producer.sent]
    assert [(t, p) for t, p, _ in moved] == [("p.batches.m", 0), ("p.batches.m", 1)]
    assert all(is_handover(b) and b.version == "2" for _, _, b in moved)
    svc.resize(1, "2")  # the same version, fewer replicas: at once, and replica 1 is retired
    assert len(svc.core.dispatcher.replicas) == 1 and len(producer.sent) == 3
    topic, value, partition = producer.sent[2]
    gone = decode_as(Batch, value)
    assert (topic, partition) == ("p.batches.m", 1) and is_retirement(gone) and gone.version == "2"
    svc.resize(1, "2")  # read again: nothing more is sent
    assert len(producer.sent) == 3


def test_more_replicas_of_the_same_version_wait_for_their_workers() -> None:
    sw = VersionSwitch("1", timeout_us=60 * S)
    assert sw.growth_due(100 * S) is None  # nothing asked
    sw.want_more(1, 3, now_us=100 * S)
    sw.mark_ready("1", 1, 101 * S)
    assert sw.growth_due(101 * S) is None  # replica 2 is still loading
    sw.want_more(1, 3, now_us=150 * S)  # the registry read again: the wait keeps its start
    sw.mark_ready("2", 2, 102 * S)  # another version's marker says nothing
    assert sw.growth_due(159 * S) is None and sw.growth_due(160 * S) == "timeout"
    sw.mark_ready("1", 2, 103 * S)
    assert sw.growth_due(103 * S) == "ready"
    sw.grown()
    assert sw.growth_due(200 * S) is None


def test_the_service_sends_a_new_replica_batches_once_its_worker_is_ready() -> None:
    svc, _ = service("1", 1)
    svc.resize(2, "1")  # `set-replicas m 2`
    assert len(svc.core.dispatcher.replicas) == 1  # replica 1's worker is still starting
    svc.resize(2, "1")  # read again
    assert len(svc.core.dispatcher.replicas) == 1
    svc.accept_stats([stats_record(ready_marker("m", "1", 1, "w1", now_us()))])
    assert len(svc.core.dispatcher.replicas) == 2
    svc.resize(1, "1")  # and back: at once, with the retirement
    assert len(svc.core.dispatcher.replicas) == 1


def test_a_batcher_starts_at_the_version_its_batches_carry_while_the_new_one_loads() -> None:
    known = ("1", "3")
    assert start_version("3", known, ["1", "1"]) == "1"  # version 3's workers not ready before this start
    assert start_version("3", known, ["3", "1"]) == "3"  # some replica moved already: the registry's
    assert start_version("3", known, []) == "3"  # nothing sent yet
    assert start_version("3", known, [None]) == "3"
    assert start_version("3", known, ["7"]) == "3"  # a version the model never had: not trusted
