"""Local Kafka and Redis for development and tests (``clipstream infra up|down|status|fetch``).

The public API is :func:`up`, :func:`down`, :func:`status` and :class:`InfraStatus` from
``clipstream.infra.launcher``, re-exported here lazily so that importing a helper below does not
pull in the launcher (and the launcher can import ``kafka`` and ``redis``, which import this).

The small process helpers live here because both ``kafka.py`` and ``redis.py`` need them and
neither should import the other.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from clipstream.errors import InfraError

__all__ = [
    "InfraStatus",
    "down",
    "file_lock",
    "pid_alive",
    "require_binary",
    "spawn_detached",
    "status",
    "up",
    "wait_ready",
]

# Popen objects of the processes this Python process started. Keeping them alive stops
# Popen.__del__ from warning "subprocess is still running", and lets pid_alive reap our own
# zombies (a child killed by down() stays a zombie, and "alive" to kill(0), until reaped).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    """What a failed tool said last (its stderr, else its stdout), for a one-line error."""
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"


def require_binary(name: str, install_hint: str) -> str:
    """Path of ``name`` on PATH, or an InfraError that tells the user how to install it."""
    path = shutil.which(name)
    if path is None:
        raise InfraError(f"`{name}` was not found on PATH; install it with: {install_hint}")
    return path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path``.

    Two test sessions fetching jars into one cache, or two ``up`` calls on one state dir, must
    not interleave: the second waits and then finds the work done.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# the pid of the ``up`` that started this stage: the stage ends with it (``die_with``)
PARENT_ENV = "CLIPSTREAM_STAGE_OF"


def die_with(parent: int) -> None:
    """Ask Linux to SIGTERM this process when ``parent``, which started it, ends, even by
    SIGKILL: a stage left behind would hold its port and answer every query with a default.
    Set here, after exec, so no Python runs between fork and exec in a threaded parent."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it ended before prctl took effect
        raise SystemExit(f"the clipstream up (pid {parent}) that started this stage has ended")


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A preexec hook asking Linux to SIGTERM the child when this process exits.

    For test sessions: a pytest run that is killed outright skips its teardown, and without
    this its broker and Redis would run on, orphaned. Nothing equivalent exists elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, not in the child
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


def spawn_detached(
    argv: Sequence[str], out_file: Path, cwd: Path | None = None, die_with_parent: bool = False
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session, stdout/stderr appended to ``out_file``.

    Its own session (and so its own process group, whose id is its pid) means a Ctrl-C in the
    terminal that ran ``clipstream infra up`` does not reach it, the process outlives the
    launcher, and ``down`` can signal the whole group. ``die_with_parent`` undoes the
    outliving, for callers (test fixtures) whose processes must not survive them; the
    calling thread must live as long as the process should (Linux ties it to the thread).
    """
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with open(out_file, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_die_with_parent_hook() if die_with_parent else None,
        )
    _CHILDREN[proc.pid] = proc
    return proc


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live process (zombies count as dead; ours are reaped here)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            _CHILDREN.pop(pid, None)
            return False
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    stat = _read_proc_stat(pid)
    return stat is None or stat[0] != "Z"


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), to tell a reused pid apart."""
    stat = _read_proc_stat(pid)
    return None if stat is None else stat[1]


def process_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped by a signal (SIGSTOP, a debugger): alive, serving nothing."""
    fields = proc_stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


def proc_stat_fields(pid: int, proc: Path = Path("/proc")) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name, from the state letter on (field 3
    of proc(5) is index 0); None where the process is gone or /proc is unavailable."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name is in parentheses and may itself contain spaces or ')'
    return raw[raw.rindex(")") + 2 :].split()


def _read_proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks); None where /proc is unavailable."""
    fields = proc_stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[19]))


def wait_ready(
    name: str,
    probe: Callable[[], bool],
    alive: Callable[[], bool],
    timeout_s: float,
    logs: Sequence[Path] = (),
) -> float:
    """Poll ``probe`` until it is true; return the seconds it took.

    Fails fast (InfraError) when the process dies instead of waiting out the deadline, and
    names the log files so the user knows where to look.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    where = " and ".join(str(p) for p in logs)
    see = f"; see {where}" if where else ""
    while True:
        if not alive():
            raise InfraError(f"{name} exited during startup{see}")
        if probe():
            return time.monotonic() - start
        if time.monotonic() > deadline:
            raise InfraError(f"{name} did not become ready within {timeout_s:.0f} s{see}")
        time.sleep(0.1)


def __getattr__(name: str) -> object:
    if name in ("InfraStatus", "up", "down", "status"):
        from clipstream.infra import launcher

        return getattr(launcher, name)
    raise AttributeError(name)
