"""A worker handed over or retired by one batcher member waits for the others that sent to it
lately, for a bounded time; a sender is named by its batch ids."""

from __future__ import annotations

from topics.markers import sender_of
from workers.leaving import SendersLeft


def test_a_sender_is_named_by_its_ids_whatever_the_marker() -> None:
    assert sender_of("3f2a9c1e-17") == "3f2a9c1e"
    assert sender_of("handover-3f2a9c1e-18") == "3f2a9c1e"
    assert sender_of("retire/3f2a9c1e-19") == "3f2a9c1e"
    assert sender_of("b1") == sender_of("retire/1") == ""


def test_the_worker_may_stop_once_every_recent_sender_handed_over() -> None:
    s = SendersLeft(recent_us=10_000, wait_us=5_000)
    s.sent("old", 0)  # last sent long before: gone (a batcher restarted under a new name)
    s.sent("a", 20_000)
    s.sent("b", 20_500)
    assert not s.may_stop(21_000)  # no handover yet
    s.handed_over("a", 21_000)
    assert s.waiting_for() == ["b"] and not s.may_stop(22_000)
    s.sent("b", 22_000)  # its last batch, sent before it read the change
    s.handed_over("b", 22_500)
    assert s.waiting_for() == [] and s.may_stop(22_500)


def test_a_sender_that_never_hands_over_is_waited_for_a_bounded_time() -> None:
    s = SendersLeft(recent_us=10_000, wait_us=5_000)
    s.sent("a", 1_000)
    s.sent("dead", 1_500)
    s.handed_over("a", 2_000)
    assert not s.may_stop(6_999)
    assert s.may_stop(7_000) and s.waiting_for() == ["dead"]


def test_a_lone_sender_stops_the_worker_at_its_handover() -> None:
    s = SendersLeft()
    s.sent("a", 1_000)
    s.handed_over("a", 2_000)
    assert s.may_stop(2_000)
