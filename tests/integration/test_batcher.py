"""The batcher process against the real broker and Redis; the test plays the worker's part.

request -> (cache hit) -> predictions, or -> batches.<model> at a replica's partition; the
test answers batches with BatchStats (and fills the cache where a worker would).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchers.cache import cache_key
from clipstream.clock import now_us
from clipstream.settings import Settings
from schemas import Batch, DeadLetter, Predictions, Tensor, decode_as, encode
from tests.integration.batcher_harness import preds_of, uniq
from topics.markers import is_handover, ready_marker

pytestmark = [pytest.mark.integration, pytest.mark.component]  # the test plays a neighbouring stage

def test_hit_skips_the_worker_miss_is_batched_bad_input_is_dead_lettered(
    run_batcher: Any, wire: Any, redis_client: Any
) -> None:
    model = uniq("m1")
    w = wire(model)
    run_batcher(model, "--version", "7", "--replicas", "1")
    hot, cold = np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)
    value = encode(Tensor.of(np.array([0.25, 0.75], np.float32)))
    redis_client.set(cache_key(model, "7", Tensor.of(hot)), value, ex=60)

    w.request("hit", hot, part=2)
    w.request("miss", cold, part=3)
    w.raw(w.cat.requests(model).name, b"not avro at all")

    got = w.take(w.cat.predictions.name, Predictions, lambda g: "hit" in preds_of(g))
    pred, partition = preds_of(got)["hit"]
    assert partition == 2 and pred.status == "cached" and pred.version == "7"
    assert pred.output == decode_as(Tensor, value)
    assert {"dispatched", "batcher_in", "batched"} <= set(pred.trace)

    batches = w.take(w.cat.batches(model).name, Batch, lambda g: len(g) >= 1)
    batch, msg = batches[0]
    assert msg.partition() == 0 and batch.replica == 0 and batch.version == "7"
    assert [it.query_id for it in batch.items] == ["miss"]  # the hit never reaches a worker
    item = batch.items[0]
    assert item.cache_key == cache_key(model, "7", Tensor.of(cold)) and item.selector_partition == 3
    assert item.trace["batcher_in"] <= item.trace["batched"]

    dead = w.take(w.cat.deadletter.name, DeadLetter, lambda g: len(g) >= 1)
    assert dead[0][0].stage == "batcher" and dead[0][0].payload == b"not avro at all"
    assert "C3 01" in dead[0][0].reason


def test_requests_sent_just_before_a_new_batcher_started_are_served(run_batcher: Any, wire: Any) -> None:
    """A model added to a running app: the selector sends it requests as soon as the registry
    names it, a few seconds before the batcher that serves it has joined its (new) group."""
    model = uniq("m0")
    w = wire(model)
    w.request("waiting-for-its-batcher", np.array([5.0, 6.0], np.float32), part=1)
    w.producer.flush(10)
    run_batcher(model, "--version", "1", "--replicas", "1", "--batch-delay-ms", "0")
    batches = w.take(w.cat.batches(model).name, Batch, lambda g: len(g) >= 1)
    assert [it.query_id for it in batches[0][0].items] == ["waiting-for-its-batcher"]


def test_expired_requests_are_reported_not_lost(run_batcher: Any, wire: Any) -> None:
    model = uniq("m2")
    w = wire(model)
    run_batcher(model, "--version", "1", "--replicas", "1", "--batch-delay-ms", "0", "--no-cache")
    x = np.zeros(2, np.float32)
    w.request("first", x)  # takes the only replica's credits (never reported)
    w.request("second", x)
    batches = w.take(w.cat.batches(model).name, Batch, lambda g: sum(len(b.items) for b, _ in g) >= 2)
    assert sum(len(b.items) for b, _ in batches) == 2
    w.request("late", x, deadline_us=now_us() + 300_000, part=0)  # no credit: waits, then expires
    w.request("dead-on-arrival", x, deadline_us=now_us() - 1, part=1)
    got = w.take(w.cat.predictions.name, Predictions, lambda g: len(preds_of(g)) >= 2)
    preds = preds_of(got)
    assert {q: (p.status, part) for q, (p, part) in preds.items()} == {
        "late": ("expired", 0), "dead-on-arrival": ("expired", 1)}


def test_identical_misses_are_evaluated_once(run_batcher: Any, wire: Any, redis_client: Any) -> None:
    model = uniq("m3")
    w = wire(model)
    b = run_batcher(model, "--version", "1", "--replicas", "1", "--batch-delay-ms", "0")
    x = np.array([9.0], np.float32)
    w.request("a", x)
    batches = w.take(w.cat.batches(model).name, Batch, lambda g: len(g) >= 1)
    for q in ("b", "c"):
        w.request(q, x)  # identical, while "a" is being evaluated
    w.producer.flush(10)
    b.wait_for('"requests": 3,')  # b and c reached the batcher (and must not be batched)
    batch = batches[0][0]
    redis_client.set(batch.items[0].cache_key, encode(Tensor.of(np.float64(1.5))), ex=60)
    w.raw(w.cat.batch_stats(model).name, b"no report")  # a bad worker report: dead-lettered, not fatal
    w.stats(batch, 1_000)
    got = w.take(w.cat.predictions.name, Predictions, lambda g: len(preds_of(g)) >= 2)
    assert {q: p.status for q, (p, _) in preds_of(got).items()} == {"b": "cached", "c": "cached"}
    dead = w.take(w.cat.deadletter.name, DeadLetter, lambda g: any(d.payload == b"no report" for d, _ in g))
    assert [d.source_topic for d, _ in dead if d.payload == b"no report"] == [w.cat.batch_stats(model).name]
    assert w.quiet_for(w.cat.batches(model).name, 1.0) == []  # nothing else was batched


def test_two_replicas_both_work_each_with_its_own_aimd(run_batcher: Any, wire: Any) -> None:
    model = uniq("m4")
    w = wire(model, 2)
    b = run_batcher(model, "--version", "1", "--replicas", "2", "--no-cache", "--batch-delay-ms", "1",
                    "--latency-objective-ms", "20")
    n = 150
    # deadlines past the take's own timeout: a slow start must not expire requests, which are
    # then never batched (what this test checks is each replica's AIMD, not the deadlines)
    for i in range(n):
        w.request(f"q{i}", np.array([float(i)], np.float32), deadline_us=now_us() + 120_000_000)
    sizes: dict[int, list[int]] = {0: [], 1: []}

    def worker(batch: Batch, msg: Any) -> None:
        # replica 0 is fast (1 ms), replica 1 always misses the 20 ms objective
        sizes[msg.partition()].append(len(batch.items))
        w.stats(batch, 1_000 if msg.partition() == 0 else 50_000)

    try:
        w.take(w.cat.batches(model).name, Batch,
               lambda g: sum(len(bb.items) for bb, _ in g) >= n, timeout_s=60, on=worker)
    except AssertionError:
        # which side stalled: the batcher's own stats lines say whether it kept sending
        stats_lines = [x for x in b.output().splitlines() if x.startswith("stats: ")]
        raise AssertionError(f"batch sizes taken per replica: {sizes}; the batcher's last stats lines:\n"
                             + "\n".join(stats_lines[-5:])) from None
    assert sizes[0] and sizes[1], sizes
    assert max(sizes[0]) >= 4, sizes
    assert set(sizes[1]) == {1}, sizes
    # the batcher's own stats line shows the two AIMD states apart
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(x[len("stats: "):]) for x in b.output().splitlines() if x.startswith("stats: ")]
        maxima = [r["max_batch_size"] for r in lines[-1]["replicas"]] if lines else []
        if maxima and maxima[0] >= 4 and maxima[1] == 1:
            break
        assert time.monotonic() < deadline, b.output()[-2000:]
        time.sleep(0.1)


def test_one_process_serves_several_models_each_with_its_own_queue_and_version(
    run_batcher: Any, wire: Any, settings: Settings, tmp_path: Path
) -> None:
    """``--model`` twice: one process, one ready line; each model's requests go to its own batch
    topic with its own version, its own credit, and a version deployed later is followed live."""
    from registry.topic import RegistryWriter, wait_for
    from clipstream.testing.models import make_python_model

    a, b = uniq("sa"), uniq("sb")
    wa, wb = wire(a), wire(b)
    src = "class Model:\n    def __init__(self, path, config): pass\n"
    with RegistryWriter(settings) as reg:
        reg.model(a, "1", make_python_model(tmp_path, a, src, labels=[0, 1], shape=(2,)))
        reg.model(b, "4", make_python_model(tmp_path, b, src, labels=[0, 1], shape=(2,), version="4"))
    wait_for(settings, lambda v: a in v.models and b in v.models)
    proc = run_batcher(a, "--model", b, "--no-cache", "--batch-delay-ms", "0")
    assert f"ready: batcher {a},{b}" in proc.output()

    x = np.zeros(2, np.float32)
    wa.request("a1", x)
    wb.request("b1", x)
    got_a = wa.take(wa.cat.batches(a).name, Batch, lambda g: len(g) >= 1)
    got_b = wb.take(wb.cat.batches(b).name, Batch, lambda g: len(g) >= 1)
    assert [(bb.model, bb.version, [i.query_id for i in bb.items]) for bb, _ in got_a] == [(a, "1", ["a1"])]
    assert [(bb.model, bb.version, [i.query_id for i in bb.items]) for bb, _ in got_b] == [(b, "4", ["b1"])]

    # b's credit is its own: with a's two credits used up and never returned, b still batches
    wa.request("a2", x)
    wa.take(wa.cat.batches(a).name, Batch, lambda g: len(g) >= 1)
    wa.request("a3", x)  # a has no credit left: it waits in a's queue
    wb.stats(got_b[0][0], 1_000)
    wb.request("b2", x)
    wb.take(wb.cat.batches(b).name, Batch, lambda g: any(i.query_id == "b2" for bb, _ in g for i in bb.items))
    assert wa.quiet_for(wa.cat.batches(a).name, 0.5) == []

    with RegistryWriter(settings) as reg:  # a new version of b, followed without a restart
        reg.model(b, "5", make_python_model(tmp_path, b, src, labels=[0, 1], shape=(2,), version="5"))
    # ... once version 5's worker says it is ready (docs/design/0021): until then b's batches
    # stay on version 4, for longer than the batcher takes to read the registry (1 s)
    stay = time.monotonic() + 2.5
    while time.monotonic() < stay:
        wb.request("b3", x)
        got = wb.take(wb.cat.batches(b).name, Batch, lambda g: len(g) >= 1)
        for bb, _ in got:
            wb.stats(bb, 1_000)
        assert [bb.version for bb, _ in got] == ["4"] * len(got)
    wb.raw(wb.cat.batch_stats(b).name, encode(ready_marker(b, "5", 0, "test", now_us())))
    deadline = time.monotonic() + 20
    seen: list[Batch] = []
    while not any(bb.version == "5" and bb.items for bb in seen):
        wb.request("b4", x)
        got = wb.take(wb.cat.batches(b).name, Batch, lambda g: len(g) >= 1)
        for bb, _ in got:
            wb.stats(bb, 1_000)
        seen += [bb for bb, _ in got]
        assert time.monotonic() < deadline, "the batcher did not follow b's new version"
    first = next(bb for bb in seen if bb.version == "5")
    assert is_handover(first) and first.replica == 0  # version 4's worker is told first
    assert proc.proc.poll() is None and proc.output().count("ready: batcher") == 1
