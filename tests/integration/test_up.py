"""`clipstream up` end to end: ready means answered by the models, the registry is followed
live, the REST contract holds on the real pipeline, and SIGTERM stops every stage."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import httpx
import redis
import yaml

from clipstream.infra.launcher import pick_free_ports
from clipstream.spare import SPARE_ENV
from clipstream.testing.models import digits, digits_logreg, make_onnx_digits_model, make_python_model
from clipstream.testing.procs import UpProcess, predict_admitted, wait_until
from frontend.client import Client, GatewayInputError, NotFound
from topics.stage import read_heartbeat

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

SEVENS = '''
import numpy as np


class Model:
    """Always answers 7, with certainty."""
    def __init__(self, path, config):
        pass
    def predict_batch(self, inputs):
        out = np.zeros((len(inputs), 10), np.float32)
        out[:, 7] = 1.0
        return out
'''


def _ours(prefix: str, spares: bool = False) -> list[int]:
    """Pids of processes started with our topic prefix in their environment; with ``spares``,
    the stages' spares too (started with ``SPARE_ENV``: no stage dies in these tests, so each is
    still waiting)."""
    found = []
    needle = f"CLIPSTREAM_TOPIC_PREFIX={prefix}".encode()
    spare = f"{SPARE_ENV}=1".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env and (spares or spare not in env):
            found.append(int(pid))
    return found



def _cli(*args: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "clipstream.cli", *args], env=env, check=True, cwd=ROOT,
                   capture_output=True, timeout=120)


@pytest.mark.parametrize("batchers", ["shared", "per-model"])
def test_up_serves_follows_the_registry_and_stops_cleanly(settings, tmp_path, batchers):
    app = f"digits{uuid.uuid4().hex[:6]}"
    models = tmp_path / "models"
    make_onnx_digits_model(models, "logreg")
    (tmp_path / "app.yaml").write_text(yaml.safe_dump({
        "apps": [{"name": app, "policy": "exp4", "slo_ms": 3000, "default_output": -1, "models": ["logreg"]}],
        "models": [{"name": "logreg", "version": "1", "path": "models/logreg/1", "replicas": 1}],
    }))
    port, grpc_port, other_port = pick_free_ports(3)
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix, "CLIPSTREAM_STATE_DIR": str(tmp_path / "state"),
           "PYTHONUNBUFFERED": "1", "CLIPSTREAM_UP_BATCHERS": batchers, "CLIPSTREAM_GATEWAY_GRPC_PORT": str(grpc_port)}
    up = UpProcess(tmp_path / "app.yaml", port, env, ROOT)
    lines = up.lines
    client = Client(f"http://127.0.0.1:{port}", app=app)
    try:
        up.wait_ready(240)
        assert f"ready: http://127.0.0.1:{port}" in lines

        # a second up on the prefix stops before it touches the registry or fences a stage
        second = subprocess.run([sys.executable, "-m", "clipstream.cli", "up", "-f", str(tmp_path / "app.yaml"),
                                 "--gateway-port", str(other_port)], capture_output=True, text=True, timeout=120,
                                env={k: v for k, v in env.items() if k != "CLIPSTREAM_GATEWAY_GRPC_PORT"})
        assert second.returncode == 1 and "another clipstream up (pid " in second.stderr, second.stderr
        assert f"gateway http://127.0.0.1:{port}) serves topic prefix" in second.stderr, second.stderr
        assert "applying" not in second.stdout and not [line for line in lines if "restarting" in line]

        # the first query after the ready line is answered by the model, not the default
        x, _ = digits()
        want = int(digits_logreg().predict(x[1600:1601])[0])
        r = predict_admitted(client, app, x[1600].tolist())
        assert r["default"] is False and r["models"] == {"answered": ["logreg"], "missing": []}
        assert r["output"] == want and 0 < r["confidence"] <= 1 and len(r["scores"]) == 10
        assert r["latency_ms"] > 0 and r["query_id"]

        # Triton's client, over the Open Inference Protocol: a batch of four images in one call
        import tritonclient.http as triton

        v2 = triton.InferenceServerClient(f"127.0.0.1:{port}")
        images = triton.InferInput("input", [4, 64], "FP32")
        images.set_data_from_numpy(x[1602:1606])
        labels = v2.infer(app, [images]).as_numpy("output")
        assert labels.tolist() == digits_logreg().predict(x[1602:1606]).tolist()
        # a table of one input per pixel, as MLServer's pandas codec sends it, and as Triton's
        # client sends several inputs (raw bytes after the JSON)
        table = {"parameters": {"content_type": "pd"},
                 "inputs": [{"name": f"px{j}", "shape": [2], "datatype": "FP64", "data": x[1620:1622, j].tolist()}
                            for j in range(64)]}
        got = httpx.post(f"http://127.0.0.1:{port}/v2/models/{app}/infer", json=table, timeout=30)
        assert got.status_code == 200, got.text
        assert got.json()["outputs"][0]["data"] == digits_logreg().predict(x[1620:1622]).tolist()
        pixels = [triton.InferInput(f"px{j}", [2, 1], "FP32") for j in range(64)]
        for j, column in enumerate(pixels):
            column.set_data_from_numpy(x[1622:1624, j:j + 1])
        labels = v2.infer(app, pixels).as_numpy("output")
        assert labels.tolist() == digits_logreg().predict(x[1622:1624]).tolist()
        # and over gRPC, on the port up says
        import tritonclient.grpc as triton_grpc

        assert f"grpc: 127.0.0.1:{grpc_port} (the Open Inference Protocol)" in lines
        with triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}") as rpc:
            images = triton_grpc.InferInput("input", [4, 64], "FP32")
            images.set_data_from_numpy(x[1606:1610])
            labels = rpc.infer(app, [images]).as_numpy("output")
            streamed: queue.Queue[Any] = queue.Queue()  # and on a stream, each answer matched by id
            rpc.start_stream(callback=lambda result, error: streamed.put(error or result))
            for i in range(1610, 1614):
                one = triton_grpc.InferInput("input", [1, 64], "FP32")
                one.set_data_from_numpy(x[i:i + 1])
                rpc.async_stream_infer(app, [one], request_id=str(i))
            answers = [streamed.get(timeout=30) for _ in range(4)]
            rpc.stop_stream()
        assert labels.tolist() == digits_logreg().predict(x[1606:1610]).tolist()
        assert not [a for a in answers if isinstance(a, Exception)], answers
        by_id = {int(a.get_response().id): a.as_numpy("output").tolist() for a in answers}
        assert by_id == {i: digits_logreg().predict(x[i:i + 1]).tolist() for i in range(1610, 1614)}

        # every stage beats from each of its working loops, so `up` can tell a hung one
        state = tmp_path / "state" / "up" / f"gateway-{port}"
        batcher = "batchers-logreg" if batchers == "shared" else "batcher-logreg"
        loops = {"gateway": {"gateway"}, "selector-1": {"join", "learn"}, "selector-2": {"join", "learn"},
                 batcher: {"batcher"},
                 "worker-logreg-v1-0": {"consume"}}
        wait_until(lambda: all(set(read_heartbeat(state / f"{name}.heartbeat") or ()) == want
                               for name, want in loops.items()), 30, "a heartbeat from every stage loop")

        # the REST contract's errors, on the real pipeline
        with pytest.raises(NotFound):
            client.predict("no-such-app", x[0].tolist())
        with pytest.raises(GatewayInputError, match="64"):
            client.predict(app, [1.0, 2.0])
        client.feedback(r["query_id"], want)

        # readiness is the workers' word: the app's replica said it has its model loaded; a model
        # whose worker cannot load it is not ready, saying why
        ready = httpx.get(f"http://127.0.0.1:{port}/v2/models/{app}/ready", timeout=10)
        assert ready.status_code == 200 and ready.json() == {"name": app, "ready": True}, ready.text
        if batchers == "shared":
            broken = make_python_model(models, "broken", BROKEN, labels=list(range(10)))
            _cli("deploy-model", "broken", str(broken), env=env)
            _cli("register-app", "brokenapp", "--policy", "single", "--slo-ms", "500", env=env)
            _cli("link", "brokenapp", "broken", env=env)

            def said_not_loaded() -> dict[str, Any] | None:
                r = httpx.get(f"http://127.0.0.1:{port}/v2/models/brokenapp/ready", timeout=10)
                return r.json() if r.status_code == 503 and "did not load" in r.text else None

            why = wait_until(said_not_loaded, 120, "the broken model's readiness to say why")["reason"]
            assert why.startswith("model broken version 1 replica 0 did not load: ") and "weights.bin" in why, why
            asked = httpx.post(f"http://127.0.0.1:{port}/v1/apps/brokenapp/predict", json={"input": x[5].tolist()},
                               timeout=10).json()  # its callers' defaults say why too
            assert asked["default"] and asked["default_reason"].endswith(why), asked
            shown = subprocess.run([sys.executable, "-m", "clipstream.cli", "inspect"], env=env, cwd=ROOT,
                                   capture_output=True, text=True, timeout=120).stdout
            lines_of = {line.split(":")[0]: line for line in shown.splitlines()}
            assert "NOT LOADED: model broken version 1 replica 0 did not load" in lines_of["model broken"], shown
            assert "NOT LOADED" not in lines_of["model logreg"], shown  # its replica has it loaded
            assert re.search(r" device=(cpu|cuda)\b", lines_of["model logreg"]), shown  # and says where
            # a deploy that waits for its version is told it failed, and why
            broken = make_python_model(models, "broken", BROKEN, labels=list(range(10)), version="2")
            failed = subprocess.run([sys.executable, "-m", "clipstream.cli", "deploy-model", "broken", str(broken),
                                     "--wait", "120"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
            assert failed.returncode == 1 and "model broken version 2 deployed" in failed.stdout, failed
            assert "error: model broken version 2: replica 0 did not load it: " in failed.stderr, failed.stderr
            assert "weights.bin" in failed.stderr and "clipstream rollback broken" in failed.stderr, failed.stderr
            _cli("remove-app", "brokenapp", env=env)
            _cli("remove-model", "broken", env=env)

        # a model deployed and linked to the running app is asked without restarting anything
        sevens = make_python_model(models, "sevens", SEVENS, labels=list(range(10)))
        deployed = subprocess.run([sys.executable, "-m", "clipstream.cli", "deploy-model", "sevens", str(sevens),
                                   "--wait", "180"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
        assert deployed.returncode == 0 and "model sevens version 1: loaded on 1 of 1 replicas" in deployed.stdout, \
            deployed
        _cli("link", app, "sevens", env=env)

        def answered_by_sevens() -> dict[str, Any] | None:
            got = predict_admitted(client, app, (x[1601] + np.float32(time.monotonic() % 1)).tolist())
            return got if "sevens" in got["models"]["answered"] else None

        try:
            both = wait_until(answered_by_sevens, 180, "the linked model to answer")
        except Exception as exc:
            raise AssertionError("\n".join(lines[-40:])) from exc
        assert sorted(both["models"]["answered"]) == ["logreg", "sevens"]
        assert "started worker-sevens-v1-0 (registry change)" in lines
        if batchers == "shared":  # one batcher for both, the first one stopped once it was ready
            assert "started batchers-logreg+sevens (registry change)" in lines
            wait_until(lambda: len(_ours(settings.topic_prefix)) == 7, 30,
                       "up, gateway, 2 selectors, 1 batcher and 2 workers")
            # a spare for each of the six stages (the old batcher's went with it)
            wait_until(lambda: len(_ours(settings.topic_prefix, spares=True)) == 7 + 6, 60,
                       "a spare for each stage")
            # the new batcher serves logreg too
            again = predict_admitted(client, app, (x[1602] + np.float32(time.monotonic() % 1)).tolist())
            assert sorted(again["models"]["answered"]) == ["logreg", "sevens"]
        else:
            assert "started batcher-sevens (registry change)" in lines
            assert len(_ours(settings.topic_prefix)) >= 8  # up, gateway, 2 selectors, 2 batchers, 2 workers

        # a linked model is removed only with --unlink; then its worker stops, the app is answered
        # by the model left, and the removed model's cached predictions are gone
        cache = redis.Redis.from_url(settings.redis_url)
        assert list(cache.scan_iter(match="cs:cache:sevens:*"))
        refused = subprocess.run([sys.executable, "-m", "clipstream.cli", "remove-model", "sevens"], env=env,
                                 cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 1 and f"model sevens is linked to {app}" in refused.stderr, refused.stderr
        _cli("remove-model", "sevens", "--unlink", env=env)
        assert not list(cache.scan_iter(match="cs:cache:sevens:*"))
        wait_until(lambda: "stopped worker-sevens-v1-0 (registry change)" in lines, 60, "the removed model's worker to stop")
        assert not cache.hgetall(f"cs:loaded:{settings.topic_prefix}sevens")  # it took its word back
        assert cache.hgetall(f"cs:loaded:{settings.topic_prefix}logreg")

        def answered_by_logreg_alone() -> dict[str, Any] | None:
            got = predict_admitted(client, app, (x[1603] + np.float32(time.monotonic() % 1)).tolist())
            return got if got["models"] == {"answered": ["logreg"], "missing": []} else None

        wait_until(answered_by_logreg_alone, 60, "the app to be answered by logreg alone")
        if batchers == "per-model":
            assert "stopped batcher-sevens (registry change)" in lines

        # the app removed: its queries get 404 and its learnt weights go; its model stays
        cache.set(f"cs:state:{app}:__global__", b'{"policy": "exp4", "models": ["logreg"], "log_w": [0.0]}')
        _cli("remove-app", app, env=env)
        assert cache.get(f"cs:state:{app}:__global__") is None

        def refused_as_unknown() -> bool:
            try:
                client.predict(input=x[1604].tolist())
            except NotFound:
                return True
            return False

        wait_until(refused_as_unknown, 30, "the removed app's queries to get 404")
    finally:
        client.close() if hasattr(client, "close") else None
        code = up.stop(90)
    assert code == 0, "\n".join(lines[-30:])
    assert "stopped" in lines
    wait_until(lambda: not _ours(settings.topic_prefix, spares=True), 30, "every stage and spare to exit")
    # a Prometheus following the targets file drops the stopped stages rather than scrape dead ports
    targets = tmp_path / "state" / "up" / f"gateway-{port}" / "prometheus-targets.json"
    assert json.loads(targets.read_text()) == []


BROKEN = '''
class Model:
    """Its weights are missing: it never loads."""
    def __init__(self, path, config):
        open(f"{path}/weights.bin", "rb")
    def predict_batch(self, inputs):
        return inputs
'''

SLOW_TO_LOAD = '''
import time
import numpy as np


class Model:
    """Takes a minute to load, so `up` is still starting when it is stopped."""
    def __init__(self, path, config):
        time.sleep(60)
    def predict_batch(self, inputs):
        return np.zeros((len(inputs), 2), np.float32)
'''


def _one_model_app(settings: Any, tmp_path: Path, model: str, code: str) -> dict[str, str]:
    """``tmp_path/app.yaml``: a `single` app over one python model of ``code``; ``up``'s env."""
    make_python_model(tmp_path / "models", model, code, labels=[0, 1], shape=(2,))
    (tmp_path / "app.yaml").write_text(yaml.safe_dump({
        "apps": [{"name": f"{model}app", "policy": "single", "slo_ms": 100, "default_output": -1, "models": [model]}],
        "models": [{"name": model, "version": "1", "path": f"models/{model}/1", "replicas": 1}],
    }))
    return {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix, "CLIPSTREAM_STATE_DIR": str(tmp_path / "state"),
            "PYTHONUNBUFFERED": "1"}


def _starting(settings: Any, tmp_path: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """`up` of a model that takes a minute to load, once its five stages have started; its
    output so far."""
    env = _one_model_app(settings, tmp_path, "slow", SLOW_TO_LOAD)
    proc = subprocess.Popen(
        [sys.executable, "-m", "clipstream.cli", "up", "-f", str(tmp_path / "app.yaml"),
         "--gateway-port", str(pick_free_ports(1)[0])],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("starting "):
            break
    wait_until(lambda: len(_ours(settings.topic_prefix)) >= 6, 60, "up and its five stages to start")
    return proc, seen


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP: the terminal that ran it closed
def test_sigterm_while_starting_stops_every_stage_even_with_its_output_gone(settings, tmp_path, sig):
    """The reader of `up`'s output (a terminal, a benchmark) may be gone when it is stopped."""
    proc, seen = _starting(settings, tmp_path)
    assert proc.stdout is not None
    proc.stdout.close()  # nobody reads `up` any more
    proc.send_signal(sig)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    # stopped while starting: `up`'s code for an interrupted start (130), not a crash (1) on the closed pipe
    assert proc.returncode == 130, "\n".join(seen)
    wait_until(lambda: not _ours(settings.topic_prefix, spares=True), 30, "every stage and spare to exit")


def test_an_up_killed_outright_takes_its_stages_with_it(settings, tmp_path):
    """SIGKILL gives `up` no chance to stop its stages: each ends by itself (Linux tells it
    its parent is gone), rather than holding the gateway's port and answering defaults."""
    proc, _ = _starting(settings, tmp_path)
    stages = [pid for pid in _ours(settings.topic_prefix, spares=True) if pid != proc.pid]
    assert len(stages) >= 5, stages
    proc.kill()
    proc.wait(30)
    wait_until(lambda: not _ours(settings.topic_prefix, spares=True), 60, "every stage of the killed up to exit")


BROKEN = '''
class Model:
    """Fails to load, as a model with missing weights would."""
    def __init__(self, path, config):
        raise RuntimeError("weights.bin is missing")
'''


def test_a_start_whose_model_does_not_load_names_the_app_file_as_the_way_out(settings, tmp_path):
    """`up` stops what it started when a stage fails to start, so the registry verbs cannot help
    then: the file, applied at every start, is where the fix goes, and the error says so."""
    env = {**_one_model_app(settings, tmp_path, "broken", BROKEN), "CLIPSTREAM_UP_SPARES": "false"}
    done = subprocess.run([sys.executable, "-m", "clipstream.cli", "up", "-f", str(tmp_path / "app.yaml"),
                           "--gateway-port", str(pick_free_ports(1)[0])],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "stage worker-broken-v1-0 exited with code 1 before it was ready" in done.stderr
    assert "weights.bin is missing" in done.stderr  # the worker's own reason, quoted
    assert (f"{tmp_path / 'app.yaml'} is applied at every start: fix the model's `path:` or `version:` there, "
            "or take the model out of it, then run up again") in done.stderr, done.stderr[-2000:]
    wait_until(lambda: not _ours(settings.topic_prefix, spares=True), 30, "every stage to exit")
