"""Replica credit, choice of replica, lost credit and delayed batching (clock injected)."""

from batchers.aimd import AIMD
from batchers.dispatch import Dispatcher

OBJ = 20_000


def make(replicas=2, start=4, delay=2_000, in_flight=1, timeout=100_000):
    return Dispatcher(
        replicas,
        lambda: AIMD(OBJ, start=start, cap=64),
        max_in_flight=in_flight,
        batch_delay_us=delay,
        credit_timeout_us=timeout,
    )


def test_full_queue_sends_max_at_once():
    d = make()
    dec = d.decide(queued=10, oldest_arrival_us=1_000, now_us=1_000)
    assert dec.send and dec.size == 4 and dec.replica == 0


def test_short_queue_waits_from_oldest_arrival_then_sends_what_is_there():
    d = make()
    dec = d.decide(queued=2, oldest_arrival_us=1_000, now_us=1_500)
    assert not dec.send and dec.wake_us == 3_000
    dec = d.decide(queued=3, oldest_arrival_us=1_000, now_us=2_999)
    assert not dec.send and dec.wake_us == 3_000
    dec = d.decide(queued=3, oldest_arrival_us=1_000, now_us=3_000)
    assert dec.send and dec.size == 3


def test_no_delay_sends_immediately():
    d = make(delay=0)
    dec = d.decide(queued=1, oldest_arrival_us=500, now_us=500)
    assert dec.send and dec.size == 1


def test_empty_queue_is_idle():
    d = make()
    dec = d.decide(0, None, 0)
    assert not dec.send and dec.wake_us is None


def test_credit_bounds_batches_in_flight_and_returns_with_stats():
    d = make(replicas=1, in_flight=2)
    d.sent(0, "b1", 4, now_us=0)
    assert d.decide(10, 0, 0).send
    d.sent(0, "b2", 4, now_us=0)
    assert not d.decide(10, 0, 0).send  # both credits used
    assert d.completed("b1", 4, 5_000, now_us=1_000) is not None
    assert d.replicas[0].aimd.max_batch_size == 5  # full batch under objective
    # b2 runs from about now (1 ms) for 5 ms: a short batch is due 3 ms (the lead) before
    assert d.decide(3, 0, 1_000).wake_us == 3_000
    dec = d.decide(3, 0, 3_000)
    assert dec.send and dec.size == 3


def test_a_busy_replica_gets_its_next_batch_just_before_its_device_is_free():
    d = make(replicas=1, in_flight=2)
    d.sent(0, "b1", 4, now_us=0)
    d.completed("b1", 4, 40_000, now_us=100_000)  # service time known: 40 ms
    d.sent(0, "b2", 4, now_us=100_000)  # the device is free at 140 ms
    dec = d.decide(1, 0, 100_001)  # a short batch (AIMD's limit is now 3, then 2): it can still grow
    # due at free - max(3 ms, 10% of service) = 140 - 4 ms
    assert not dec.send and dec.wake_us == 136_000
    assert d.decide(1, 0, 136_000).send
    d.sent(0, "b3", 4, now_us=136_000)  # queued behind b2: free at 180 ms; no credit left
    assert d.decide(1, 0, 150_000).wake_us is None
    d.completed("b2", 4, 40_000, now_us=141_000)  # b3 runs from about now: free at 181 ms
    assert d.decide(1, 0, 141_000).wake_us == 177_000
    eager = Dispatcher(1, lambda: AIMD(OBJ, start=4, cap=64), max_in_flight=2, credit_lead_us=None)
    eager.sent(0, "b1", 4, now_us=0)
    eager.completed("b1", 4, 40_000, now_us=50_000)
    eager.sent(0, "b2", 4, now_us=100_000)
    assert eager.decide(10, 0, 100_001).send  # without the gate, a free credit goes at once


def test_a_full_batch_goes_to_a_busy_replica_as_soon_as_it_has_credit():
    d = make(replicas=1, in_flight=2)
    d.sent(0, "b1", 4, now_us=0)
    d.completed("b1", 4, 10_000, now_us=10_000)  # 10 ms, under the objective: the limit is 5
    # with one size seen, a larger batch is taken to cost proportionally more: 5 items, 12.5 ms,
    # so the device is free at 22.5 ms; one credit left
    d.sent(0, "b2", 5, now_us=10_000)
    short = d.decide(4, 0, 10_001)
    assert not short.send and short.wake_us == 19_500  # waits to just in time (3 ms lead), to grow
    full = d.decide(5, 0, 10_001)
    assert full.send and full.size == 5  # nothing can join it: it goes now, waiting at the worker
    d.sent(0, "b3", 5, now_us=10_001)
    assert not d.decide(50, 0, 10_002).send  # still bounded by credit


def test_least_loaded_replica_gets_the_next_batch_round_robin_when_idle():
    d = make(replicas=2, in_flight=2)
    order = []
    for i in range(4):
        dec = d.decide(10, 0, i)
        order.append(dec.replica)
        d.sent(dec.replica, f"b{i}", dec.size, now_us=i)
    assert order == [0, 1, 0, 1]
    d.completed("b1", 4, 1_000)  # replica 1 has one fewer in flight
    assert d.decide(10, 0, 10).replica == 1


def test_each_replica_has_its_own_aimd():
    d = make(replicas=2, in_flight=2)
    d.sent(0, "fast", 4, 0)
    d.sent(1, "slow", 4, 0)
    d.completed("fast", 4, 1_000)
    d.completed("slow", 4, 50_000)
    assert [s["max_batch_size"] for s in d.stats()] == [5, 3]


def test_lost_credit_is_reclaimed_and_replica_marked_suspect():
    d = make(replicas=2, in_flight=1, timeout=100_000)
    d.sent(0, "lost", 4, now_us=0)
    d.sent(1, "fine", 4, now_us=50_000)
    assert d.pick() is None
    assert d.next_reclaim_us() == 100_000
    assert d.reclaim(99_999) == []
    lost = d.reclaim(100_000)
    assert [f.batch_id for f in lost] == ["lost"]
    d.completed("fine", 4, 1_000)
    # both have credit now; the healthy one is preferred
    assert d.pick().index == 1
    # late stats for the reclaimed batch: AIMD learns, credit not returned twice
    assert d.completed("lost", 4, 90_000) is not None
    assert d.replicas[0].aimd.max_batch_size == 3
    assert d.replicas[0].credit == 1 and not d.replicas[0].suspect
    assert d.completed("unknown", 4, 1) is None


def test_one_straggling_batch_does_not_change_the_replicas_speed():
    """A 150 ms batch among 2 ms ones: the median keeps 2 ms, so requests with 50 ms left are
    not all judged hopeless (with nothing sent, no report would ever correct that)."""
    d = make(replicas=1, in_flight=2)
    for i, service in enumerate((2_000, 2_000, 150_000)):
        d.sent(0, f"b{i}", 1, now_us=i)
        d.completed(f"b{i}", 1, service, now_us=i + 1)
    assert d.replicas[0].service_us == 2_000
    assert d.replicas[0].batch_us(1) == 2_000 and d.replicas[0].wait_us(now_us=10) == 0
    for i in range(3, 6):  # a replica that is slow every time is seen as slow
        d.sent(0, f"b{i}", 1, now_us=i)
        d.completed(f"b{i}", 1, 150_000, now_us=i + 1)
    assert d.replicas[0].service_us == 150_000 and d.replicas[0].batch_us(1) == 150_000


def test_a_batch_waits_for_the_device_then_takes_its_own_service_time():
    """A batch sent while another runs finishes when the device is free plus its own service
    time; it must not be judged by a blanket multiple of the service time (that would drop
    requests that could still make it, and leave batches short under overload)."""
    d = make(replicas=1, in_flight=2)
    d.sent(0, "warm", 4, now_us=0)
    d.completed("warm", 4, 100_000, now_us=100_000)  # speed known: 100 ms a batch
    r = d.replicas[0]
    assert r.wait_us(now_us=100_000) == 0 and r.batch_us(4) == 100_000  # idle
    d.sent(0, "running", 4, now_us=100_000)  # device busy until 200 ms
    assert r.wait_us(now_us=190_000) == 10_000
    assert r.wait_us(now_us=250_000) == 0  # overdue: no negative wait


def test_a_request_that_came_alone_goes_at_once_and_one_in_a_run_waits():
    d = make(delay=2_000)
    d.arrived(1_000)  # the first: nothing came before it
    dec = d.decide(queued=1, oldest_arrival_us=1_000, now_us=1_100)
    assert dec.send and dec.size == 1
    d.arrived(10_000)  # 9 ms after the last: alone again
    assert d.decide(queued=1, oldest_arrival_us=10_000, now_us=10_050).send
    d.arrived(10_500)  # half a millisecond after: a run, so it waits for company
    dec = d.decide(queued=1, oldest_arrival_us=10_500, now_us=10_600)
    assert not dec.send and dec.wake_us == 12_500
    d.arrived(10_700)
    assert not d.decide(queued=2, oldest_arrival_us=10_500, now_us=10_800).send
    assert d.decide(queued=2, oldest_arrival_us=10_500, now_us=12_500).size == 2
