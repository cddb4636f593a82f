"""A stage started with no Kafka says so in a few lines, within seconds.

librdkafka retries a refused connection many times a second and wrote a line each time to
stderr: a stage with nothing at CLIPSTREAM_KAFKA_BOOTSTRAP printed hundreds of lines and gave up
after half a minute. Its lines now go through ``topics.kafkalog`` (repeats folded) and
``topics.admin`` gives up once librdkafka finds every broker down (``UNREACHABLE_S``). Here each
stage runs as a process against a port where nothing listens (Redis too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clipstream.infra.ports import pick_free_ports

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# (argv, exit status): the gateway's 3 is its "could not start"; the others exit 1
STAGES = {
    "gateway": (["gateway", "--port", "0"], 3),
    "selector": (["selector"], 1),
    "batcher": (["batcher", "--model", "x"], 1),
    "worker": (["worker", "--model", "x", "--version", "1", "--replica", "0", "--replicas", "1"], 1),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_stage_with_no_kafka_says_so_in_a_few_lines(stage: str, tmp_path: Path) -> None:
    argv, status = STAGES[stage]
    kafka_port, redis_port = pick_free_ports(2)  # free: nothing listens, a connection is refused
    env = {**os.environ, "CLIPSTREAM_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}",
           "CLIPSTREAM_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
           "CLIPSTREAM_STATE_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("CLIPSTREAM_HEARTBEAT_FILE", None)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "clipstream.cli", *argv], cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    lines = done.stderr.splitlines()
    assert done.returncode == status, done.stderr[-3000:]
    assert len(lines) < 40, f"{len(lines)} lines on stderr:\n" + "\n".join(lines[:10])
    assert "ready:" not in done.stdout
    said = [line for line in lines if "CLIPSTREAM_KAFKA_BOOTSTRAP" in line]
    assert said and f"127.0.0.1:{kafka_port}" in said[-1] and "`clipstream infra status`" in said[-1], lines
    assert said[-1].startswith("error: "), lines  # every stage says it the same way
    assert took < 20.0, f"gave up after {took:.1f}s"  # a start with no broker at all is not waited out
