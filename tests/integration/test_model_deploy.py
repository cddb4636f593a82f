"""Zero-downtime model changes (docs/design/0021): under steady load through `clipstream up`,
`deploy-model` to a version that takes seconds to load, then `rollback`. No query may wait for
the cutoff because of either change, and the answers move to the new version and back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from clipstream.infra.launcher import pick_free_ports
from clipstream.testing.models import make_python_model
from clipstream.testing.procs import UpProcess, predict_admitted, wait_until
from frontend.client import Client

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LOAD_S = 3.0  # each version's model takes this long to load: the window a version change must hide

ANSWERS = '''
import time
import numpy as np


class Model:
    """Loads slowly, then always answers class {label}."""
    def __init__(self, path, config):
        time.sleep({load_s})
    def predict_batch(self, inputs):
        out = np.zeros((len(inputs), 3), np.float32)
        out[:, {label}] = 1.0
        return out
'''


class Load:
    """Two closed-loop callers, each sending its next query (a fresh input: no cache hit, from
    another app's callers either) as soon as its last is answered; every answer is kept, in
    order, with its send time."""

    def __init__(self, url: str, app: str) -> None:
        self.url, self.app = url, app
        self.answers: list[tuple[float, dict[str, Any]]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._call, args=(i,), daemon=True) for i in range(2)]

    def _call(self, seed: int) -> None:
        rng = np.random.default_rng([seed, *self.app.encode()])  # two apps over one model share no input
        with Client(self.url, app=self.app) as client:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    r = predict_admitted(client, self.app, rng.uniform(0, 1, 64).tolist())
                except Exception as exc:  # noqa: BLE001 - the ledger counts it, the test fails on it
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with self.lock:
                    self.answers.append((sent, r))
                time.sleep(0.03)  # a steady, small load (about 50 q/s from both)

    def halt(self) -> None:
        """Stop the callers and wait for their last calls."""
        self.stop.set()
        for t in self.threads:
            if t.is_alive():
                t.join(60)

    def answers_since(self, t: float) -> list[dict[str, Any]]:
        with self.lock:
            return [r for sent, r in self.answers if sent >= t]

    def outputs_since(self, t: float) -> list[int]:
        with self.lock:
            return [r["output"] for sent, r in self.answers if sent >= t]


def _cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "clipstream.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _serving(env: dict[str, str]) -> tuple[str, set[str]]:
    """`inspect`'s registry version of the model, and the versions its batches go to."""
    flip = json.loads(_cli("inspect", "--json", env=env))["models"]["flip"]
    return flip["version"], set(flip["serving"].values())


def _given_up(answer: dict[str, Any]) -> bool:
    """A default the batcher decided on before the deadline (the code before its probe said
    "deadline passed while queued" for these too)."""
    reason = answer.get("default_reason") or ""
    return answer["default"] and ("given up before its deadline" in reason or "while queued" in reason)


class _Stalled:
    """True once the batcher sent fewer than 3 batches of flip over 2 s, while it gave up the
    requests that came meanwhile: the state the rollback must get the model out of."""

    def __init__(self, lines: list[str], load: Load, since: float) -> None:
        self.lines, self.load, self.since = lines, load, since
        self.samples: list[tuple[float, float]] = []

    def __call__(self) -> bool:
        url = next((line.split()[2] for line in self.lines if line.startswith("metrics: batchers-flip ")), None)
        if url is None:
            return False
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        sent = sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith('clipstream_batcher_batches_total{model="flip"'))
        now = time.monotonic()
        self.samples.append((now, sent))
        before = [n for t, n in self.samples if t <= now - 2.0]
        given_up = [r for r in self.load.answers_since(max(self.since, now - 2.0)) if _given_up(r)]
        return bool(before) and sent - before[-1] < 3 and len(given_up) >= 5


def _up_one_model_app(settings: Any, tmp_path: Path, app: str, slo_ms: float,
                      **extra_env: str) -> tuple[UpProcess, dict[str, str], int]:
    """`clipstream up` of one `single` app over model flip, version 1 (in tmp_path/models)."""
    (tmp_path / "app.yaml").write_text(yaml.safe_dump({
        "apps": [{"name": app, "policy": "single", "slo_ms": slo_ms, "default_output": -1, "models": ["flip"]}],
        "models": [{"name": "flip", "version": "1", "path": "models/flip/1", "replicas": 1}],
    }))
    port = pick_free_ports(1)[0]
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix, "PYTHONUNBUFFERED": "1",
           "CLIPSTREAM_STATE_DIR": str(tmp_path / "state"), "CLIPSTREAM_UP_SELECTORS": "1",
           "CLIPSTREAM_UP_WARM_UP_S": "3", **extra_env}
    return UpProcess(tmp_path / "app.yaml", port, env, ROOT), env, port


def _begin(up: UpProcess, load: Load) -> None:
    """Wait for `up`, then start the load and wait for version 1's first answers."""
    up.wait_ready(240)
    for t in load.threads:
        t.start()
    wait_until(lambda: len(load.outputs_since(0)) >= 20, 30, "answers from version 1")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_deploy_and_rollback_move_traffic_only_to_a_warm_version(settings: Any, tmp_path: Path) -> None:
    app = f"flip{uuid.uuid4().hex[:6]}"
    models = tmp_path / "models"
    for version, label in (("1", 1), ("2", 2)):
        make_python_model(models, "flip", ANSWERS.format(label=label, load_s=LOAD_S), labels=[0, 1, 2],
                          version=version)
    # a generous objective, so only a query stuck behind a loading model can miss it on a busy
    # machine: the old code made them wait for the whole load (seconds)
    slo_ms = 1000
    up, env, port = _up_one_model_app(settings, tmp_path, app, slo_ms)
    proc, lines = up.proc, up.lines
    load = Load(f"http://127.0.0.1:{port}", app)
    try:
        _begin(up, load)

        deployed = time.monotonic()
        _cli("deploy-model", "flip", str(models / "flip" / "2"), "--version", "2", env=env)
        # version 2 takes seconds to start, load and warm up: until then inspect says 1 serves
        assert _serving(env) == ("2", {"1"})
        wait_until(lambda: 2 in load.outputs_since(deployed), 90, "answers from version 2")
        assert _serving(env) == ("2", {"2"})
        wait_until(lambda: any("worker-flip-v1-0 stopped (its partition was handed over" in l for l in lines),
                   30, "version 1's worker to stop at the handover")

        rolled_back = time.monotonic()
        _cli("rollback", "flip", env=env)
        wait_until(lambda: 1 in load.outputs_since(rolled_back), 90, "answers from version 1 again")
        wait_until(lambda: any("worker-flip-v2-0 stopped (its partition was handed over" in l for l in lines),
                   30, "version 2's worker to stop at the handover")
        settled = time.monotonic()
        wait_until(lambda: len(load.outputs_since(settled)) >= 10, 30, "answers after the rollback")
    finally:
        load.halt()
        _stop(proc)

    # the ledger: every query answered by a model, none by the default at the cutoff
    ledger = [(sent, r["output"], r["default"], r["latency_ms"]) for sent, r in load.answers]
    defaults = [(round(sent - deployed, 2), lat) for sent, _, d, lat in ledger if d]
    late = [(round(sent - deployed, 2), round(sent - rolled_back, 2), lat) for sent, _, _, lat in ledger
            if lat >= 0.9 * slo_ms]
    print(f"ledger: {len(ledger)} answered, {len(defaults)} defaults, {len(late)} near the cutoff, "
          f"{len(load.errors)} errors; max latency {max(l for *_, l in ledger):.0f} ms")
    assert not load.errors, load.errors[:5]
    assert defaults == [] and late == [], (defaults, late, "\n".join(lines[-40:]))
    # the answers moved to version 2, and back to version 1, and stayed (two callers' queries
    # sent within a few ms of a switch may reach the batcher in either order)
    to_v2 = min(sent for sent, out, *_ in ledger if sent >= deployed and out == 2)
    to_v1 = min(sent for sent, out, *_ in ledger if sent >= rolled_back and out == 1)
    assert all(out == 1 for sent, out, *_ in ledger if sent < deployed)
    assert all(out == 2 for sent, out, *_ in ledger if to_v2 + 0.1 <= sent < rolled_back)
    assert all(out == 1 for sent, out, *_ in ledger if sent >= to_v1 + 0.1)


SLOW = '''
import time
import numpy as np


class Model:
    """Takes {sleep_s} s for every batch, then answers class {label}."""
    def __init__(self, path, config):
        pass
    def predict_batch(self, inputs):
        time.sleep({sleep_s})
        out = np.zeros((len(inputs), 3), np.float32)
        out[:, {label}] = 1.0
        return out
'''


def test_a_rollback_from_a_slow_version_is_answered_by_the_model_again(settings: Any, tmp_path: Path) -> None:
    """A version slower than the SLO makes the batcher give every request up as hopeless, so
    it sends none and learns nothing new of the replica's speed. After the rollback the fast
    version must be sent requests again, not be judged by the slow one's batches."""
    app = f"slow{uuid.uuid4().hex[:6]}"
    models = tmp_path / "models"
    for version, label, sleep_s in (("1", 1, 0), ("2", 2, 0.3)):
        make_python_model(models, "flip", SLOW.format(label=label, sleep_s=sleep_s), labels=[0, 1, 2], version=version)
    up, env, port = _up_one_model_app(settings, tmp_path, app, 100)
    load = Load(f"http://127.0.0.1:{port}", app)
    try:
        up.wait_ready(240)
        for t in load.threads:
            t.start()
        wait_until(lambda: 1 in load.outputs_since(0), 30, "answers from version 1")
        deployed = time.monotonic()
        _cli("deploy-model", "flip", str(models / "flip" / "2"), "--version", "2", env=env)
        # version 2 takes 300 ms a batch: once its reports fill the batcher's window, the batcher
        # gives every request up before its deadline and stops sending batches
        stalled = _Stalled(up.lines, load, deployed)
        wait_until(stalled, 90, "the batcher to give version 2's requests up and stop sending batches")
        rolled_back = time.monotonic()
        _cli("rollback", "flip", env=env)
        wait_until(lambda: 1 in load.outputs_since(rolled_back), 30, "answers from version 1 after the rollback")
        settled = time.monotonic()
        wait_until(lambda: len(load.outputs_since(settled)) >= 20, 30, "answers after the rollback")
    finally:
        load.halt()
        _stop(up.proc)
    assert not load.errors, load.errors[:5]
    assert set(load.outputs_since(settled)) == {1}, load.outputs_since(settled)


NO_LOAD = '''
class Model:
    """A version whose weights are missing: it never loads."""
    def __init__(self, path, config):
        raise RuntimeError("weights.bin is missing")
'''


def test_a_version_that_cannot_load_never_takes_the_batches_even_after_the_switch_timeout(
        settings: Any, tmp_path: Path) -> None:
    """Version 2's worker fails to load it, and says so to the batcher (a failure marker). The
    batcher's wait for version 2's ready markers times out after 5 s here, and still keeps the
    batches on version 1: every query after that is answered by version 1, none by a default."""
    app = f"noload{uuid.uuid4().hex[:6]}"
    models = tmp_path / "models"
    make_python_model(models, "flip", ANSWERS.format(label=1, load_s=0), labels=[0, 1, 2], version="1")
    make_python_model(models, "flip", NO_LOAD, labels=[0, 1, 2], version="2")
    up, env, port = _up_one_model_app(settings, tmp_path, app, 500, CLIPSTREAM_BATCHER_VERSION_SWITCH_TIMEOUT_S="5")
    load = Load(f"http://127.0.0.1:{port}", app)
    try:
        _begin(up, load)
        _cli("deploy-model", "flip", str(models / "flip" / "2"), "--version", "2", env=env)
        deployed = time.monotonic()
        log = next((tmp_path / "state" / "up").glob("gateway-*")) / "batchers-flip.log"
        wait_until(lambda: log.exists() and "could not load version 2; its batches stay on version 1"
                   in log.read_text(), 120, "the batcher to hear that version 2 did not load")
        wait_until(lambda: time.monotonic() > deployed + 15, 30, "the switch timeout to pass")
        late = time.monotonic()
        wait_until(lambda: len(load.answers_since(late)) >= 20, 30, "answers after the timeout")
        version, serving = _serving(env)
    finally:
        load.halt()
        _stop(up.proc)
    assert not load.errors, load.errors[:5]
    after = load.answers_since(late)
    assert [r for r in after if r["default"]] == [] and {r["output"] for r in after} == {1}, after[:3]
    assert (version, serving) == ("2", {"1"})


def test_a_batcher_begun_again_during_a_version_change_keeps_sending_to_the_version_that_serves(
        settings: Any, tmp_path: Path) -> None:
    """Deploying a model restarts the batcher process, which serves every model: one begun
    while flip's version 2 still loads must go on sending to version 1's warm worker, as the
    batcher before it did, not give flip's queries up until version 2 is ready."""
    app = f"flip{uuid.uuid4().hex[:6]}"
    models = tmp_path / "models"
    make_python_model(models, "flip", ANSWERS.format(label=1, load_s=0.5), labels=[0, 1, 2], version="1")
    make_python_model(models, "flip", ANSWERS.format(label=2, load_s=12.0), labels=[0, 1, 2], version="2")
    make_python_model(models, "other", ANSWERS.format(label=0, load_s=0.5), labels=[0, 1, 2], version="1")
    up, env, port = _up_one_model_app(settings, tmp_path, app, 1000)
    load = Load(f"http://127.0.0.1:{port}", app)
    try:
        _begin(up, load)
        deployed = time.monotonic()
        for name, version in (("flip", "2"), ("other", "1")):  # the second begins the batcher again
            _cli("deploy-model", name, str(models / name / version), "--version", version, env=env)
        wait_until(lambda: any(line.startswith("batchers-flip+other is ready") for line in up.lines), 60,
                   "the batcher process for both models")
        restarted = time.monotonic()
        wait_until(lambda: 2 in load.outputs_since(deployed), 120, "answers from version 2")
        switched = time.monotonic()
    finally:
        load.halt()
        _stop(up.proc)
    window = [r for sent, r in load.answers if restarted + 2.0 <= sent < switched - 0.5]
    given_up = [r["default_reason"] for r in window if _given_up(r)]
    print(f"ledger: {len(window)} answers between the batcher's start and version 2's, {len(given_up)} given up")
    assert len(window) >= 20, "the load did not run through the version change"
    assert given_up == [] and all(r["output"] == 1 for r in window), (given_up[:3], "\n".join(up.lines[-40:]))
