"""Records and their size limit on a real broker, batcher and worker: a batch of large inputs is
cut to fit ``CLIPSTREAM_MAX_RECORD_BYTES``, and an input too large for any record is answered
with the reason, while the batcher keeps serving (docs/design/0106)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipstream.settings import Settings
from clipstream.testing.models import make_profile_model
from schemas import Batch, Predictions
from tests.integration.batcher_harness import preds_of, uniq
from tests.integration.test_batcher_worker import start_worker
from topics.sizes import input_limit

pytestmark = pytest.mark.integration

LIMIT = 64 * 1024  # the lowest the setting takes: a few of these inputs fill a record
WIDTH = 4096  # float32: 16 KiB an input, so three go in a batch


def test_a_batch_of_large_inputs_is_cut_to_fit_the_record_limit_and_a_too_large_input_is_answered(
    settings: Settings, tmp_path: Path, run_batcher: Any, wire: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLIPSTREAM_MAX_RECORD_BYTES", str(LIMIT))  # the batcher's and the worker's
    monkeypatch.setenv("CLIPSTREAM_BATCHER_AIMD_START", "32")  # batches as large as the queue from the first
    model = uniq("big")
    folder = make_profile_model(tmp_path, model, fixed_ms=20.0, per_item_ms=0.1, shape=(WIDTH,))
    w = wire(model, 1)
    run_batcher(model, "--version", "1", "--replicas", "1", "--batch-delay-ms", "5", "--max-batch-size", "32")
    proc, log = start_worker(settings, tmp_path, model, folder, 0)
    try:
        deadline = time.monotonic() + 120
        while "ready: worker" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        n = 24
        for i in range(n):  # at once: a 20 ms model lets them queue into full batches
            w.request(f"q{i}", np.full(WIDTH, i, np.float32), part=i % 4)
        huge = np.zeros(input_limit(LIMIT) // 4 + 1, np.float32)
        w.request("huge", huge, part=0)
        got = w.take(w.cat.predictions.name, Predictions, lambda g: len(preds_of(g)) >= n + 1, timeout_s=60)
        preds = preds_of(got)
        assert {preds[f"q{i}"][0].status for i in range(n)} == {"ok"}
        refused = preds["huge"][0]
        assert refused.status == "error" and f"an input of {huge.nbytes} bytes is over" in (refused.error or ""), refused
        assert "CLIPSTREAM_MAX_RECORD_BYTES" in (refused.error or "")

        batches = w.take(w.cat.batches(model).name, Batch, lambda g: sum(len(b.items) for b, _ in g) >= n)
        assert all(len(msg.value()) <= LIMIT for _, msg in batches), [len(m.value()) for _, m in batches]
        assert max(len(b.items) for b, _ in batches) > 1  # cut to fit, not sent one by one
        assert "huge" not in {item.query_id for b, _ in batches for item in b.items}
    finally:
        proc.terminate()
        proc.wait(20)
