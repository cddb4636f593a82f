"""Kafka client settings for every stage: low-latency defaults plus security pass-through.

librdkafka batches for throughput by default; a serving pipeline wants each record on the
wire at once (linger 0, Nagle off) and fetches that return as soon as anything arrives.
"""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from clipstream.settings import Settings
from topics.kafkalog import KAFKA_LOG
from topics.sizes import producer_limit

_SECURITY = {
    "kafka_security_protocol": "security.protocol",
    "kafka_sasl_mechanism": "sasl.mechanism",
    "kafka_sasl_username": "sasl.username",
    "kafka_sasl_password": "sasl.password",
    "kafka_ssl_ca_location": "ssl.ca.location",
    "kafka_ssl_certificate_location": "ssl.certificate.location",
    "kafka_ssl_key_location": "ssl.key.location",
}


# how often a client on a cluster refreshes its topics' leaders: librdkafka looks for a new
# leader of a partition whose broker is down on a one-second scan, and may read a node that has
# not yet applied the fence; a refresh this often finds the new leaders sooner after a failover
CLUSTER_METADATA_REFRESH_MS = 500


def metadata_refresh_ms(settings: Settings) -> int | None:
    """The clients' metadata refresh: the setting, else ``CLUSTER_METADATA_REFRESH_MS`` when the
    bootstrap list names several brokers (a cluster that can fail over), else None (librdkafka's
    default: a single broker has no other leader to find)."""
    if settings.kafka_metadata_refresh_ms is not None:
        return settings.kafka_metadata_refresh_ms
    brokers = [b for b in settings.kafka_bootstrap.split(",") if b.strip()]
    return CLUSTER_METADATA_REFRESH_MS if len(brokers) > 1 else None


def common_config(settings: Settings) -> dict[str, Any]:
    """What every client shares: the brokers, Nagle off, security, and librdkafka's log lines
    through ``topics.kafkalog`` (the stage's log, repeats folded) rather than straight to
    stderr, where a client retrying a broker that is away writes many lines a second.
    ``log.connection.close`` stays on: librdkafka already keeps quiet about an idle connection
    a broker reaps, and warns of a close only with requests in flight, as in a failover."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "socket.nagle.disable": True,
        "broker.address.family": "v4",
        "logger": KAFKA_LOG,
    }
    refresh = metadata_refresh_ms(settings)
    if refresh is not None:
        conf["topic.metadata.refresh.interval.ms"] = refresh
    for attr, key in _SECURITY.items():
        value = getattr(settings, attr)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if value:
            conf[key] = value
    return conf


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """Every stage's producer: a record is acknowledged only once every in-sync replica has it
    (``acks=all``; with ``min.insync.replicas=2`` on a cluster, two copies), and idempotence
    lets librdkafka retry through a leader change without writing a record twice or out of
    order. On one broker acks=all costs nothing, as the leader is the only replica."""
    conf = common_config(settings)
    conf.update(
        {
            "linger.ms": 0,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "none",
            "queue.buffering.max.messages": 1_000_000,
            "message.max.bytes": producer_limit(settings.max_record_bytes),
        }
    )
    conf.update(overrides)
    return conf


def consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    conf = common_config(settings)
    conf.update(
        {
            "group.id": group_id,
            # a long poll: the broker answers as soon as data arrives, so a long wait costs no
            # latency, while every idle fetch costs the broker CPU, and a pipeline has dozens of
            # consumers
            "fetch.wait.max.ms": 500,
            "fetch.min.bytes": 1,
            "enable.auto.commit": True,
            "auto.offset.reset": "latest",
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 1_000,
            "partition.assignment.strategy": "range",
        }
    )
    conf.update(overrides)
    return conf


def admin_config(settings: Settings) -> dict[str, Any]:
    return common_config(settings)


def aiokafka_kwargs(settings: Settings) -> dict[str, Any]:
    """The same connection for an aiokafka client (an application's own)."""
    kwargs: dict[str, Any] = {"bootstrap_servers": settings.kafka_bootstrap}
    refresh = metadata_refresh_ms(settings)
    if refresh is not None:
        kwargs["metadata_max_age_ms"] = refresh
    if settings.kafka_security_protocol:
        kwargs["security_protocol"] = settings.kafka_security_protocol
    if settings.kafka_sasl_mechanism:
        kwargs["sasl_mechanism"] = settings.kafka_sasl_mechanism
        kwargs["sasl_plain_username"] = settings.kafka_sasl_username
        secret = settings.kafka_sasl_password
        kwargs["sasl_plain_password"] = secret.get_secret_value() if secret is not None else None
    return kwargs
