"""``bench.spinning``: a model folder loaded as a worker loads it, and its runs timed per batch size."""

from __future__ import annotations

from pathlib import Path

import pytest

import bench.spinning as spinning
from clipstream.testing.models import make_onnx_digits_model


def test_child_times_each_batch_size_of_a_model_loaded_as_a_worker_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spinning, "RUNS", 3)
    monkeypatch.setattr(spinning, "GAP_S", 0.001)
    got = spinning.child(str(make_onnx_digits_model(tmp_path, threads=None)))
    assert sorted(got) == sorted(str(b) for b in spinning.BATCHES)
    for timing in got.values():
        assert timing["cpu_us"] > 0 and timing["wall_us"] > 0


def test_a_child_that_fails_says_which_model(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "model.yaml").write_text("backend: onnx\n")
    with pytest.raises(RuntimeError, match="timing broken failed"):
        spinning.run_child(folder)
