"""Helpers the integration tests and the benchmarks share: stopping the stage processes they
start, and waiting on a condition with a deadline (never a bare sleep)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def stop_process(proc: subprocess.Popen, grace_s: float = 20.0) -> int | None:
    """SIGTERM, wait for a clean exit, SIGKILL if it does not come; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


class UpProcess:
    """`clipstream up -f APP_FILE --gateway-port PORT` as a subprocess, its output collected in
    ``lines`` and ``ready`` set at its ``ready:`` line (the tests that run the whole pipeline)."""

    def __init__(self, app_file: Path, port: int, env: Mapping[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "clipstream.cli", "up", "-f", str(app_file), "--gateway-port", str(port)],
            env=dict(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.ended = threading.Event()  # its output closed: it has stopped
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("ready: "):
                self.ready.set()
        self.ended.set()

    def wait_ready(self, timeout_s: float) -> None:
        """Fail with the last lines of ``up``'s output unless it is ready within ``timeout_s``;
        at once when ``up`` ends first (a stage that failed to start)."""
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.1):
            assert not self.ended.is_set() and time.monotonic() < deadline, "\n".join(self.lines[-30:])

    def stop(self, timeout_s: float = 90.0) -> int:
        """SIGTERM, as Ctrl-C would; ``up``'s exit code. One that does not stop in ``timeout_s``
        is killed and fails the test: stopping every stage cleanly is part of what is tested."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "the condition") -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.02)


def predict_admitted(client: Any, app: str, x: Any, timeout_s: float = 30.0, **kw: Any) -> dict[str, Any]:
    """``client.predict``, retried when the gateway refuses it with a quick 503 and says when
    to come back (Retry-After). On a machine the tests saturate, the gateway's admission
    control may refuse a request (a loop a few ms late, three wake-ups in a row): that is the
    documented answer to overload, not a failure of what the calling test checks."""
    from frontend.client import Overloaded

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.predict(app, x, **kw)
        except Overloaded as exc:
            pause = exc.retry_after or 1.0
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
