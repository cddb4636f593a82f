"""Process supervision for `clipstream up`: start stages, wait for their `ready:` line, restart.

Each stage prints exactly one line starting with ``ready:`` when it can serve (models loaded,
partitions assigned). Waiting on that line, not on a sleep, is what lets ``up`` promise that
the first query after its own ready line is answered by the models.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clipstream.errors import ClipstreamError

Report = Callable[[str], None]


@dataclass
class Stage:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    restarts: int = 0
    failed: bool = False
    next_start: float = 0.0
    started_at: float = 0.0
    ready_line: str = ""


class Supervisor:
    """Starts stages as subprocesses, tees their output to logs and restarts the ones that die."""

    def __init__(self, log_dir: Path, report: Report = print, max_restarts: int = 5):
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.report = report
        self.max_restarts = max_restarts
        self.stages: dict[str, Stage] = {}
        self._lock = threading.Lock()
        self._stopping = False

    def add(self, name: str, argv: list[str], env: dict[str, str]) -> Stage:
        stage = Stage(name, argv, env, self.log_dir / f"{name}.log")
        with self._lock:
            self.stages[name] = stage
        self._spawn(stage)
        return stage

    def _spawn(self, stage: Stage) -> None:
        stage.ready.clear()
        stage.started_at = time.monotonic()
        stage.proc = subprocess.Popen(
            stage.argv,
            env=stage.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        threading.Thread(target=self._tee, args=(stage, stage.proc), daemon=True).start()

    def _tee(self, stage: Stage, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        with open(stage.log_path, "ab") as log:
            for raw in proc.stdout:
                log.write(raw)
                log.flush()
                if raw.startswith(b"ready:") and not stage.ready.is_set():
                    stage.ready_line = raw.decode(errors="replace").strip()
                    stage.ready.set()

    def wait_ready(self, timeout_s: float, names: list[str] | None = None) -> None:
        """Block until the named stages (default all) are ready; a stage that exits is an error."""
        deadline = time.monotonic() + timeout_s
        names = names if names is not None else list(self.stages)
        pending = set(names)
        while pending:
            for name in list(pending):
                stage = self.stages[name]
                if stage.ready.is_set():
                    pending.discard(name)
                elif stage.proc is not None and stage.proc.poll() is not None:
                    raise ClipstreamError(
                        f"stage {name} exited with code {stage.proc.returncode} before it was ready; "
                        f"see {stage.log_path}:\n{tail(stage.log_path)}"
                    )
            if pending and time.monotonic() > deadline:
                raise ClipstreamError(
                    f"stages not ready after {timeout_s:.0f}s: {sorted(pending)}; logs in {self.log_dir}"
                )
            time.sleep(0.05)

    def check(self) -> None:
        """Restart stages that died (reported, with their exit code), with a growing pause.

        A stage that keeps dying is given up on and reported; the others keep serving (a
        broken model must not take the whole pipeline down with it).
        """
        if self._stopping:
            return
        now = time.monotonic()
        for stage in list(self.stages.values()):
            if stage.failed or stage.proc is None or stage.proc.poll() is None:
                continue
            code = stage.proc.returncode
            if stage.restarts >= self.max_restarts:
                stage.failed = True
                self.report(
                    f"stage {stage.name} died {stage.restarts + 1} times (last exit {code}); "
                    f"giving up on it, see {stage.log_path}:\n{tail(stage.log_path, 5)}"
                )
                continue
            if stage.next_start == 0.0:
                stage.next_start = now + min(10.0, 0.5 * 2**stage.restarts)
            if now < stage.next_start:
                continue
            stage.restarts += 1
            stage.next_start = 0.0
            self.report(f"stage {stage.name} exited with code {code}; restarting ({stage.restarts})")
            self._spawn(stage)

    def remove(self, name: str) -> None:
        with self._lock:
            stage = self.stages.pop(name, None)
        if stage is not None:
            _terminate([stage])

    def stop_all(self) -> None:
        self._stopping = True
        _terminate(list(self.stages.values()))


def _terminate(stages: list[Stage], grace_s: float = 10.0) -> None:
    live = [s for s in stages if s.proc is not None and s.proc.poll() is None]
    for s in live:
        _signal(s, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for s in live:
        assert s.proc is not None
        try:
            s.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(s, signal.SIGKILL)
            s.proc.wait(5)


def _signal(stage: Stage, sig: signal.Signals) -> None:
    assert stage.proc is not None
    try:
        os.killpg(stage.proc.pid, sig)
    except ProcessLookupError:
        pass


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
