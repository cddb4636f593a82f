"""Hostile records for the fuzzing tests: what Hypothesis writes to a stage's topics."""

from __future__ import annotations

from hypothesis import strategies as st

from clipstream.errors import ClipstreamError
from schemas import decode


def mutations(valid: bytes) -> st.SearchStrategy[bytes]:
    """Random bytes, and a valid record with one byte changed or cut short."""
    flipped = st.tuples(st.integers(0, len(valid) - 1), st.integers(1, 255)).map(
        lambda t: valid[:t[0]] + bytes([valid[t[0]] ^ t[1]]) + valid[t[0] + 1:])
    cut = st.integers(1, len(valid) - 1).map(lambda n: valid[:n])
    return st.one_of(st.binary(min_size=1, max_size=300), flipped, cut)


def undecodable(payload: bytes) -> bool:
    """A mutation can still decode (a flipped byte inside a float): only the others must be
    dead letters."""
    try:
        decode(payload)
    except ClipstreamError:
        return True
    return False
