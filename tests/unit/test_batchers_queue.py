"""The earliest-deadline-first queue: ordering, FIFO ties, expiry, arrivals."""

from dataclasses import dataclass

from batchers.queue import DeadlineQueue


@dataclass
class R:
    name: str
    deadline_us: int


def test_takes_earliest_deadline_first_with_fifo_ties():
    q: DeadlineQueue[R] = DeadlineQueue()
    for name, d in [("c", 30), ("a", 10), ("b1", 20), ("b2", 20), ("b3", 20)]:
        q.push(R(name, d))
    assert len(q) == 5 and q.next_deadline == 10
    batch, expired = q.take(4, now_us=0)
    assert [r.name for r in batch] == ["a", "b1", "b2", "b3"]
    assert expired == []
    assert len(q) == 1 and q.next_deadline == 30


def test_take_drops_expired_and_fills_with_live_ones():
    q: DeadlineQueue[R] = DeadlineQueue()
    for name, d in [("late1", 5), ("late2", 10), ("ok1", 11), ("ok2", 50), ("ok3", 60)]:
        q.push(R(name, d))
    batch, expired = q.take(2, now_us=10)  # deadline == now counts as expired
    assert [r.name for r in expired] == ["late1", "late2"]
    assert [r.name for r in batch] == ["ok1", "ok2"]
    assert [r.name for r in q.drain()] == ["ok3"]
    assert q.next_deadline is None and not q


def test_oldest_arrival_is_not_the_edf_head():
    q: DeadlineQueue[R] = DeadlineQueue()
    q.push(R("slow-slo", 1000), arrival_us=1)
    q.push(R("tight-slo", 50), arrival_us=2)
    assert q.oldest_arrival == 1
    batch, _ = q.take(1, now_us=0)
    assert batch[0].name == "tight-slo"
    assert q.oldest_arrival == 1
    q.take(1, now_us=0)
    assert q.oldest_arrival is None


def test_expire_only_removes_past_deadlines():
    q: DeadlineQueue[R] = DeadlineQueue()
    q.push(R("x", 100))
    q.push(R("y", 200))
    assert q.expire(99) == []
    assert [r.name for r in q.expire(150)] == ["x"]
    assert len(q) == 1
