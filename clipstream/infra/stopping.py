"""Stopping the process groups the launcher started: SIGTERM, a grace period, then SIGKILL."""

from __future__ import annotations

import os
import signal
import time

from clipstream.errors import InfraError
from clipstream.infra import pid_alive


def _wait_dead(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group ``pid`` leads (spawn_detached made one), else just ``pid``."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def terminate(*pids: int, grace_s: float) -> None:
    """SIGTERM each group at once, wait up to ``grace_s``, then SIGKILL; reap stragglers.

    The nodes of a cluster stop together: one stopped after the others would find no
    controller quorum for its controlled shutdown and wait out the grace period.
    """
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for pid in pids:
        if not _wait_dead(pid, max(0.0, deadline - time.monotonic())):
            _signal_group(pid, signal.SIGKILL)
            if not _wait_dead(pid, 5.0):
                raise InfraError(f"process {pid} survived SIGKILL; check `ps -p {pid}`")
    for pid in pids:
        try:  # anything the leader left behind in its group
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
