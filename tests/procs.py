"""Helpers the integration tests share for the stage processes they start."""

from __future__ import annotations

import subprocess


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
