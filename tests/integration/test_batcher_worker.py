"""Batcher + real workers (a simulated-accelerator profile model): request -> batch -> worker ->
prediction, the worker fills the cache, a repeat is answered by the batcher alone, and both
replicas take work and report their own batches."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipstream.settings import Settings
from schemas import Batch, Predictions
from tests.integration.batcher_harness import CLI, ROOT, preds_of, uniq
from clipstream.testing.models import make_profile_model

pytestmark = pytest.mark.integration


def start_worker(settings: Settings, tmp: Path, model: str, folder: Path, replica: int) -> tuple[subprocess.Popen, Path]:
    log = tmp / f"worker-{replica}.log"
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix}
    proc = subprocess.Popen(
        [CLI, "worker", "--model", model, "--path", str(folder), "--replica", str(replica), "--replicas", "2",
         "--version", "1", "--device", "cpu"],
        cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )
    return proc, log


def test_requests_flow_through_real_workers_and_repeats_hit_the_cache(
    settings: Settings, tmp_path: Path, run_batcher: Any, wire: Any
) -> None:
    model = uniq("pm")
    folder = make_profile_model(tmp_path, model, fixed_ms=3.0, per_item_ms=0.1, shape=(4,))
    w = wire(model, 2)
    run_batcher(model, "--version", "1", "--replicas", "2", "--batch-delay-ms", "2")
    workers = [start_worker(settings, tmp_path, model, folder, r) for r in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        for proc, log in workers:
            while "ready: worker" not in log.read_text():
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
        n = 60
        inputs = [np.full(4, i, np.float32) for i in range(n)]
        for i, x in enumerate(inputs):
            w.request(f"q{i}", x, part=i % 4)
        got = w.take(w.cat.predictions.name, Predictions, lambda g: len(preds_of(g)) >= n, timeout_s=60)
        preds = preds_of(got)
        assert {p.status for p, _ in preds.values()} == {"ok"}
        assert all(part == int(q[1:]) % 4 for q, (_, part) in preds.items())
        assert all({"batcher_in", "batched", "worker_in", "worker_out"} <= set(p.trace) for p, _ in preds.values())

        # every batch went to one replica's partition, and both replicas had some
        batches = w.take(w.cat.batches(model).name, Batch, lambda g: sum(len(b.items) for b, _ in g) >= n)
        assert {msg.partition() for _, msg in batches} == {0, 1}
        assert all(b.replica == msg.partition() for b, msg in batches)

        # the workers filled the cache: a repeat never reaches them
        w.request("again", inputs[7], part=3)
        got = w.take(w.cat.predictions.name, Predictions, lambda g: "again" in preds_of(g))
        pred, part = preds_of(got)["again"]
        assert pred.status == "cached" and part == 3 and "worker_in" not in pred.trace
        assert pred.output == preds["q7"][0].output
        assert w.quiet_for(w.cat.batches(model).name, 0.5) == []
    finally:
        for proc, _ in workers:
            proc.terminate()
        for proc, _ in workers:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
