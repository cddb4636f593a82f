"""Small Kafka helpers the selector's loops share: pinned start offsets, dead letters, apps."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Consumer, Producer, TopicPartition

from clipstream.clock import now_us
from clipstream.errors import ConfigError
from schemas import encode
from selector.outputs import AppOutputs, app_outputs
from selector.policies import SelectionPolicy, get_policy

log = logging.getLogger("selector")


def pin_and_assign(consumer: Consumer, partitions: list[TopicPartition], on_done: Callable[[], None]) -> None:
    """on_assign: a partition with no committed offset starts at its end *now*, before we say
    ready, so nothing produced after ``ready`` is skipped by a later "latest" lookup."""
    committed = consumer.committed(partitions, timeout=10)
    pinned = []
    for tp in committed:
        if tp.offset < 0:
            _, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10)
            tp.offset = high
            pinned.append(TopicPartition(tp.topic, tp.partition, high))
    consumer.assign(committed)
    if pinned:
        # commit the pin at once: a member that takes the partition over in a later rebalance
        # resumes here, instead of at a new "latest" that would skip what came in between
        try:
            consumer.commit(offsets=pinned, asynchronous=False)
        except KafkaException as exc:
            log.warning("could not commit the start offsets %s: %s", pinned, exc)
    on_done()


class DeadLetters:
    """A record a stage cannot handle goes to the dead-letter topic with the reason."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.count = 0

    def send(self, reason: str, msg: Any = None, query_id: str | None = None) -> None:
        self.count += 1
        log.warning("dead letter: %s (query %s)", reason, query_id)
        record = {
            "stage": "selector",
            "reason": reason,
            "source_topic": msg.topic() if msg is not None else None,
            "source_partition": msg.partition() if msg is not None else None,
            "source_offset": msg.offset() if msg is not None else None,
            "query_id": query_id,
            "payload": (msg.value() or b"")[:65536] if msg is not None else None,
            "created_us": now_us(),
        }
        self.producer.produce(self.topic, encode("DeadLetter", record))
        self.producer.poll(0)


class Apps:
    """The policy object and output kind of each app, rebuilt only when its config changes."""

    def __init__(self, view: Callable[[], Any]) -> None:
        self.view = view
        self._cache: dict[str, tuple[Any, SelectionPolicy, AppOutputs]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> tuple[Any, SelectionPolicy, AppOutputs]:
        """(AppConfig, policy, outputs); ConfigError when the app is unknown or misconfigured."""
        view = self.view()
        app = view.apps.get(name)
        if app is None:
            raise ConfigError(f"unknown app {name!r}")
        if not app.models:
            raise ConfigError(f"app {name!r} has no linked models")
        outputs = app_outputs(view, app.models)
        signature = (app, outputs)
        with self._lock:
            hit = self._cache.get(name)
            if hit is not None and hit[0] == signature:
                return app, hit[1], outputs
            config = dict(app.policy_config, kind=outputs.kind, labels=list(outputs.labels or ()))
            policy = get_policy(app.policy, config)
            self._cache[name] = (signature, policy, outputs)
            return app, policy, outputs
