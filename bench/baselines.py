"""The in-process servers ``bench.cost`` measures clipstream against: MLServer and Ray Serve.

Each is installed by the benchmark into a virtualenv of its own under ``~/.cache/clipstream``
(never a project dependency), serves ``bench.accel_model`` with its own adaptive batching (32
items or 2 ms, as configured the same way in both), and takes the V2 inference body of
``bench.cost.v2_bodies``. Each runs in a session of its own, so every process it starts
(MLServer's workers, Ray's raylet, controller, proxy and replica) is counted in its CPU and
stopped with it, even those that put themselves in a process group of their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, say
from clipstream.infra import proc_stat_fields

ACCEL_MODEL = Path(__file__).parent / "accel_model.py"
MAX_BATCH, MAX_WAIT_S = 32, 0.002
MLSERVER_VERSION = "1.7.1"
RAYSERVE_VERSION = "2.60.0"
CACHE = Path.home() / ".cache" / "clipstream"

MLSERVER_RUNTIME = '''
import asyncio

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from accel_model import Model


class AccelRuntime(MLModel):
    """bench.accel_model behind MLServer: the blocking device call runs off the event loop."""

    async def load(self) -> bool:
        self.model = Model()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        y = await asyncio.to_thread(self.model.predict_batch, x)
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("scores", y)])
'''

RAYSERVE_APP = f'''
import asyncio
import os
import sys
import time

import numpy as np
import ray
from ray import serve
from starlette.requests import Request

from accel_model import Model


@serve.deployment(max_ongoing_requests=256)
class Accel:
    """bench.accel_model behind Ray Serve: one replica, batched by serve.batch."""

    def __init__(self) -> None:
        self.model = Model()

    @serve.batch(max_batch_size={MAX_BATCH}, batch_wait_timeout_s={MAX_WAIT_S})
    async def predict(self, rows: list[np.ndarray]) -> list[list[float]]:
        y = await asyncio.to_thread(self.model.predict_batch, np.stack(rows))
        return [r.tolist() for r in y]

    async def __call__(self, request: Request) -> dict:
        first = (await request.json())["inputs"][0]
        x = np.asarray(first["data"], dtype=np.float32).reshape(-1)
        return {{"outputs": [{{"name": "scores", "datatype": "FP32", "data": await self.predict(x)}}]}}


if __name__ == "__main__":
    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={{"host": "127.0.0.1", "port": int(sys.argv[1])}})
    serve.run(Accel.bind(), name="accel", route_prefix="/accel")
    print("ready", flush=True)
    while True:
        time.sleep(3600)
'''


def venv(name: str, version: str, requirement: str, exe: str) -> Path:
    """``exe`` of a virtualenv holding ``requirement``, installed once (pip, from PyPI)."""
    root = CACHE / f"{name}-{version}"
    path = root / "bin" / exe
    if path.exists():
        return path
    say(f"cost: installing {requirement} into {root} (once; a few minutes)")
    root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    subprocess.run([str(root / "bin" / "pip"), "install", "-q", requirement], check=True)
    return path


def session_pids(sid: int, proc: Path = Path("/proc")) -> list[int]:
    """Every process of session ``sid`` (field 6 of /proc/<pid>/stat)."""
    pids = [int(entry.name) for entry in proc.iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if (fields := proc_stat_fields(pid, proc)) is not None and int(fields[3]) == sid]


class Server:
    """A server started in a session of its own from ``root``; a context manager that stops
    every process of that session on exit."""

    name = ""
    route = ""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def __enter__(self) -> Server:
        command = self.command()
        log = open(self.root / f"{self.name}.log", "wb")
        self.proc = subprocess.Popen(command, cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        import httpx

        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                                       "data": [1, 2, 3, 4]}]})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {(self.root / f'{self.name}.log').read_text()[-2000:]}")
            try:
                if httpx.post(self.url + self.route, content=body, timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"{self.name} did not answer in 180 s; its log is {self.root / f'{self.name}.log'}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def processes(self) -> dict[int, str]:
        return {pid: self.name for pid in session_pids(self.proc.pid)} if self.proc is not None else {}

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        members = session_pids(self.proc.pid)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        for pid in set(members) | set(session_pids(self.proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


class MLServer(Server):
    """``mlserver start`` on a folder with the runtime and the model class."""

    name = "mlserver"
    route = "/v2/models/accel/infer"

    def command(self) -> list[str]:
        exe = venv("mlserver", MLSERVER_VERSION, f"mlserver=={MLSERVER_VERSION}", "mlserver")
        model = self.root / "accel"
        model.mkdir(parents=True, exist_ok=True)
        (model / "accel_model.py").write_text(ACCEL_MODEL.read_text())
        (model / "runtime.py").write_text(MLSERVER_RUNTIME)
        (model / "model-settings.json").write_text(json.dumps({
            "name": "accel", "implementation": "runtime.AccelRuntime", "max_batch_size": MAX_BATCH,
            "max_batch_time": MAX_WAIT_S}))
        # inference in the server process itself (no worker pool and its IPC), metrics off: its
        # cheapest setting on a small machine
        (self.root / "settings.json").write_text(json.dumps({
            "http_port": self.port, "grpc_port": free_port(), "metrics_port": free_port(),
            "parallel_workers": 0, "metrics_endpoint": None, "debug": False}))
        return [str(exe), "start", str(self.root)]


class RayServe(Server):
    """A Ray Serve application of one replica on a local Ray instance, batched by
    ``serve.batch``; the HTTP proxy takes the V2 body at ``/accel``."""

    name = "rayserve"
    route = "/accel"

    def command(self) -> list[str]:
        python = venv("rayserve", RAYSERVE_VERSION, f"ray[serve]=={RAYSERVE_VERSION}", "python")
        (self.root / "accel_model.py").write_text(ACCEL_MODEL.read_text())
        (self.root / "serve_accel.py").write_text(RAYSERVE_APP)
        return [str(python), "serve_accel.py", str(self.port)]


SETTINGS: dict[str, dict[str, Any]] = {
    "mlserver": {"version": MLSERVER_VERSION, "max_batch_size": MAX_BATCH, "max_batch_time_s": MAX_WAIT_S,
                 "parallel_workers": 0},
    "rayserve": {"version": RAYSERVE_VERSION, "max_batch_size": MAX_BATCH, "batch_wait_timeout_s": MAX_WAIT_S,
                 "replicas": 1, "ingress": "Ray Serve's HTTP proxy"},
}
