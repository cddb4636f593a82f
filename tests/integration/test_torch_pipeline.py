"""A torch model served end to end by `clipstream up`: the worker stage puts it on the device
``auto`` picks (CUDA where a usable GPU exists, else the CPU) and says which, in its ready line
and through ``inspect``; the gateway's answers are the model's own, whichever device ran it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from clipstream.infra.launcher import pick_free_ports
from clipstream.testing.models import digits, make_torch_model
from clipstream.testing.procs import UpProcess, predict_admitted, wait_until
from frontend.client import Client
from registry.spec import load_spec
from workers.backends import load_model
from workers.backends.devices import cuda_usable

pytest.importorskip("torch")
pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _worker_ready_line(state_dir: Path) -> str:
    """The worker's ``ready:`` line from its log under ``up``'s log folder ('' until it is there)."""
    for log in state_dir.glob("up/gateway-*/worker*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("ready: worker"):
                return line
    return ""


def test_a_torch_model_runs_on_the_device_auto_picks_and_answers_as_it_does_alone(settings, tmp_path):
    warnings.simplefilter("ignore", FutureWarning)
    app = f"mlp{uuid.uuid4().hex[:6]}"
    folder = make_torch_model(tmp_path / "models")
    (tmp_path / "app.yaml").write_text(yaml.safe_dump({
        "apps": [{"name": app, "policy": "single", "slo_ms": 3000, "default_output": -1, "models": ["mlp"]}],
        "models": [{"name": "mlp", "version": "1", "path": "models/mlp/1", "replicas": 1}],
    }))
    port, grpc_port = pick_free_ports(2)
    state = tmp_path / "state"
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix, "CLIPSTREAM_STATE_DIR": str(state),
           "PYTHONUNBUFFERED": "1", "CLIPSTREAM_GATEWAY_GRPC_PORT": str(grpc_port)}
    up = UpProcess(tmp_path / "app.yaml", port, env, ROOT)
    try:
        up.wait_ready(240)
        device = "cuda" if cuda_usable() else "cpu"
        line = wait_until(lambda: _worker_ready_line(state), 30, "the worker's ready line")
        assert line.endswith(f"device {device}"), line
        shown = subprocess.run([sys.executable, "-m", "clipstream.cli", "inspect"], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=120, check=True).stdout
        assert f" device={device}" in next(s for s in shown.splitlines() if s.startswith("model mlp:")), shown

        alone = load_model(load_spec(folder), device="cpu")
        x, _ = digits()
        client = Client(f"http://127.0.0.1:{port}", app=app)
        for i in (3, 400, 1201):
            want = alone.predict_batch(x[i:i + 1])[0]
            r = predict_admitted(client, app, x[i].tolist())
            assert r["default"] is False and r["models"] == {"answered": ["mlp"], "missing": []}
            assert r["output"] == int(np.argmax(want))
            np.testing.assert_allclose(r["scores"], want, rtol=1e-4, atol=1e-5)
    finally:
        assert up.stop() == 0, "\n".join(up.lines[-30:])
