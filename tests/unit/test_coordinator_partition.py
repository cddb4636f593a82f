"""Which ``__consumer_offsets`` partition coordinates a group (``clipstream.testing.leaders``):
the fault suite moves that partition's leader, so a wrong pick moves the wrong one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from clipstream.errors import InfraError
from clipstream.testing.leaders import coordinator_partition, java_string_hash, offsets_partitions

# String.hashCode() as OpenJDK 17 computes it
JAVA_HASHES = {
    "clipstream-selector": -161093060,
    "polygenelubricants": -(1 << 31),  # the one hash whose absolute value does not fit an int
    "h\u00e9llo\u2192\U0001d11e": 403635182,  # a surrogate pair counts as two code units
    "": 0,
}


@pytest.mark.parametrize("text", list(JAVA_HASHES))
def test_the_hash_is_javas(text: str) -> None:
    assert java_string_hash(text) == JAVA_HASHES[text]


def test_the_partition_is_the_absolute_hash_modulo_the_partitions() -> None:
    assert coordinator_partition("clipstream-selector", 8) == 161093060 % 8
    assert coordinator_partition("clipstream-selector", 50) == 161093060 % 50


def test_the_hash_without_a_positive_twin_goes_to_partition_zero() -> None:
    assert coordinator_partition("polygenelubricants", 7) == 0


class _Topic:
    def __init__(self, partitions: int, error: str | None = None) -> None:
        self.partitions = dict.fromkeys(range(partitions))
        self.error = error


class _Admin:
    """Answers as brokers do while ``__consumer_offsets`` is being created: first no topic, then
    an error, then no partitions, then the topic."""

    def __init__(self, answers: list[_Topic | None]) -> None:
        self.answers = answers
        self.asked = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return SimpleNamespace(topics={} if answer is None else {topic: answer})


def test_the_offsets_topics_partitions_are_asked_for_until_a_broker_names_them() -> None:
    admin = _Admin([None, _Topic(0, error="LEADER_NOT_AVAILABLE"), _Topic(0), _Topic(50)])
    assert offsets_partitions(admin, timeout_s=10) == 50
    assert admin.asked == 4


def test_an_offsets_topic_that_never_shows_partitions_is_an_error_that_says_why() -> None:
    with pytest.raises(InfraError, match="no partitions.*clipstream infra status"):
        offsets_partitions(_Admin([_Topic(0)]), timeout_s=0.3)
