"""The pipeline the fault suite breaks: a private 3-broker KRaft cluster and Redis (as
``clipstream infra up --brokers 3 --free-ports --state-dir DIR`` starts them), and
``clipstream up`` serving an Exp4 app of three quick python models on them, with its default
two selector members, two gateway members on one port and two batcher members. ``m1`` runs in
a worker of its own; ``m2`` and ``m3`` are a group served by one worker (docs/design/0088), as
the demo serves its models, so a worker fault can hit either kind. One pipeline serves every
fault of the module, in turn; each test
starts only once both paths give real answers again, so a fault's recovery is part of the
next test's premise, not of its ledger.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from clipstream.infra import _die_with_parent_hook, launcher
from clipstream.settings import Settings
from clipstream.testing.models import make_python_model
from clipstream.testing.procs import wait_until
from registry.groups import group_version

ROOT = Path(__file__).resolve().parents[2]
# Three JVMs start at once on a machine whose two cores other test processes share: a bound on
# a failure, not a wait (``up`` returns as soon as every node answers)
CLUSTER_START_S = 180.0
UP_READY_S = 300.0
MODELS = ("m1", "m2", "m3")
GROUP, GROUPED = "g", ("m2", "m3")  # the members share one worker process
# the shared batcher serves the group as one unit beside m1 (``clipstream.pipeline.wanted_stages``)
BATCHER = f"batchers-{GROUP}+m1"
WORKER, GROUP_WORKER = "worker-m1-v1-0", f"worker-{GROUP}-v{group_version({m: '1' for m in GROUPED})}-0"
SLO_MS = 300.0  # a quick python ensemble answers in a few ms: no default in steady state

SCORES = '''
import numpy as np


class Model:
    """Ten class scores: a softmax over ten input features starting at ``offset``."""

    def __init__(self, path, config):
        self.offset = int(config["offset"])

    def predict_batch(self, inputs):
        x = inputs.reshape(len(inputs), -1)[:, self.offset:self.offset + 10] * 4.0
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
'''


@dataclass
class Pipeline:
    """Where everything runs, and what ``up`` printed."""

    infra_settings: Settings  # the cluster's state dir (for status and healing)
    status: launcher.InfraStatus
    settings: Settings  # the clients' settings: the cluster, Redis and the run's topic prefix
    url: str
    app: str
    log_dir: Path  # up's stage logs and heartbeat files
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    @property
    def stages(self) -> list[str]:
        return ["selector-1", "selector-2", "gateway-1", "gateway-2",
                *(f"{BATCHER}.{i}" for i in (1, 2)), WORKER, GROUP_WORKER]

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.lines[-n:])


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("faults")
    infra_settings = Settings(state_dir=tmp / "infra")
    proc: subprocess.Popen[str] | None = None
    try:
        status = launcher.up(infra_settings, free_ports=True, progress=lambda _: None,
                             timeout_s=CLUSTER_START_S, die_with_parent=True, brokers=3)
        app, prefix = f"faults{uuid.uuid4().hex[:6]}", f"f{uuid.uuid4().hex[:10]}."
        for i, m in enumerate(MODELS):
            make_python_model(tmp / "models", m, SCORES, labels=list(range(10)), extra={"offset": 10 * i})
        (tmp / "app.yaml").write_text(yaml.safe_dump({
            "apps": [{"name": app, "policy": "exp4", "slo_ms": SLO_MS, "default_output": -1, "models": list(MODELS)}],
            "models": [{"name": m, "version": "1", "path": f"models/{m}/1", "replicas": 1,
                        **({"group": GROUP} if m in GROUPED else {})} for m in MODELS],
        }))
        port = launcher.pick_free_ports(1)[0]
        env = {**os.environ, **status.env(), "CLIPSTREAM_TOPIC_PREFIX": prefix, "PYTHONUNBUFFERED": "1",
               "CLIPSTREAM_UP_WARM_UP_S": "5",  # each test waits for real answers itself
               "CLIPSTREAM_UP_GATEWAYS": "2", "CLIPSTREAM_UP_BATCHER_MEMBERS": "2"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "clipstream.cli", "up", "-f", str(tmp / "app.yaml"), "--free-ports",
             "--state-dir", str(tmp / "up"), "--gateway-port", str(port)],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=_die_with_parent_hook(),  # a killed pytest leaves no pipeline behind
        )
        pipe = Pipeline(infra_settings, status,
                        Settings(kafka_bootstrap=status.kafka_bootstrap, redis_url=status.redis_url,
                                 topic_prefix=prefix, state_dir=tmp / "clients"),
                        f"http://127.0.0.1:{port}", app, tmp / "up" / "up" / f"gateway-{port}", proc)
        ready = threading.Event()

        def read() -> None:
            assert proc is not None and proc.stdout is not None
            with (tmp / "up.out").open("a") as out:  # what ``up`` said, kept for a post-mortem
                for line in proc.stdout:
                    pipe.lines.append(line.rstrip())
                    out.write(line)
                    out.flush()
                    if line.startswith("ready: "):
                        ready.set()

        threading.Thread(target=read, daemon=True).start()
        wait_until(lambda: ready.is_set() or proc.poll() is not None, UP_READY_S, "clipstream up to be ready")
        if not ready.is_set():
            raise AssertionError(f"clipstream up exited ({proc.returncode}) before ready:\n{pipe.tail()}")
        yield pipe
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        launcher.down(infra_settings)
