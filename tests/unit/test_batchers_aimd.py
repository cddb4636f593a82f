"""AIMD batch sizing against hand-computed sequences (Clipper 4.3.1)."""

import pytest

from batchers.aimd import AIMD

OBJ = 20_000  # 20 ms


def test_additive_increase_on_full_batches_under_objective():
    a = AIMD(OBJ, step=2, cap=100, start=1)
    seq = []
    for _ in range(4):
        seq.append(a.observe(a.max_batch_size, 5_000))
    assert seq == [3, 5, 7, 9]


def test_multiplicative_decrease_floors_by_ten_percent():
    a = AIMD(OBJ, cap=100, start=25)
    # 25 -> floor(22.5)=22 -> floor(19.8)=19 -> floor(17.1)=17 -> floor(15.3)=15
    assert [a.observe(a.max_batch_size, 30_000) for _ in range(4)] == [22, 19, 17, 15]


def test_small_maxima_still_shrink_and_never_below_one():
    a = AIMD(OBJ, cap=100, start=3)
    assert [a.observe(a.max_batch_size, OBJ + 1) for _ in range(4)] == [2, 1, 1, 1]


def test_cap_bounds_increase():
    a = AIMD(OBJ, step=3, cap=7, start=5)
    assert [a.observe(a.max_batch_size, 1) for _ in range(3)] == [7, 7, 7]
    assert a.increases == 1


def test_partial_batch_under_objective_does_not_grow():
    a = AIMD(OBJ, start=10)
    assert a.observe(4, 1_000) == 10
    assert a.observe(10, 1_000) == 11


def test_partial_batch_over_objective_shrinks():
    a = AIMD(OBJ, start=10)
    assert a.observe(2, 25_000) == 9


def test_objective_boundary_is_a_hit():
    a = AIMD(OBJ, start=4)
    assert a.observe(4, OBJ) == 5


def test_miss_from_batch_formed_under_larger_limit_is_not_punished_twice():
    a = AIMD(OBJ, start=10)
    assert a.observe(10, 30_000, limit=10) == 9
    assert a.observe(10, 30_000, limit=10) == 9  # was already on its way
    assert a.observe(9, 30_000, limit=9) == 8


def test_full_at_older_limit_counts():
    a = AIMD(OBJ, start=5)
    assert a.observe(5, 100, limit=5) == 6
    assert a.observe(5, 100, limit=5) == 7  # the second in-flight batch was full too
    assert a.observe(5, 100, limit=7) == 7  # not full under its limit


def test_fill_fraction():
    a = AIMD(OBJ, start=10, fill=0.8)
    assert a.observe(7, 100) == 10
    assert a.observe(8, 100) == 11


def test_converges_near_the_objective_for_a_linear_profile():
    # service = 2 ms + 0.5 ms/item: the largest batch within 20 ms is 36
    a = AIMD(OBJ, cap=1000)
    sizes = []
    for _ in range(400):
        b = a.max_batch_size
        a.observe(b, 2_000 + 500 * b)
        sizes.append(b)
    tail = sizes[-100:]
    assert max(tail) <= 37 and min(tail) >= 32


@pytest.mark.parametrize("kw", [{"objective_us": 0}, {"objective_us": 1, "step": 0}, {"objective_us": 1, "backoff": 1.0}])
def test_rejects_bad_parameters(kw):
    with pytest.raises(ValueError):
        AIMD(**kw)
