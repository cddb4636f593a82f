"""The benchmarks' pipeline (``bench.common.Pipeline``) starts on a Kafka and Redis of its own,
serves, and stops them with itself. CI runs no benchmark, so this is what keeps them startable."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from bench.common import Pipeline, write_app_file
from clipstream.testing.models import make_profile_model
from clipstream.testing.procs import wait_until

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_bench_pipeline_runs_on_its_own_infra_and_stops_it(tmp_path: Path) -> None:
    make_profile_model(tmp_path / "models", "fast", fixed_ms=1.0)
    app = write_app_file(tmp_path / "app.yaml",
                         [{"name": "b", "policy": "single", "slo_ms": 1000, "default_output": -1, "models": ["fast"]}],
                         [{"name": "fast", "version": "1", "path": "models/fast/1", "replicas": 1}])
    with Pipeline(app, state_dir=tmp_path / "state", log=lambda _: None) as pipe:
        r = httpx.post(f"{pipe.url}/v1/apps/b/predict", json={"input": [0.5] * 64}, timeout=10)
        assert r.status_code == 200 and r.json()["default"] is False, r.text
        infra = {label: pid for pid, label in pipe.processes().items() if label in ("kafka", "redis")}
        assert set(infra) == {"kafka", "redis"}  # started for this pipeline, in its state dir
        assert pipe.kafka != os.environ.get("CLIPSTREAM_KAFKA_BOOTSTRAP")  # not the tests' own broker
    wait_until(lambda: not any(_alive(pid) for pid in infra.values()), 60, "its Kafka and Redis to stop")
