"""The topic catalogue: every topic's name, partitions and configuration, in one place.

Per-model topics carry the model name; partitions of ``batches.<model>`` are the model's
replicas (one worker consumes one partition), so replica ``r`` is simply partition ``r``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clipstream.errors import ConfigError
from clipstream.settings import Settings
from topics.sizes import topic_limit

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

# ``requests.<model>`` partitions: the most batcher members that can share one model's work
# (docs/design/0024). The selector keys each request by query id, so with as many partitions in
# every model's topic a query's requests all land on one partition number, which the range
# assignor gives to one member: an ensemble's query still wakes one batcher process.
REQUEST_PARTITIONS = 4


def valid_name(name: object) -> bool:
    """App and model names end up in topic names and Redis keys: they stay plain."""
    return isinstance(name, str) and _NAME.match(name) is not None


def check_name(kind: str, name: str) -> str:
    """``name``, or a ConfigError that says what an app or model name may hold."""
    if not valid_name(name):
        raise ConfigError(
            f"{kind} name {name!r} is not allowed: use letters, digits, '-' and '_' (max 128)"
        )
    return name


# On a cluster every topic survives the loss of one broker without refusing writes: three
# copies, of which two must take a record before an acks=all producer is told it is stored.
CLUSTER_REPLICATION = 3


def replication_for(brokers: int) -> int:
    """The replication factor of topics created on a cluster of ``brokers`` brokers."""
    return max(1, min(CLUSTER_REPLICATION, brokers))


def min_insync_for(replication_factor: int) -> int:
    """``min.insync.replicas`` for a replication factor: one copy may be lost (and no more than
    one need be waited for), so RF 3 gives 2; a single copy gives 1."""
    return max(1, min(2, replication_factor - 1))


def durability_config(replication_factor: int) -> dict[str, str]:
    """Topic settings that follow from the replication factor (none for a single copy, where
    the broker's own defaults apply)."""
    if replication_factor <= 1:
        return {}
    return {"min.insync.replicas": str(min_insync_for(replication_factor))}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)

    @property
    def compacted(self) -> bool:
        return self.config.get("cleanup.policy") == "compact"


class Catalogue:
    """Names and shapes of clipstream's topics under one prefix."""

    def __init__(
        self,
        prefix: str = "clipstream.",
        selector_partitions: int = 4,
        retention_ms: int = DAY_MS,
        max_record_bytes: int | None = None,
    ) -> None:
        self.prefix = prefix
        self.selector_partitions = selector_partitions
        self.retention_ms = retention_ms
        self.max_record_bytes = max_record_bytes  # None: the broker's own limit

    @classmethod
    def from_settings(cls, settings: Settings) -> "Catalogue":
        return cls(settings.topic_prefix, settings.selector_partitions, max_record_bytes=settings.max_record_bytes)

    def _spec(self, name: str, partitions: int, **config: str) -> TopicSpec:
        base = {"retention.ms": str(self.retention_ms)}
        if self.max_record_bytes is not None:
            base["max.message.bytes"] = str(topic_limit(self.max_record_bytes))
        base.update(config)
        return TopicSpec(self.prefix + name, partitions, base)

    # -- shared topics -------------------------------------------------------------
    @property
    def queries(self) -> TopicSpec:
        return self._spec("queries", self.selector_partitions)

    @property
    def predictions(self) -> TopicSpec:
        # same partition count as queries: partition i of both belongs to one selector member
        return self._spec("predictions", self.selector_partitions)

    @property
    def responses(self) -> TopicSpec:
        return self._spec("responses", self.selector_partitions)

    @property
    def feedback(self) -> TopicSpec:
        return self._spec("feedback", self.selector_partitions)

    @property
    def registry(self) -> TopicSpec:
        return TopicSpec(
            self.prefix + "registry",
            1,
            {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.ms": str(HOUR_MS)},
        )

    @property
    def schemas(self) -> TopicSpec:
        """Every record schema a clipstream process has written with, keyed by fingerprint:
        a stage reads a newer version's records through them (``topics.schema_topic``)."""
        return TopicSpec(self.prefix + "schemas", 1, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"})

    @property
    def deadletter(self) -> TopicSpec:
        return self._spec("deadletter", 1, **{"retention.ms": str(7 * DAY_MS)})

    def replies(self, instance: str, partitions: int = 1) -> TopicSpec:
        """A gateway instance's own reply topic: it reads only its own answers."""
        check_name("gateway instance", instance)
        return self._spec(f"replies.{instance}", partitions, **{"retention.ms": str(HOUR_MS)})

    def is_reply(self, topic: str) -> bool:
        """Whether ``topic`` is some gateway's reply topic: the only place a request may ask
        its prediction to be sent instead of ``predictions`` (docs/design/0083)."""
        head = self.prefix + "replies."
        return topic.startswith(head) and valid_name(topic[len(head):])

    def route_problem(self, reply_topic: str | None, selector_partition: int, partitions: int | None) -> str | None:
        """Why a request's prediction could not go where it asks, or None: to a gateway's reply
        topic, or else to its partition of ``predictions``, which has ``partitions`` (None:
        unknown, not checked). A batcher and a worker both check it, as either may answer a
        request; a partition the topic lacks would hold the answer, and the request's commit."""
        if reply_topic is not None:
            if not self.is_reply(reply_topic):
                return f"reply_topic {reply_topic!r} is no gateway's reply topic ({self.prefix}replies.<instance>)"
            return None
        if selector_partition < 0 or (partitions is not None and selector_partition >= partitions):
            return f"selector_partition {selector_partition} is outside [0, {partitions})"
        return None

    # -- per-model topics ----------------------------------------------------------
    def requests(self, model: str, partitions: int = REQUEST_PARTITIONS) -> TopicSpec:
        return self._spec(f"requests.{check_name('model', model)}", partitions)

    def batches(self, model: str, replicas: int = 1) -> TopicSpec:
        return self._spec(f"batches.{check_name('model', model)}", max(1, replicas))

    def batch_stats(self, model: str) -> TopicSpec:
        return self._spec(f"batch-stats.{check_name('model', model)}", 1)

    def core(self) -> list[TopicSpec]:
        return [
            self.queries,
            self.predictions,
            self.responses,
            self.feedback,
            self.registry,
            self.schemas,
            self.deadletter,
        ]

    def for_model(self, model: str, replicas: int = 1) -> list[TopicSpec]:
        return [self.requests(model), self.batches(model, replicas), self.batch_stats(model)]
