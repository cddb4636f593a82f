"""How a supervised stage's process ends: stopped on purpose (SIGTERM, then SIGKILL after a grace
period, its spare with it), or dead, with the reason its restart line gives."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from clipstream.spare import end_spare

if TYPE_CHECKING:
    from clipstream.supervise import Stage


def drop_spare(stage: Stage) -> None:
    spare, stage.spare_proc = stage.spare_proc, None
    if spare is not None:
        end_spare(spare)


def terminate(stages: list[Stage], grace_s: float = 10.0) -> None:
    for s in stages:
        drop_spare(s)
    live = [s for s in stages if s.proc is not None and s.proc.poll() is None]
    for s in live:
        send_signal(s, signal.SIGTERM)
        send_signal(s, signal.SIGCONT)  # a stopped stage acts on its SIGTERM
    deadline = time.monotonic() + grace_s
    for s in live:
        assert s.proc is not None
        try:
            s.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            send_signal(s, signal.SIGKILL)
            s.proc.wait(5)


def send_signal(stage: Stage, sig: signal.Signals) -> None:
    assert stage.proc is not None
    try:
        os.killpg(stage.proc.pid, sig)
    except ProcessLookupError:
        pass


def why_it_died(stage: Stage, code: int) -> str:
    """A restart line's reason: the hang, the signal, or the exit code with the stage's last
    ``error:`` line, which says what to do (a warning Python prints as it exits may follow it),
    else the last line it wrote (only this process's lines)."""
    if stage.hung:
        return stage.hung
    if code < 0:
        return f"exit code {code}, {_signame(-code)}"
    written = tail(stage.log_path, lines=20, start=stage.log_from).splitlines()
    errors = [line for line in written if line.startswith("error:")]
    last = (errors or written or [""])[-1].strip()
    if len(last) > 600:  # a traceback's repr, say: its start and its end, where what to do is said
        last = f"{last[:300]} ... {last[-300:]}"
    return f"exit code {code}" + (f": {last}" if last and code > 0 else "")


def _signame(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def tail(path: Path, lines: int = 15, start: int = 0) -> str:
    """The last ``lines`` lines of a log from byte ``start`` on: one process's, not earlier runs'."""
    try:
        with open(path, "rb") as log:
            log.seek(start)
            return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
