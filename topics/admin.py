"""Idempotent topic creation with the AdminClient.

It is also where a stage first meets Kafka: every stage makes sure of its topics (or of the
registry's) before anything else, so ``ensure_topics`` is where a stage started with no Kafka
finds out, and says so in one line.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewPartitions, NewTopic

from clipstream.errors import InfraError
from clipstream.settings import Settings
from topics.catalogue import Catalogue, TopicSpec, durability_config, replication_for
from topics.client import admin_config


def ensure_topics(
    settings: Settings, specs: Iterable[TopicSpec], timeout_s: float = 30.0
) -> list[str]:
    """Create the topics that do not exist and grow ones with too few partitions.

    Returns the names created or grown. Waits until the broker's metadata shows every topic
    with its partitions, so a producer that starts right after finds them. New topics get
    ``CLIPSTREAM_REPLICATION_FACTOR`` copies, or by default ``min(3, brokers)`` for the
    brokers the cluster lists now, with ``min.insync.replicas`` to match. A process that has
    not yet reached Kafka gets InfraError within ``UNREACHABLE_S`` when no broker takes a
    connection (``_first_metadata``), not after ``timeout_s``.
    """
    specs = list(specs)
    watch = BrokerWatch()
    admin = AdminClient({**admin_config(settings), "error_cb": watch})
    metadata = _first_metadata(admin, settings, timeout_s, watch)
    existing = metadata.topics
    changed: list[str] = []
    rf = replication_factor(settings, len(metadata.brokers))
    new = [
        NewTopic(s.name, s.partitions, rf, config={**durability_config(rf), **s.config})
        for s in specs
        if s.name not in existing
    ]
    if new:
        _refuse_fewer_copies(settings, metadata, rf, [t.topic for t in new])
        for name, fut in admin.create_topics(new, operation_timeout=timeout_s).items():
            try:
                fut.result()
                changed.append(name)
            except KafkaException as exc:
                code = exc.args[0].code()
                if code == KafkaError.INVALID_REPLICATION_FACTOR:
                    raise InfraError(
                        f"cannot create topic {name} with {rf} replicas on "
                        f"{len(metadata.brokers)} live broker(s): start the missing brokers or "
                        "set CLIPSTREAM_REPLICATION_FACTOR to at most the broker count"
                    ) from exc
                if code != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise InfraError(f"cannot create topic {name}: {exc}") from exc
    grow = [
        NewPartitions(s.name, s.partitions)
        for s in specs
        if s.name in existing and len(existing[s.name].partitions) < s.partitions
    ]
    if grow:
        for name, fut in admin.create_partitions(grow, operation_timeout=timeout_s).items():
            try:
                fut.result()
                changed.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.INVALID_PARTITIONS:
                    raise InfraError(f"cannot grow topic {name}: {exc}") from exc
    if new or grow or any(existing[s.name].error is not None for s in specs if s.name in existing):
        _wait_for(admin, specs, timeout_s)  # a restart finds them all: no second round trip
    return changed


# how long a process that has not yet had Kafka's metadata waits when librdkafka says every
# broker it knows is down (refused, unresolvable, cut off): a stage started with no Kafka says
# so within seconds, while one that finds Kafka slow to answer still waits ``timeout_s``
UNREACHABLE_S = 5.0

# set once this process has had metadata from Kafka: from then on an outage (a failover, a
# restart of the broker) is waited out for the whole ``timeout_s``, as it may pass
_REACHED = threading.Event()

_KAFKA_CHECK = "check CLIPSTREAM_KAFKA_BOOTSTRAP with `clipstream infra status`, or start Kafka with `clipstream infra up`"
CREDENTIALS_CHECK = ("check CLIPSTREAM_KAFKA_SASL_USERNAME, CLIPSTREAM_KAFKA_SASL_PASSWORD and "
                      "CLIPSTREAM_KAFKA_SASL_MECHANISM against the broker's users")

# what a broker error quoted in that line can do without: the broker's name (the line names the
# bootstrap list) and how long the attempt took
_BROKER_PREFIX = re.compile(r"^\S+/\S+: ")
_AFTER = re.compile(r"\s*\(after [^()]*\)$")


class BrokerWatch:
    """An admin client's ``error_cb``: whether librdkafka found every broker down, and the last
    broker error it reported (what the one error line quotes). Called where the client is
    polled."""

    def __init__(self) -> None:
        self.all_down = False
        self.last: str | None = None
        self.refused: str | None = None  # the broker answered, and refused this client's credentials

    def __call__(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self.all_down = True
            return
        # "host:port/bootstrap: Connect to ... failed: ... (after 0ms in state CONNECT)"
        self.last = _BROKER_PREFIX.sub("", _AFTER.sub("", err.str()))
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            self.refused = self.last

    def refusal(self, settings: Settings) -> InfraError:
        return credentials_refused(settings.kafka_bootstrap, self.refused or "")


def credentials_refused(bootstrap: str, why: str) -> InfraError:
    """The error for a broker that answered and refused this client's credentials, naming what
    to check: waiting longer will not change its mind."""
    return InfraError(f"Kafka at {bootstrap} refused this client's credentials ({why}): {CREDENTIALS_CHECK}")


def _first_metadata(admin: AdminClient, settings: Settings, timeout_s: float, watch: BrokerWatch) -> ClusterMetadata:
    """The cluster's metadata; InfraError, naming CLIPSTREAM_KAFKA_BOOTSTRAP, if it does not come.

    Until this process has once had metadata (a stage's start, a CLI verb), the first request
    waits ``UNREACHABLE_S``, and if by then librdkafka has found every broker down the caller
    is told at once: nothing listens there. Otherwise (a broker that took the connection but
    is slow to answer, or a process that has had Kafka before) the wait goes on to
    ``timeout_s``. The client is polled after a failed request so that its log lines (folded,
    ``topics.kafkalog``) and errors are served before the error that ends the stage."""
    start = time.monotonic()
    fast = not _REACHED.is_set()
    waits = [min(UNREACHABLE_S, timeout_s), timeout_s] if fast and timeout_s > UNREACHABLE_S else [timeout_s]
    failure: KafkaException | None = None
    for until in waits:
        try:
            metadata = admin.list_topics(timeout=max(0.1, start + until - time.monotonic()))
        except KafkaException as exc:
            failure = exc
            admin.poll(0)
            if watch.refused:  # it answered: waiting longer will not change its mind
                raise watch.refusal(settings) from exc
            if fast and watch.all_down:
                why = f" ({watch.last})" if watch.last else ""
                raise InfraError(
                    f"Kafka at {settings.kafka_bootstrap} (CLIPSTREAM_KAFKA_BOOTSTRAP) does not answer: "
                    f"no broker took a connection within {until:g}s{why}; {_KAFKA_CHECK}"
                ) from exc
            fast = False  # a broker took the connection: slow, not away; wait it out
            continue
        _REACHED.set()
        return metadata
    raise InfraError(
        f"Kafka at {settings.kafka_bootstrap} (CLIPSTREAM_KAFKA_BOOTSTRAP) does not answer within "
        f"{timeout_s:g}s ({watch.last or failure}); {_KAFKA_CHECK}"
    ) from failure


def _refuse_fewer_copies(settings: Settings, metadata: ClusterMetadata, rf: int, names: list[str]) -> None:
    """Refuse to create topics with fewer copies than the registry has, unless asked to by
    ``CLIPSTREAM_REPLICATION_FACTOR``: with a broker of the cluster down, the default would
    give them fewer copies for good (Kafka does not add copies when the broker returns), and
    losing one more broker would lose their records."""
    if settings.replication_factor:
        return
    registry = metadata.topics.get(Catalogue.from_settings(settings).registry.name)
    if registry is None or registry.error is not None or not registry.partitions:
        return  # a new cluster: the brokers listed now are the cluster
    intended = max(len(p.replicas) for p in registry.partitions.values())
    if rf < intended:
        raise InfraError(
            f"cannot create {', '.join(sorted(names))} with {intended} copies, as the registry has: only "
            f"{len(metadata.brokers)} broker(s) are up. Start the missing ones (`clipstream infra status` names "
            f"them, `clipstream infra up` restarts them) and run this again; or set "
            f"CLIPSTREAM_REPLICATION_FACTOR={rf} to create them with {rf}")


def replication_factor(settings: Settings, brokers: int) -> int:
    """``CLIPSTREAM_REPLICATION_FACTOR`` when set, else what the cluster's size allows."""
    return settings.replication_factor or replication_for(brokers)


def _wait_for(admin: AdminClient, specs: list[TopicSpec], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        topics = admin.list_topics(timeout=timeout_s).topics
        missing = [
            s.name
            for s in specs
            if s.name not in topics
            or topics[s.name].error is not None
            or len(topics[s.name].partitions) < s.partitions
        ]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise InfraError(f"topics not ready after {timeout_s:.0f}s: {missing}")
        time.sleep(0.05)


def ensure_core_topics(settings: Settings) -> list[str]:
    return ensure_topics(settings, Catalogue.from_settings(settings).core())


def ensure_model_topics(settings: Settings, model: str, replicas: int = 1) -> list[str]:
    return ensure_topics(settings, Catalogue.from_settings(settings).for_model(model, replicas))


def stage_topics(settings: Settings, models: Mapping[str, int]) -> list[TopicSpec]:
    """The core topics and those of every model (name -> replicas)."""
    cat = Catalogue.from_settings(settings)
    return [*cat.core(), *(spec for model, n in models.items() for spec in cat.for_model(model, n))]


def ensure_stage_topics(settings: Settings, models: Mapping[str, int]) -> list[str]:
    """``stage_topics``, with one client and one metadata request: a restarted stage is back in
    its group sooner."""
    return ensure_topics(settings, stage_topics(settings, models))


def learn_leaders(consumer: Consumer, topics: Iterable[str], timeout_s: float = 10.0) -> None:
    """Load the topics' metadata into ``consumer`` before it is assigned partitions at a
    logical offset (beginning, end): librdkafka looks such an offset up only once it knows the
    partition's leader, and one it does not know yet is looked up again half a second later,
    which every stage's start would wait out."""
    for topic in dict.fromkeys(topics):
        consumer.list_topics(topic, timeout=timeout_s)


def partition_count(settings: Settings, topic: str, timeout_s: float = 10.0) -> int | None:
    """Partitions the brokers have for ``topic`` now, None if it is unknown: a stage that
    answers into a topic checks a partition against it, not against its own settings, which
    may be lower than what another process created."""
    meta = AdminClient(admin_config(settings)).list_topics(topic, timeout=timeout_s)
    found = meta.topics.get(topic)
    return len(found.partitions) if found is not None and found.error is None else None


def watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float = 15.0) -> tuple[int, int]:
    """Low and high offsets of a partition, retried while a fresh topic has no leader yet.

    Right after a topic is created the broker may answer NOT_LEADER_FOR_PARTITION (or
    UNKNOWN_TOPIC_OR_PART) for a moment; that is a wait, not an error.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            err = exc.args[0]
            if time.monotonic() > deadline or not (err.retriable() or err.code() in _NO_LEADER_YET):
                raise
            time.sleep(0.05)


_NO_LEADER_YET = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError._TIMED_OUT,
)
