"""How large a record may be, and a stage's records cut to fit.

Kafka refuses a record over its topic's limit, and librdkafka refuses one over its own at
``produce``, before it leaves the process. A batch of images passes Kafka's default megabyte
easily, so the topics clipstream makes take ``CLIPSTREAM_MAX_RECORD_BYTES``. A batcher cuts a
batch to fit it, a stage cuts its predictions into as many records as they need, and an input
too large to fit alone is refused where it enters (docs/design/0106).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from schemas import Predictions, encode

__all__ = ["ITEM_ALLOWANCE", "RECORD_ALLOWANCE", "fitted", "input_limit", "item_bytes", "producer_limit",
           "too_large", "too_large_input", "topic_limit"]

RECORD_ALLOWANCE = 4096  # a record's own fields, besides its items
ITEM_ALLOWANCE = 1024  # an item's fields besides its tensor: ids, deadline, trace stamps, reply topic
TOPIC_MARGIN = 64 * 1024  # the topic's limit over the records': the framing the producer adds to a batch
LIMIT_VARIABLE = "CLIPSTREAM_MAX_RECORD_BYTES"


def input_limit(max_record_bytes: int) -> int:
    """The largest input tensor (its bytes) one query may carry: alone in a batch, it fits."""
    return max_record_bytes - RECORD_ALLOWANCE - ITEM_ALLOWANCE


def too_large_input(size: int, max_record_bytes: int) -> str:
    """Why an input of ``size`` bytes is refused."""
    return (f"an input of {size} bytes is over the {input_limit(max_record_bytes)} bytes a query may carry "
            f"(set {LIMIT_VARIABLE}, now {max_record_bytes}, higher)")


def item_bytes(tensor_bytes: int) -> int:
    """What an item carrying a tensor of ``tensor_bytes`` adds to a record, at most."""
    return tensor_bytes + ITEM_ALLOWANCE


def producer_limit(max_record_bytes: int) -> int:
    """librdkafka's ``message.max.bytes``: a record's value with its key and headers."""
    return max_record_bytes + RECORD_ALLOWANCE


def topic_limit(max_record_bytes: int) -> int:
    """A topic's ``max.message.bytes`` (and a local broker's ``message.max.bytes``)."""
    return producer_limit(max_record_bytes) + TOPIC_MARGIN


def too_large(exc: BaseException) -> bool:
    """Whether ``exc`` is librdkafka refusing a record for its size."""
    from confluent_kafka import KafkaError, KafkaException  # not for the REST client's imports

    return (isinstance(exc, KafkaException) and bool(exc.args) and isinstance(exc.args[0], KafkaError)
            and exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE)


def fitted(record: Predictions, limit: int) -> list[bytes]:
    """``record`` encoded as records of at most ``limit`` bytes each, in its items' order. A
    prediction too large to go even alone goes as that model's error, naming the limit, so its
    query is answered without it rather than lost."""
    value = encode(record)
    if len(value) <= limit:
        return [value]
    if len(record.items) > 1:
        half = len(record.items) // 2
        return (fitted(Predictions(record.selector_partition, record.items[:half]), limit)
                + fitted(Predictions(record.selector_partition, record.items[half:]), limit))
    item: Any = record.items[0]
    refused = dataclasses.replace(item, status="error", output=None, error=(
        f"an output of {len(value)} bytes is over the record limit of {limit} bytes ({LIMIT_VARIABLE})"))
    return [encode(Predictions(record.selector_partition, [refused]))]
