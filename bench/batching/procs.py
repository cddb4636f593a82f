"""The benchmark's processes: the load generator (its own process, spawned once; jobs over a
pipe) and the clipstream CLI children (batcher, worker)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.batching.helpers import ROOT, arrivals_due, log
from clipstream.testing.procs import stop_process


def _loadgen_main(conn: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    import numpy as np
    from confluent_kafka import Producer

    from clipstream.settings import Settings
    from schemas import ModelRequest, Tensor, encode
    from clipstream.testing.models import digits
    from topics.client import producer_config

    base = digits()[0]
    producers: dict[str, Any] = {}
    conn.send({"ready": os.getpid()})
    while True:
        job = conn.recv()
        if job is None:
            break
        if job["bootstrap"] not in producers:
            producers[job["bootstrap"]] = Producer(producer_config(Settings(kafka_bootstrap=job["bootstrap"])))
        producer = producers[job["bootstrap"]]
        pool = job.get("pool") or 0
        n_parts, objective_us = job["partitions"], job["objective_us"]
        topic, model, prefix = job["topic"], job["model"], job["qid_prefix"]
        start, duration = job["start"], job["duration_s"]
        rate, period, duty = job["rate_qps"], job.get("period_s", 0.0), job.get("duty", 1.0)
        ramp = job.get("ramp_s", 0.0)
        sent = 0
        while time.time() < start:
            time.sleep(0.001)
        while True:
            now = time.time()
            t = now - start
            if t >= duration:
                break
            due = arrivals_due(t, rate, period, duty, ramp)
            while sent < due:
                i = sent if not pool else sent % pool
                x = base[i % len(base)].copy()
                x[0] = float(i)  # unique input per request (pool: the same inputs again)
                now_us = time.time_ns() // 1000
                record = ModelRequest(query_id=f"{prefix}{sent}", app="bench", model=model,
                                      input=Tensor.of(np.asarray(x, np.float32)), deadline_us=now_us + objective_us,
                                      selector_partition=sent % n_parts, trace={"produced": now_us})
                while True:
                    try:
                        producer.produce(topic, encode(record))
                        break
                    except BufferError:
                        producer.poll(0.01)
                sent += 1
                if sent % 64 == 0:
                    producer.poll(0)
            producer.poll(0)
            time.sleep(0.0005)
        producer.flush(10)
        conn.send({"sent": sent, "elapsed_s": time.time() - start})


class LoadGen:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_loadgen_main, args=(child,), daemon=True)
        self.proc.start()
        self.pid = self.conn.recv()["ready"]

    def start(self, **job: Any) -> None:
        self.conn.send(job)

    def result(self, timeout_s: float = 60) -> dict[str, Any]:
        if not self.conn.poll(timeout_s):
            raise RuntimeError("load generator did not finish")
        return self.conn.recv()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


CHILDREN: list["Child"] = []


class Child:
    """A clipstream CLI subprocess: stdout lines timestamped by a reader thread, stderr to a log."""

    def __init__(self, name: str, args: Sequence[str], env: Mapping[str, str], log_dir: Path,
                 wrap: Sequence[str] = ()) -> None:
        from clipstream.infra import _die_with_parent_hook

        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.lines: list[tuple[float, str]] = []
        self._err = open(self.log_path, "w")
        argv = [*wrap, sys.executable, "-m", "clipstream.cli", *args]
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=dict(env), stdout=subprocess.PIPE, stderr=self._err,
                                     stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                     preexec_fn=_die_with_parent_hook())
        CHILDREN.append(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self) -> bool:
        return any(line.startswith("ready:") for _, line in self.lines)

    def tail(self) -> str:
        try:
            return self.log_path.read_text()[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc, 15)
        self._reader.join(2)
        self._err.close()
        if self in CHILDREN:
            CHILDREN.remove(self)


def wait_ready(children: Sequence[Child], timeout_s: float = 120) -> float:
    t0 = time.monotonic()
    while not all(c.ready() for c in children):
        for c in children:
            if c.proc.poll() is not None:
                raise RuntimeError(f"{c.name} exited during start-up:\n{c.tail()}")
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError("not ready in time: " + ", ".join(c.name for c in children if not c.ready()))
        time.sleep(0.05)
    return time.monotonic() - t0


def stop_all() -> None:
    for c in list(CHILDREN):
        try:
            c.stop()
        except Exception as exc:  # keep stopping the others
            log(f"stopping {c.name}: {exc}")
