"""The batcher's state machine without a broker: batching, expiry, coalescing, credit."""

import numpy as np

from batchers.aimd import AIMD
from batchers.cache import cache_key
from batchers.core import BatcherCore, Pending, by_route, prediction
from batchers.dispatch import Dispatcher
from schemas import BatchStats, ModelRequest, Tensor, decode_as, encode


def core(replicas=1, start=4, delay=2_000, in_flight=1, coalesce=True):
    d = Dispatcher(replicas, lambda: AIMD(20_000, start=start, cap=64), in_flight, delay, 1_000_000)
    return BatcherCore("m", "1", d, coalesce=coalesce)


def req(qid, deadline, x=0.0, part=0, arrival=0, reply=None):
    t = Tensor.of(np.array([x], dtype=np.float32))
    r = ModelRequest(query_id=qid, app="a", model="m", input=t, deadline_us=deadline,
                     selector_partition=part, trace={"batcher_in": arrival},
                     reply_topic=reply, reply_partition=0 if reply else None)
    return Pending(r, cache_key("m", "1", t), arrival)


def stats(batch_id, size, service_us):
    """A worker's report of one batch."""
    return BatchStats(batch_id=batch_id, model="m", replica=0, batch_size=size, service_us=service_us,
                      queue_wait_us=0, errors=0, worker_id="w", created_us=0)


def test_batches_edf_up_to_max_and_records_encode():
    c = core(start=2)
    for i, d in enumerate([300, 100, 200]):
        c.admit(req(f"q{i}", d, x=i))
    step = c.poll(now_us=0)
    assert len(step.batches) == 1
    rec = step.batches[0].record
    assert [it.query_id for it in rec.items] == ["q1", "q2"]
    assert rec.items[0].trace == {"batcher_in": 0, "batched": 0}
    assert rec.items[0].cache_key.startswith("cs:cache:m:1:")
    assert decode_as(type(rec), encode(rec)) == rec
    # one left, no credit: wakes at its deadline to report it expired
    assert step.wake_us == 300
    step = c.poll(now_us=300)
    assert [p.request.query_id for p in step.expired] == ["q0"]


def test_delayed_batching_then_send_after_stats_return_credit():
    c = core(start=4, delay=2_000)
    c.dispatcher.arrived(0)  # a request came just before: "a" comes in a run
    c.admit(req("a", 10_000, x=1, arrival=100))
    step = c.poll(now_us=100)
    assert step.batches == [] and step.wake_us == 2_100
    c.admit(req("b", 10_000, x=2, arrival=900))
    step = c.poll(now_us=2_100)
    assert len(step.batches) == 1 and len(step.batches[0].record.items) == 2
    bid = step.batches[0].record.batch_id
    assert c.on_stats(stats(bid, 2, 500)) == []
    assert c.dispatcher.replicas[0].credit == 1


def test_a_request_that_came_alone_is_not_delayed():
    c = core(start=4, delay=2_000)
    c.admit(req("a", 10_000, x=1, arrival=100))
    step = c.poll(now_us=150)
    assert [len(b.record.items) for b in step.batches] == [1]


def test_identical_misses_are_evaluated_once_and_waiters_get_the_value():
    c = core(start=8, delay=0)
    assert c.admit(req("lead", 10_000, x=7)) is True
    assert c.admit(req("w1", 10_000, x=7)) is False
    step = c.poll(0)
    assert [it.query_id for it in step.batches[0].record.items] == ["lead"]
    assert c.admit(req("w2", 10_000, x=7)) is False  # still in flight: waits too
    bid = step.batches[0].record.batch_id
    key = step.batches[0].record.items[0].cache_key
    assert c.on_stats(stats(bid, 1, 10)) == [key]
    served, expired = c.deliver(key, Tensor("float32", [], b"\0" * 4), 50)
    assert [p.request.query_id for p in served] == ["w1", "w2"] and expired == []
    assert c.admit(req("again", 10_000, x=7)) is True


def test_missing_value_requeues_waiters_and_expired_leader_hands_over():
    c = core(start=8, delay=0, in_flight=1)
    c.admit(req("lead", 1_000, x=3))
    c.admit(req("w1", 5_000, x=3))
    step = c.poll(1_000)  # leader expired in the queue
    assert [p.request.query_id for p in step.expired] == ["lead"]
    assert [it.query_id for it in step.batches[0].record.items] == ["w1"]
    c.admit(req("w2", 5_000, x=3))
    bid = step.batches[0].record.batch_id
    key = step.batches[0].record.items[0].cache_key
    assert c.on_stats(stats(bid, 1, 10)) == [key]
    served, expired = c.deliver(key, None, 2_000)  # the worker did not fill the cache
    assert served == [] and expired == []
    step = c.poll(2_000)
    assert [it.query_id for it in step.batches[0].record.items] == ["w2"]


def test_no_coalescing_without_cache():
    c = core(start=8, delay=0, coalesce=False)
    assert c.admit(req("a", 10_000, x=1)) and c.admit(req("b", 10_000, x=1))
    assert len(c.poll(0).batches[0].record.items) == 2


def test_expired_predictions_group_by_partition_and_encode():
    preds = [(p.route, prediction(p, "m", "1", "expired", 5, error="deadline passed"))
             for p in [req("a", 1, part=0), req("b", 1, part=3), req("c", 1, part=3)]]
    groups = by_route(preds)
    assert sorted(groups) == [(None, 0), (None, 3)] and len(groups[(None, 3)].items) == 2
    assert groups[(None, 3)].selector_partition == 3
    assert groups[(None, 3)].items[0].trace == {"batcher_in": 0, "batched": 5}
    for rec in groups.values():
        assert decode_as(type(rec), encode(rec)) == rec


def test_a_request_with_a_reply_target_is_answered_there_and_batched_with_it():
    # a one-model app's query from the gateway (docs/design/0083): its prediction skips the selector
    straight, other = req("s", 10_000, x=1, part=2, reply="replies.gw"), req("o", 10_000, x=2, part=2)
    assert straight.route == ("replies.gw", 0) and other.route == (None, 2)
    groups = by_route([(p.route, prediction(p, "m", "1", "cached", 5)) for p in (straight, other)])
    assert [it.query_id for it in groups[("replies.gw", 0)].items] == ["s"]
    c = core(start=4, delay=0)
    assert c.admit(straight) and c.admit(other)
    items = c.poll(0).batches[0].record.items
    assert [(it.query_id, it.reply_topic, it.reply_partition) for it in items] == [
        ("s", "replies.gw", 0), ("o", None, None)]


def test_requests_that_cannot_finish_in_time_are_dropped_before_batching():
    c = core(start=4, delay=0)
    c.admit(req("warm", 100_000, x=1))
    bid = c.poll(0).batches[0].record.batch_id
    c.on_stats(stats(bid, 1, 10_000))  # this replica takes 10 ms
    c.admit(req("hopeless", 25_000, x=2))  # due in 5 ms at t=20 ms: cannot finish
    c.admit(req("fine", 60_000, x=3))
    step = c.poll(20_000)
    assert [p.request.query_id for p in step.hopeless] == ["hopeless"]
    assert [it.query_id for it in step.batches[0].record.items] == ["fine"]


def _learnt_slow(c, service_us):
    """The replica's one report says a batch of 1 takes ``service_us``."""
    c.admit(req("warm", 10**9, x=-1))
    c.on_stats(stats(c.poll(0).batches[0].record.batch_id, 1, service_us))


def test_a_replica_every_request_looks_hopeless_for_is_measured_again():
    """A replica learnt to take 300 ms (a slow version, a busy machine), with requests due in
    100 ms: each is given up, so no batch goes and no report could correct the estimate. Once
    nothing was sent for a second, one request goes anyway; its report of 1 ms lets the rest
    through again."""
    c = core(start=4, delay=0)
    _learnt_slow(c, 300_000)
    given_up, sent = [], []
    for t in range(10_000, 1_000_000, 10_000):  # a request every 10 ms, each due in 100 ms
        c.admit(req(f"q{t}", t + 100_000, x=t))
        step = c.poll(t)
        given_up += [p.request.query_id for p in step.hopeless]
        sent += [it.query_id for b in step.batches for it in b.record.items]
        assert step.expired == []
    assert sent == [] and len(given_up) == 99  # the estimate alone decided: none was sent
    c.admit(req("probe", 1_100_000, x=0.5))
    step = c.poll(1_000_000)
    assert [it.query_id for b in step.batches for it in b.record.items] == ["probe"]
    c.on_stats(stats(step.batches[0].record.batch_id, 1, 1_000))
    for t in range(1_010_000, 1_200_000, 10_000):  # fast again: batches go, none is given up
        c.admit(req(f"q{t}", t + 100_000, x=t))
        step = c.poll(t)
        assert step.hopeless == [] and len(step.batches) == 1, t
        c.on_stats(stats(step.batches[0].record.batch_id, 1, 1_000))


def test_a_probe_that_finds_the_replica_still_slow_gives_its_requests_up_again():
    c = core(start=4, delay=0)
    _learnt_slow(c, 300_000)
    c.admit(req("probe", 1_100_000, x=0.5))
    (probe,) = c.poll(1_000_000).batches
    c.on_stats(stats(probe.record.batch_id, 1, 300_000), now_us=1_300_000)
    c.admit(req("after", 1_400_000, x=2))
    step = c.poll(1_310_000)
    assert [p.request.query_id for p in step.hopeless] == ["after"] and step.batches == []


def test_a_new_version_learns_its_speed_again():
    """A rollback from a slow version: the version served now has its own speed, so the slow
    one's reports no longer give its requests up."""
    c = core(start=4, delay=0)
    _learnt_slow(c, 300_000)
    c.admit(req("due-in-100ms", 110_000, x=1))
    assert [p.request.query_id for p in c.poll(10_000).hopeless] == ["due-in-100ms"]
    c.admit(req("slow-in-flight", 10**9, x=3))
    old = c.poll(10_000).batches[0].record.batch_id  # sent to the slow version just before the change
    c.serve_version("2")
    c.on_stats(stats(old, 1, 300_000), now_us=15_000)  # its report says nothing of version 2
    c.admit(req("after", 120_000, x=2))
    step = c.poll(20_000)
    assert step.hopeless == [] and [it.query_id for it in step.batches[0].record.items] == ["after"]
    assert step.batches[0].record.version == "2"


def test_the_return_trip_counts_toward_a_requests_deadline():
    """Finishing on the device 2 ms before the deadline is not in time when the prediction
    still needs 3 ms to reach the selector: with that margin the request is dropped, unsent."""
    for margin, dropped in ((0, []), (3_000, ["tight"])):
        c = core(start=4, delay=0)
        c.hopeless_margin_us = margin
        c.admit(req("warm", 100_000, x=1))
        bid = c.poll(0).batches[0].record.batch_id
        c.on_stats(stats(bid, 1, 10_000))
        c.admit(req("tight", 32_000, x=2))  # at t=20 ms the device is done at 30 ms
        step = c.poll(20_000)
        assert [p.request.query_id for p in step.hopeless] == dropped
        assert len(step.batches) == (0 if dropped else 1)


def test_under_overload_the_oldest_is_given_up_for_a_batch_that_keeps_the_device_efficient():
    """The replica takes 2 ms + 1 ms per item. At t=12 ms one request is due at 20.1 ms and
    eight at 31 ms: with the old one, a batch must end by 20.1 ms (at most 6 items, and the
    other three follow in a second batch); without it, all eight go in one batch that ends at
    22 ms. The larger batch shares the fixed cost: the old one is given up (``hopeless``)."""
    c = core(start=10, delay=0)
    for size in (2, 6):  # teach the replica its curve
        for i in range(size):
            c.admit(req(f"w{size}-{i}", 10**9, x=100 + 10 * size + i))
        b = c.poll(0).batches[0].record
        c.on_stats(stats(b.batch_id, size, 2_000 + 1_000 * size))
    c.admit(req("old", 20_100, x=1))
    for i in range(8):
        c.admit(req(f"fresh{i}", 31_000, x=10 + i))
    step = c.poll(12_000)
    assert [p.request.query_id for p in step.hopeless] == ["old"]
    assert [it.query_id for it in step.batches[0].record.items] == [f"fresh{i}" for i in range(8)]


def test_the_wait_behind_a_batch_in_flight_is_its_own_size_s_service_time():
    """Two batches in flight allowed: a full batch of 10 (12 ms) was just sent. The next is
    formed just in time, at 9 ms, and can start at 12: a request due at 14 ms cannot make it
    even alone (12 + 3 ms), one due at 30 ms can. Timed by the recent batches' median
    (3.5 ms, for batches of 1 and 2), the device would look free by then and the first
    would be sent, to be late."""
    c = core(start=10, delay=0, in_flight=2)
    for size in (1, 2):
        for i in range(size):
            c.admit(req(f"w{size}-{i}", 10**9, x=100 + 10 * size + i))
        b = c.poll(0).batches[0].record
        c.on_stats(stats(b.batch_id, size, 2_000 + 1_000 * size), now_us=0)
    for i in range(10):
        c.admit(req(f"full{i}", 10**9, x=10 + i))
    assert len(c.poll(0).batches[0].record.items) == 10  # goes at once: nothing can join it
    c.admit(req("behind-late", 14_000, x=1))
    c.admit(req("behind-ok", 30_000, x=2))
    assert c.poll(0).batches == []  # not yet due: requests may still join
    step = c.poll(9_000)
    assert [p.request.query_id for p in step.hopeless] == ["behind-late"]
    assert [it.query_id for it in step.batches[0].record.items] == ["behind-ok"]


def test_a_slow_replica_does_not_give_up_what_a_fast_one_can_serve_in_time():
    """Replicas are picked by load: an idle slow replica (400 ms a batch) came first, and every
    request, due in 100 ms, was given up as hopeless while a 3 ms replica sat idle beside it."""
    c = core(replicas=2, start=4, delay=0, in_flight=2)
    c.admit(req("warm0", 10**9, x=-1))
    (b0,) = c.poll(0).batches
    c.on_stats(stats(b0.record.batch_id, 1, 3_000))
    c.admit(req("warm1", 10**9, x=-2))
    (b1,) = c.poll(1).batches
    c.on_stats(stats(b1.record.batch_id, 1, 400_000))
    assert (b0.record.replica, b1.record.replica) == (0, 1)
    given_up, replicas = [], []
    for t in range(20_000, 900_000, 20_000):  # 50 q/s, each due in 100 ms; no probe due yet
        c.admit(req(f"q{t}", t + 100_000, x=t))
        step = c.poll(t)
        given_up += [p.request.query_id for p in step.hopeless]
        for b in step.batches:
            replicas.append(b.record.replica)
            c.on_stats(stats(b.record.batch_id, len(b.record.items), 3_000), now_us=t + 3_000)
    assert given_up == [] and replicas == [0] * 44
