"""Put a consumer group's coordinator on a chosen broker, for the fault suite.

Which broker coordinates a group is the leader of one partition of ``__consumer_offsets``,
picked by a hash of the group's name; which node leads the controller quorum is chance. The
broker faults choose their node (the coordinator alone, then the coordinator that also leads
the quorum), so the coordinator is moved. librdkafka's admin API has no partition
reassignment: ``PreferredLeader.java`` (beside this module) does it with Kafka's own admin
client, run as a single-file program on the broker's jars.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from clipstream.errors import InfraError
from clipstream.infra.kafka import TOOL_JVM_OPTS
from clipstream.settings import Settings
from topics.client import admin_config

OFFSETS_TOPIC = "__consumer_offsets"
PROGRAM = Path(__file__).with_name("PreferredLeader.java")
SETTLED_S = 3.0  # every answer names the new coordinator for this long
JDK_HINT = "apt-get install -y openjdk-17-jdk-headless (a JRE cannot run a Java source file)"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: 31-based over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    units = text.encode("utf-16-le")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "little")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(group: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition whose leader coordinates ``group``, as Kafka picks
    it (``Utils.abs`` maps the one hash without a positive twin to 0)."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def coordinator_of(settings: Settings, group: str, timeout_s: float = 60.0) -> int:
    """The broker that coordinates ``group`` now. A fresh admin client each time: one that
    asked before keeps the coordinator it was told. On a new cluster the first ask creates
    ``__consumer_offsets``, and the answers wait for its leaders."""
    deadline = time.monotonic() + timeout_s
    while True:
        admin = AdminClient(admin_config(settings))
        try:
            (desc,) = [f.result(10) for f in admin.describe_consumer_groups([group]).values()]
            return int(desc.coordinator.id)
        except (KafkaException, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise InfraError(f"no coordinator for group {group} within {timeout_s:g} s: {exc}") from exc
        time.sleep(0.5)


def offsets_partitions(admin: Any, timeout_s: float = 30.0) -> int:
    """How many partitions ``__consumer_offsets`` has. A broker that has not yet applied the
    topic's creation from the metadata log answers with none, or with an error: ask again."""
    deadline = time.monotonic() + timeout_s
    while True:
        topic = admin.list_topics(OFFSETS_TOPIC, timeout=10).topics.get(OFFSETS_TOPIC)
        if topic is not None and topic.error is None and topic.partitions:
            return len(topic.partitions)
        if time.monotonic() > deadline:
            why = "no such topic" if topic is None else topic.error or "no partitions"
            raise InfraError(f"{OFFSETS_TOPIC} shows no partitions within {timeout_s:g} s ({why}); "
                             "check the brokers with `clipstream infra status`")
        time.sleep(0.2)


def move_coordinator(settings: Settings, libs: Path, group: str, broker: int, timeout_s: float = 120.0) -> None:
    """Make ``broker`` the coordinator of ``group``: it leads the group's offsets partition first
    among its replicas, then by a preferred-leader election; returns once the cluster says so."""
    java = shutil.which("java")
    if java is None or shutil.which("javac") is None:
        raise InfraError(f"moving a group's coordinator runs {PROGRAM.name}, which needs a JDK: {JDK_HINT}")
    partition = coordinator_partition(group, offsets_partitions(AdminClient(admin_config(settings))))
    argv = [java, *TOOL_JVM_OPTS, "-cp", str(libs / "*"), str(PROGRAM),
            settings.kafka_bootstrap, OFFSETS_TOPIC, str(partition), str(broker)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise InfraError(f"{PROGRAM.name} could not move {OFFSETS_TOPIC}-{partition} to broker {broker}: "
                         + (done.stderr or done.stdout).strip()[-800:])
    # brokers learn the new leader from the metadata log one after another, so one that has not
    # yet can still name the old coordinator: the move is done once every answer agrees a while
    deadline = time.monotonic() + timeout_s
    since: float | None = None
    while since is None or time.monotonic() - since < SETTLED_S:
        now = coordinator_of(settings, group)
        if now != broker:
            since = None
            if time.monotonic() > deadline:
                raise InfraError(f"group {group} is still coordinated by broker {now}, not {broker}, "
                                 f"{timeout_s:g} s after {OFFSETS_TOPIC}-{partition} was moved")
        elif since is None:
            since = time.monotonic()
        time.sleep(0.2)
