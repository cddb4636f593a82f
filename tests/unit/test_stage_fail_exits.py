"""A stage that fails by itself exits even when its stop blocks: no supervisor would stop it,
and one that never beat is not judged hung."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUCK = """
import signal, time
import topics.stage as stage
stage.FAIL_EXIT_AFTER_S = 0.5
signal.signal(signal.SIGTERM, lambda *a: None)  # a stop that never completes
stage.fail("a client's close waits for ever")
time.sleep(60)
"""


def test_a_failed_stage_whose_stop_blocks_exits_with_the_fatal_status() -> None:
    from topics.stage import FATAL_EXIT

    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == FATAL_EXIT, done.stderr
    assert time.monotonic() - began < 20  # the watchdog, not the sleep, ended it
    assert "still stopping after 0.5 s, exiting now" in done.stderr
