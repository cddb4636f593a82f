"""The load generator's way in straight through Kafka: QueryEvents produced to the queries
topic, Responses read from a private reply topic, each query's outcome recorded as in
``bench.load``."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from bench.load import Outcome, Progress, RunResult, now_us, ticker, without_gc_pauses
from bench.tap import Tap
from schemas import QueryEvent, Record, Response, Tensor, encode


class KafkaLoad:
    """QueryEvents straight into the queries topic; Responses from a private reply topic."""

    def __init__(self, settings: Any, keep_trace: bool = True) -> None:
        from confluent_kafka import Producer

        from topics.admin import ensure_topics
        from topics.catalogue import Catalogue
        from topics.client import producer_config

        self.settings = settings
        cat = Catalogue.from_settings(settings)
        self.instance = f"load{uuid.uuid4().hex[:8]}"
        # the broker stamps each Response with its append time: the reply hop splits in two
        spec = cat.replies(self.instance)
        self.reply = replace(spec, config={**spec.config, "message.timestamp.type": "LogAppendTime"})
        self.queries_topic = cat.queries.name
        ensure_topics(settings, [self.reply, cat.queries])
        self.producer = Producer(producer_config(settings))
        self.tap = Tap(settings, [self.reply], group=f"bench-{self.instance}")
        self.keep_trace = keep_trace

    def close(self) -> None:
        from confluent_kafka.admin import AdminClient

        from topics.client import admin_config

        self.producer.flush(5)
        self.tap.close()
        try:
            for fut in AdminClient(admin_config(self.settings)).delete_topics([self.reply.name]).values():
                fut.result(timeout=10)
        except Exception:  # best effort: a private broker goes away anyway
            pass
        # drop the librdkafka handles now: one left for the GC keeps reconnecting to a stopped broker
        del self.producer, self.tap

    def run_closed(self, app: str, tensors: Sequence[Tensor], duration_s: float, slo_ms: float,
                   concurrency: int = 32, progress: Progress | None = None) -> RunResult:
        """Closed loop for capacity: keep ``concurrency`` queries outstanding for ``duration_s``.

        Open-loop overload is no way to measure capacity here (the queue grows until every
        query is late); a fixed number in flight keeps the system just saturated."""
        sem = threading.Semaphore(concurrency)
        self._release = sem.release
        try:
            # enough slots for any rate this machine reaches: the inputs are cycled, so a short
            # list (the cache benchmark's repeats) never caps the closed loop's throughput
            n = max(len(tensors), int(duration_s * 5000) + concurrency)
            return self.run(app, tensors, np.zeros(n), slo_ms, progress=progress, gate=sem, stop_after_s=duration_s)
        finally:
            self._release = None

    _release: Callable[[], None] | None = None

    @without_gc_pauses
    def run(self, app: str, tensors: Sequence[Tensor], times: np.ndarray, slo_ms: float, *,
            drain_s: float = 3.0, progress: Progress | None = None, gate: threading.Semaphore | None = None,
            stop_after_s: float | None = None) -> RunResult:
        """Send ``tensors[i % len]`` (``bench.load.tensors``) at ``times[i]``."""
        prefix = uuid.uuid4().hex[:12]
        results = [Outcome(i, 0, query_id=f"{prefix}{i:09d}") for i in range(len(times))]
        got = [0]
        self.tap.start(self._receiver(prefix, results, got))
        tick_stop = threading.Event()
        ticker("kafka", len(times), lambda: got[0], progress, tick_stop)
        cpu0, wall0 = time.process_time(), time.monotonic()
        start = time.monotonic() + 0.02
        start_us = now_us() + 20_000
        sent = self._send_all(app, tensors, times, results, int(slo_ms * 1000), start, start_us, gate, stop_after_s)
        self.producer.flush(10)
        deadline = time.monotonic() + slo_ms / 1000 + drain_s
        while got[0] < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        self.tap.stop()
        tick_stop.set()
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        if gate is not None:
            duration = float(stop_after_s or 0.0)
        else:
            duration = float(times[-1]) if len(times) else 0.0
        return RunResult(results[:sent], start_us, duration, wall, cpu)

    def _receiver(self, prefix: str, results: list[Outcome], got: list[int]) -> Callable[[Record, Any, int], None]:
        """The tap's handler for this run: it records each of the run's Responses once on its
        Outcome (by the number in its query id) and frees a closed loop's slot."""
        from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

        def receive(rec: Record, m: Any, now: int) -> None:
            if not isinstance(rec, Response) or not rec.query_id.startswith(prefix):
                return
            qid = rec.query_id
            r = results[int(qid[len(prefix):])]
            if r.recv_us:
                return
            r.recv_us = now
            if self._release is not None:
                self._release()
            r.outcome = "default" if rec.is_default else "answered"
            r.output = rec.output
            if self.keep_trace:
                r.trace = dict(rec.trace)
                r.trace["_missing"] = len(rec.missing)
                kind, ts_ms = m.timestamp()
                if kind == TIMESTAMP_LOG_APPEND_TIME:
                    r.trace["_reply_appended"] = ts_ms * 1000
            got[0] += 1

        return receive

    def _send_all(self, app: str, tensors: Sequence[Tensor], times: np.ndarray, results: list[Outcome], slo_us: int,
                  start: float, start_us: int, gate: threading.Semaphore | None, stop_after_s: float | None) -> int:
        """Produce every query at its time (open loop) or as a slot frees up (closed loop, until
        ``stop_after_s``); returns how many were sent. One tight loop, so the sends stay on time."""
        produce, poll, topic = self.producer.produce, self.producer.poll, self.queries_topic
        n_t = len(tensors)
        sent = len(times)
        for i, t in enumerate(times):
            if gate is not None:  # closed loop: wait for a free slot; the clock starts at the send
                while not gate.acquire(timeout=0.05):
                    self.producer.poll(0)
                if stop_after_s is not None and time.monotonic() - start > stop_after_s:
                    sent = i
                    break
                t = time.monotonic() - start
            delay = start + t - time.monotonic()
            if delay > 0.0005:
                time.sleep(delay)
            r = results[i]
            r.sched_us = start_us + int(t * 1e6)
            now = now_us()
            r.sent_us = now
            event = QueryEvent(query_id=r.query_id, app=app, context=None, input=tensors[i % n_t],
                               created_us=now, deadline_us=now + slo_us, reply_topic=self.reply.name,
                               reply_partition=0, trace={"produced": now})
            while True:
                try:
                    produce(topic, encode(event), r.query_id.encode())
                    break
                except BufferError:
                    poll(0.01)
            poll(0)
        return sent
