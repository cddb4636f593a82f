"""Which ``__consumer_offsets`` partition coordinates a group (``clipstream.testing.leaders``):
the fault suite moves that partition's leader, so a wrong pick moves the wrong one."""

from __future__ import annotations

import pytest

from clipstream.testing.leaders import coordinator_partition, java_string_hash

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
