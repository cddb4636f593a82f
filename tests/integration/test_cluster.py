"""Durability on a real 3-broker KRaft cluster: replicated topics, and no acknowledged record
lost when a broker is SIGKILLed.

The cluster is private (its own state dir, free ports), started by the launcher as ``clipstream
infra up --brokers 3`` starts one, and every node is stopped at the end. Select these tests
with ``-m cluster``; they need no session infra.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from clipstream.cli import main
from clipstream.errors import InfraError
from clipstream.infra import launcher, pid_alive
from clipstream.infra.kafka import fetch_jars
from clipstream.infra.readiness import listed_brokers
from clipstream.settings import Settings
from clipstream.testing.leaders import coordinator_of, move_coordinator
from clipstream.testing.procs import wait_until
from topics.admin import ensure_core_topics, ensure_model_topics, watermarks
from topics.catalogue import Catalogue
from topics.client import admin_config, consumer_config, producer_config

pytestmark = pytest.mark.cluster

# Three JVMs start at once on a machine whose two cores other test processes share: the start
# is a bound on a failure, not a wait (it returns as soon as every node answers).
START_TIMEOUT_S = 150.0
# After a SIGKILL, the controller fences the node after broker.session.timeout.ms (see
# clipstream.infra.cluster.FAILURE_DETECTION) and moves leadership and the ISR; a record waits
# at most that long plus an election, and the producer retries it (idempotently) meanwhile.
RECOVERY_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, launcher.InfraStatus]]:
    """A private 3-node cluster (and its Redis); every node stopped at the end."""
    infra_settings = Settings(state_dir=tmp_path_factory.mktemp("cluster"))
    try:
        status = launcher.up(infra_settings, free_ports=True, progress=lambda _: None,
                             timeout_s=START_TIMEOUT_S, die_with_parent=True, brokers=3)
        yield infra_settings, status
    finally:
        launcher.down(infra_settings)


def _client_settings(status: launcher.InfraStatus, tmp_path: Path) -> Settings:
    return Settings(kafka_bootstrap=status.kafka_bootstrap, redis_url=status.redis_url,
                    topic_prefix=f"c{uuid.uuid4().hex[:10]}.", state_dir=tmp_path / "state")


def _produce(producer: Producer, topic: str, values: list[bytes], acked: set[bytes],
             failed: list[KafkaError], timeout_s: float) -> None:
    """Send ``values``; wait until each has its delivery report (acknowledged or failed)."""
    reported = [0]

    def report(err: KafkaError | None, msg: Message) -> None:
        reported[0] += 1
        if err is None:
            acked.add(msg.value())
        else:
            failed.append(err)

    for value in values:
        producer.produce(topic, value, key=value, on_delivery=report)
        producer.poll(0)
    def all_reported() -> bool:
        producer.poll(0.1)  # serves the delivery reports
        return reported[0] == len(values)

    wait_until(all_reported, timeout_s, f"delivery reports of {len(values)} records")


def _describe(admin: AdminClient, kind: str, name: str) -> dict:
    """A resource's configuration, asked again while the broker asked does not know it yet (a
    new topic reaches each broker's metadata a moment after it is created)."""
    errors: list[KafkaException] = []

    def ask() -> dict | None:
        resource = ConfigResource(kind, name)
        try:
            return admin.describe_configs([resource])[resource].result(timeout=10)
        except KafkaException as exc:
            errors.append(exc)
            return None

    try:
        return wait_until(ask, 30, f"the configuration of {kind} {name}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last error: {errors[-1] if errors else None}") from None


def _read_all(settings: Settings, topic: str, partitions: int) -> list[bytes]:
    """Every record of ``topic`` from the start to its high watermark, read from the brokers
    still alive."""
    consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}reader",
                                        **{"enable.auto.commit": False}))
    try:
        ends = {p: watermarks(consumer, TopicPartition(topic, p), 30.0)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[bytes] = []
        done = {p for p, end in ends.items() if end == 0}

        def drained() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
            return len(done) == partitions

        wait_until(drained, 60.0, f"every record of {topic} read back")
        return got
    finally:
        consumer.close()


def test_a_groups_coordinator_moves_to_the_broker_asked_for(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    """What the fault suite does before its broker faults (``clipstream.testing.leaders``):
    each other node in turn, and again the node it is on already."""
    infra_settings, status = cluster
    settings = _client_settings(status, tmp_path)
    group = f"g{uuid.uuid4().hex[:8]}"
    libs = fetch_jars(infra_settings, progress=lambda _: None)
    first = coordinator_of(settings, group)
    others = [n.node_id for n in status.kafka_nodes if n.node_id != first]
    for node in [*others, others[-1]]:
        move_coordinator(settings, libs, group, node)
        assert coordinator_of(settings, group) == node


def test_topics_are_replicated_and_survive_a_broker_kill(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    infra_settings, status = cluster
    assert [n.node_id for n in status.kafka_nodes] == [1, 2, 3] and status.running
    # `up` returned once every node itself listed all three: a topic created now gets 3 copies
    assert [listed_brokers(n.address) for n in status.kafka_nodes] == [3, 3, 3]
    settings = _client_settings(status, tmp_path)
    ensure_core_topics(settings)

    admin = AdminClient(admin_config(settings))
    cat = Catalogue.from_settings(settings)
    names = {spec.name for spec in cat.core()}
    # each broker learns of new topics from the controller a moment later: ask until this
    # client's broker knows them all
    metadata = wait_until(lambda: (md := admin.list_topics(timeout=10)).topics.keys() >= names and md,
                          30, "every broker to know the new topics")
    assert sorted(metadata.brokers) == [1, 2, 3]
    for spec in cat.core():
        replicas = {len(p.replicas) for p in metadata.topics[spec.name].partitions.values()}
        config = _describe(admin, "topic", spec.name)
        assert (replicas, config["min.insync.replicas"].value) == ({3}, "2"), spec.name
    broker_config = _describe(admin, "broker", "1")
    assert broker_config["offsets.topic.replication.factor"].value == "3"
    assert broker_config["transaction.state.log.min.isr"].value == "2"

    topic, partitions = cat.queries.name, cat.queries.partitions
    producer = Producer(producer_config(settings))  # the default every stage uses
    acked: set[bytes] = set()
    failed: list[KafkaError] = []
    before = [f"before-{i}".encode() for i in range(400)]
    _produce(producer, topic, before, acked, failed, 30.0)
    assert not failed and acked == set(before)

    # kill the leader of partition 0: its partitions need a new leader, the others a new ISR
    leader = metadata.topics[topic].partitions[0].leader
    victim = next(n for n in status.kafka_nodes if n.node_id == leader)
    os.kill(victim.pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(victim.pid), 10, "the killed broker to exit")
    t_kill = time.monotonic()

    after = [f"after-{i}".encode() for i in range(200)]
    _produce(producer, topic, after, acked, failed, RECOVERY_TIMEOUT_S)
    recovered_s = time.monotonic() - t_kill
    producer.flush(10)
    assert not failed, f"records refused after the kill: {failed[:3]}"
    assert acked == set(before) | set(after)

    read = _read_all(settings, topic, partitions)
    assert set(read) == acked, f"{len(acked - set(read))} acknowledged records lost"
    assert len(read) == len(acked), "a record was written twice (idempotence is off?)"
    print(f"all {len(after)} records after the kill acknowledged {recovered_s:.1f} s after it")

    # a model's topics made while a broker is down would keep fewer copies for good: refused,
    # with the way out, until the broker is back
    wait_until(lambda: len(admin.list_topics(timeout=10).brokers) == 2, RECOVERY_TIMEOUT_S,
               "the cluster to list two live brokers")
    with pytest.raises(InfraError, match=r"with 3 copies, as the registry has: only 2 broker\(s\) are up.*"
                                         r"clipstream infra up.*CLIPSTREAM_REPLICATION_FACTOR=2"):
        ensure_model_topics(settings, "late")
    assert not any(t.startswith(cat.prefix + "requests.late") for t in admin.list_topics(timeout=10).topics)

    del producer, admin  # librdkafka handles left to the GC would keep calling stopped nodes

    # the CLI names the dead node; `up` restarts it in place; `down` stops all three
    result = CliRunner().invoke(main, ["infra", "status", "--state-dir", str(infra_settings.state_dir)])
    assert result.exit_code == 1 and "2 of 3 nodes running" in result.output
    assert f"kafka node {leader}: " in result.output and "not running" in result.output
    healed = launcher.up(infra_settings, progress=lambda _: None, timeout_s=START_TIMEOUT_S)
    assert healed.running and healed.kafka_bootstrap == status.kafka_bootstrap
    for old, new in zip(status.kafka_nodes, healed.kafka_nodes, strict=True):
        assert (new.pid == old.pid) == (old.node_id != leader), "only the dead node restarts"
    made = ensure_model_topics(settings, "late")  # all three up again: made, with 3 copies
    late = wait_until(lambda: (md := AdminClient(admin_config(settings)).list_topics(timeout=10)).topics.get(made[0])
                      and md, 30, "the new topic in the metadata")
    assert {len(part.replicas) for part in late.topics[made[0]].partitions.values()} == {3}
    pids = [n.pid for n in healed.kafka_nodes]
    stopped = launcher.down(infra_settings)
    assert stopped[:3] == [f"kafka node {i} (pid {pid})" for i, pid in zip((1, 2, 3), pids, strict=True)]
    assert not any(pid_alive(pid) for pid in pids)
