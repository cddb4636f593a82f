"""Models served as a group (docs/design/0088), through `clipstream up`: one worker process runs
every member on one batch, an ensemble's queries are answered by every member, a one-model app
over a member goes straight to the group's worker, and a member's new version and its rollback
move the group to new workers without a query waiting for the cutoff."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from clipstream.infra.launcher import pick_free_ports
from clipstream.testing.models import make_python_model
from clipstream.testing.procs import UpProcess, wait_until
from registry.groups import group_version
from tests.integration.test_model_deploy import ANSWERS, Load, _cli

pytestmark = pytest.mark.integration


def test_a_group_serves_its_members_in_one_worker_and_moves_with_a_members_version(settings: Any,
                                                                                   tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    one, ensemble = f"one{tag}", f"ens{tag}"
    models = tmp_path / "models"
    for name, version, label in (("a", "1", 1), ("a", "2", 2), ("b", "1", 0), ("c", "1", 0)):
        make_python_model(models, name, ANSWERS.format(label=label, load_s=0.5), labels=[0, 1, 2], version=version)
    slo_ms = 1000
    (tmp_path / "app.yaml").write_text(yaml.safe_dump({
        "apps": [{"name": one, "policy": "single", "slo_ms": slo_ms, "default_output": -1, "models": ["a"]},
                 {"name": ensemble, "policy": "exp4", "slo_ms": slo_ms, "default_output": -1,
                  "models": ["a", "b", "c"]}],
        "models": [{"name": "a", "version": "1", "path": "models/a/1", "group": "g"},
                   {"name": "b", "version": "1", "path": "models/b/1", "group": "g"},
                   {"name": "c", "version": "1", "path": "models/c/1"}],
    }))
    port = pick_free_ports(1)[0]
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix, "PYTHONUNBUFFERED": "1",
           "CLIPSTREAM_STATE_DIR": str(tmp_path / "state"), "CLIPSTREAM_UP_SELECTORS": "1",
           "CLIPSTREAM_UP_WARM_UP_S": "3"}
    up = UpProcess(tmp_path / "app.yaml", port, env, Path(__file__).resolve().parents[2])
    lines = up.lines
    load = Load(f"http://127.0.0.1:{port}", one)
    ens = Load(f"http://127.0.0.1:{port}", ensemble)
    v1, v2 = group_version({"a": "1", "b": "1"}), group_version({"a": "2", "b": "1"})
    try:
        up.wait_ready(240)
        started = "\n".join(lines)
        assert f"worker-g-v{v1}-0" in started and "worker-c-v1-0" in started
        assert "worker-a-" not in started and "worker-b-" not in started  # the members run in g's worker
        shown = subprocess.run([sys.executable, "-m", "clipstream.cli", "inspect", "--json"], env=env,
                               capture_output=True, text=True, timeout=120)
        assert json.loads(shown.stdout)["groups"]["g"] == {"version": v1, "replicas": 1, "models": ["a", "b"]}
        for t in (*load.threads, *ens.threads):
            t.start()
        wait_until(lambda: len(load.outputs_since(0)) >= 20 and len(ens.outputs_since(0)) >= 20, 60,
                   "answers from both apps")

        deployed = time.monotonic()
        _cli("deploy-model", "a", str(models / "a" / "2"), "--version", "2", env=env)
        wait_until(lambda: 2 in load.outputs_since(deployed), 90, "answers from a's version 2")
        wait_until(lambda: any(f"worker-g-v{v1}-0 stopped (its partition was handed over" in l for l in lines),
                   30, "the group's old worker to stop at the handover")

        rolled_back = time.monotonic()
        _cli("rollback", "a", env=env)
        wait_until(lambda: 1 in load.outputs_since(rolled_back), 90, "answers from a's version 1 again")
        wait_until(lambda: any(f"worker-g-v{v2}-0 stopped (its partition was handed over" in l for l in lines),
                   30, "the group's second worker to stop at the handover")
        settled = time.monotonic()
        wait_until(lambda: len(ens.outputs_since(settled)) >= 10, 30, "ensemble answers after the rollback")
    finally:
        load.halt()
        ens.halt()
        up.stop()

    assert not load.errors and not ens.errors, (load.errors[:5], ens.errors[:5])
    for calls in (load, ens):
        assert [r for _, r in calls.answers if r["default"]] == [], "\n".join(lines[-40:])
    # every ensemble answer came from all three models: two in the group's worker, one alone
    assert all(sorted(r["models"]["answered"]) == ["a", "b", "c"] and r["models"]["missing"] == []
               for _, r in ens.answers), [r["models"] for _, r in ens.answers if r["models"]["missing"]][:3]
    ledger = [(sent, r["output"]) for sent, r in load.answers]
    to_v2 = min(sent for sent, out in ledger if sent >= deployed and out == 2)
    to_v1 = min(sent for sent, out in ledger if sent >= rolled_back and out == 1)
    assert all(out == 1 for sent, out in ledger if sent < deployed)
    assert all(out == 2 for sent, out in ledger if to_v2 + 0.1 <= sent < rolled_back)
    assert all(out == 1 for sent, out in ledger if sent >= to_v1 + 0.1)
