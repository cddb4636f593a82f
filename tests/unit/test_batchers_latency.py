"""The replica's batch-latency curve learnt from reports (``batchers/latency.py``)."""

import pytest

from batchers.latency import LatencyModel


def test_unknown_before_any_report() -> None:
    m = LatencyModel()
    assert not m.known and m.service_us(8) == 0.0
    m.observe(0, 1_000)  # an empty batch says nothing
    assert not m.known


def test_a_linear_curve_is_recovered_from_batches_of_several_sizes() -> None:
    m = LatencyModel()
    for size in (1, 4, 8, 16, 8, 4):
        m.observe(size, 5_000 + 50 * size)  # 5 ms per batch + 0.05 ms per item
    assert m.service_us(1) == pytest.approx(5_050)
    assert m.service_us(300) == pytest.approx(20_000)


def test_with_one_size_seen_smaller_batches_cost_as_much_and_larger_ones_proportionally_more() -> None:
    m = LatencyModel()
    for _ in range(3):
        m.observe(10, 8_000)
    assert m.service_us(1) == 8_000 and m.service_us(10) == 8_000
    assert m.service_us(20) == 16_000


def test_a_fit_that_says_bigger_batches_are_faster_is_taken_as_flat() -> None:
    m = LatencyModel()
    for size, t in ((2, 5_300), (4, 5_200), (8, 5_150), (16, 5_100)):  # a fixed cost, and noise
        m.observe(size, t)
    assert m.service_us(1) == pytest.approx(5_175) and m.service_us(64) == pytest.approx(5_175)  # the median


def test_a_negative_fixed_cost_is_taken_as_a_line_through_the_origin() -> None:
    m = LatencyModel()
    m.observe(2, 1_000)
    m.observe(4, 4_000)  # slope 1.5 ms/item, fixed -2 ms
    assert m.service_us(4) == pytest.approx(3_000)  # the median of 0.5 and 0.75 ms per item
    assert m.service_us(1) == pytest.approx(750)


def test_a_batch_slowed_by_something_else_does_not_tilt_the_line() -> None:
    m = LatencyModel()
    for i in range(31):
        size = 1 + i % 8
        m.observe(size, 5_000 + 50 * size + (i % 3) * 40)  # 5 ms + 0.05 ms/item, some jitter
    m.observe(8, 30_000)  # one batch caught in a pause
    assert m.service_us(8) == pytest.approx(5_400, abs=100)
    assert m.service_us(64) < 9_000  # a least-squares line says 39 ms here


def test_only_the_recent_window_counts() -> None:
    m = LatencyModel(window=4)
    for size in (2, 4, 2, 4):
        m.observe(size, 1_000 * size)
    for size in (2, 4, 2, 4):
        m.observe(size, 2_000 * size)  # the model became 2x slower
    assert m.service_us(4) == pytest.approx(8_000)


def test_mostly_one_size_with_a_few_either_side_still_gets_its_slope() -> None:
    """AIMD between 2 and 3 items (a miss at 3, back to 2, a full batch, 3 again): most
    reports have size 2, so halves by count both have median size 2. Clockwork's ResNet-50
    at half speed: 5.22 ms for 1, 7.56 for 2, 9.39 for 3."""
    m = LatencyModel()
    for i in range(32):
        size = 3 if i % 5 == 0 else 1 if i % 7 == 0 else 2
        m.observe(size, {1: 5_220, 2: 7_560, 3: 9_390}[size] + (i % 3 - 1) * 100)
    assert m.service_us(2) == pytest.approx(7_560, abs=150)
    assert m.service_us(3) == pytest.approx(9_390, abs=300)  # a flat line said 7.56 ms: late batches
    assert m.service_us(1) < 6_000


def test_one_batch_off_the_usual_size_does_not_draw_the_line() -> None:
    m = LatencyModel()
    for _ in range(20):
        m.observe(2, 7_500)
    m.observe(3, 30_000)  # the one batch of 3 was caught in a pause
    assert m.service_us(3) == pytest.approx(7_500 * 3 / 2)  # the conservative curve, not 30 ms
    assert m.service_us(1) == 7_500
