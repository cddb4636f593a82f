"""Cache key and coalescing of identical misses."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from batchers.cache import Coalescer, cache_key
from schemas import Tensor


def key(arr, model="m", version="1"):
    return cache_key(model, version, Tensor.of(arr))


def test_same_input_same_key_and_format():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    k = key(a)
    assert k == key(a.copy())
    assert k.startswith("cs:cache:m:1:") and len(k.split(":")[-1]) == 40


def test_any_difference_changes_the_key():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    base = key(a)
    b = a.copy()
    b[1, 2] += 1
    variants = [
        key(b),  # bytes
        key(a.reshape(3, 2)),  # shape, same bytes
        key(a.reshape(6)),
        key(a.view(np.int32)),  # dtype, same bytes
        key(a, model="m2"),
        key(a, version="2"),
        key(a, version=None),
    ]
    assert base not in variants and len(set(variants)) == len(variants)


def test_every_shape_of_the_same_bytes_has_its_own_key():
    data = np.zeros(12, dtype=np.uint8)
    shapes = [(12,), (1, 12), (12, 1), (2, 6), (6, 2), (2, 2, 3)]
    keys = {key(data.reshape(s)) for s in shapes}
    assert len(keys) == len(shapes)


@given(st.binary(min_size=0, max_size=64), st.binary(min_size=0, max_size=64))
def test_key_equal_iff_bytes_equal(x, y):
    tx = Tensor("uint8", [len(x)], x)
    ty = Tensor("uint8", [len(y)], y)
    assert (cache_key("m", "1", tx) == cache_key("m", "1", ty)) == (x == y)


def test_coalescer_first_leads_later_wait_and_all_resolve():
    c: Coalescer[str] = Coalescer()
    assert c.join("k", "q1") is True
    assert c.join("k", "q2") is False
    assert c.join("k", "q3") is False
    assert c.join("other", "q4") is True
    assert c.waiting("k") == 2 and "k" in c and len(c) == 2
    assert c.resolve("k") == ["q2", "q3"]
    assert "k" not in c
    assert c.join("k", "q5") is True  # a new evaluation after resolution


def test_coalescer_abandon_returns_waiters_to_rejoin():
    c: Coalescer[str] = Coalescer()
    c.join("k", "lead")
    c.join("k", "w1")
    c.join("k", "w2")
    waiters = c.abandon("k")
    assert waiters == ["w1", "w2"]
    assert [c.join("k", w) for w in waiters] == [True, False]
