"""Open-loop load generator: Poisson or Gamma arrivals, through the gateway or straight into Kafka.

Arrivals follow InferLine's workload model: gaps drawn from a Gamma distribution with the given
mean rate and coefficient of variation (CV 1 is a Poisson process, CV 0 a constant rate, CV > 1
bursty). The generator is open loop: each query is sent at its scheduled time whether or not the
earlier ones have been answered, and its latency runs from that scheduled time (a generator
that falls behind does not hide the system's queueing: no coordinated omission).

Two ways in:
- ``gateway``: async httpx, one task per query over a pool of keep-alive connections;
- ``kafka``: a confluent-kafka Producer writes QueryEvents to the queries topic with a private
  reply topic, and a consumer thread reads the Responses (their trace stamps come along).

Every query's outcome is recorded (answered, default, error, lost = no answer at all); the
summary gives throughput, goodput within the SLO, p50/p90/p99/p99.9 and the fraction of SLO
misses (a default, an error, a lost query or a late answer is a miss), plus the generator's own
CPU use (process time / wall time) and how late it sent (its lag behind the schedule).

    .venv/bin/python -m bench.load --url http://127.0.0.1:8080 --app digits --rate 200 --duration 10
    .venv/bin/python -m bench.load --mode kafka --bootstrap 127.0.0.1:9092 --app digits --rate 500
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
OUTCOMES = ("answered", "default", "error", "lost")


# --- the arrival process (pure) -----------------------------------------------------------------


def arrival_gaps(rate: float, cv: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` inter-arrival gaps (seconds): Gamma with mean 1/rate and coefficient of variation cv.

    cv = 1 is exponential (Poisson arrivals); cv = 0 is a constant gap.
    """
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if cv < 0:
        raise ValueError("cv must be >= 0")
    if cv == 0:
        return np.full(n, 1.0 / rate)
    shape = 1.0 / (cv * cv)
    return np.random.default_rng(seed).gamma(shape, 1.0 / (rate * shape), n)


def arrival_times(rate: float, cv: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Send times (seconds from the start) of every arrival before ``duration_s``."""
    n = int(rate * duration_s * 1.2 + 10 * math.sqrt(rate * duration_s + 1) + 10)
    while True:
        times = np.cumsum(arrival_gaps(rate, cv, n, seed))
        if times[-1] >= duration_s:
            return times[times < duration_s]
        n *= 2


def gap_stats(gaps: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """(rate, cv) of observed gaps."""
    g = np.asarray(gaps, dtype=np.float64)
    mean = float(g.mean())
    return 1.0 / mean, float(g.std() / mean)


# --- records and statistics (pure) ---------------------------------------------------------------


@dataclass
class Outcome:
    """One query: when it was due (epoch us), when it was really sent, when its answer came."""

    index: int
    sched_us: int
    sent_us: int = 0
    recv_us: int = 0  # 0: no answer
    outcome: str = "lost"
    query_id: str = ""
    output: Any = None
    trace: dict[str, int] = field(default_factory=dict)
    server_ms: float = math.nan  # the gateway's own latency_ms for the call (200 answers)
    status: int = 0  # the HTTP status (gateway runs; 0: none came)

    @property
    def latency_ms(self) -> float:
        return (self.recv_us - self.sched_us) / 1000.0 if self.recv_us else math.nan


def percentiles(values: Sequence[float] | np.ndarray, qs: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """{"p50": ..., "p99.9": ...}; NaN values are dropped, inf kept (a miss ranks last)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {_pname(q): math.nan for q in qs}
    # "higher": a percentile is a latency some query really had (inf stays inf)
    return {_pname(q): float(np.percentile(v, q, method="higher")) for q in qs}


def _pname(q: float) -> str:
    return f"p{q:g}"


def summarize(results: Sequence[Outcome], slo_ms: float, duration_s: float, *, warmup_s: float = 0.0,
              start_us: int | None = None) -> dict[str, Any]:
    """Throughput, goodput, latency percentiles and SLO misses of the queries due after warm-up.

    ``latency`` percentiles are over queries that got any answer (defaults included);
    ``effective`` ones count every miss (default, error, lost, late) as infinitely slow, so
    "effective p99 <= SLO" means at least 99% of queries got a real answer within the SLO.
    """
    if not results:
        return {"sent": 0}
    t0 = start_us if start_us is not None else min(r.sched_us for r in results)
    lo = t0 + int(warmup_s * 1e6)
    window = [r for r in results if r.sched_us >= lo]
    span = max(1e-9, duration_s - warmup_s)
    n = len(window)
    counts = {k: 0 for k in OUTCOMES}
    for r in window:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    lat = np.array([r.latency_ms for r in window], dtype=np.float64)
    good = np.array([r.outcome == "answered" and r.latency_ms <= slo_ms for r in window], dtype=bool)
    effective = np.where(good, lat, math.inf)
    lag = np.array([(r.sent_us - r.sched_us) / 1000.0 for r in window if r.sent_us], dtype=np.float64)
    # the same answers timed from when the generator really sent: without its own lag, which on
    # a shared machine is the instrument's delay, not the system's (``latency`` keeps it: open loop)
    from_send = np.array([(r.recv_us - r.sent_us) / 1000.0 for r in window if r.sent_us and r.recv_us],
                         dtype=np.float64)
    return {
        "sent": n,
        "offered_qps": n / span,
        **{k: counts[k] for k in OUTCOMES},
        "throughput_qps": (counts["answered"] + counts["default"]) / span,
        "goodput_qps": int(good.sum()) / span,
        "slo_ms": slo_ms,
        "slo_miss": float(1.0 - good.mean()) if n else math.nan,
        "latency_ms": percentiles(lat),
        "effective_ms": percentiles(effective),
        "mean_ms": float(np.nanmean(lat)) if n and not np.isnan(lat).all() else math.nan,
        "send_lag_ms": percentiles(lag, (50.0, 99.0)) if lag.size else {},
        "latency_from_send_ms": percentiles(from_send),
    }


# --- drivers ------------------------------------------------------------------------------------


def _now_us() -> int:
    return time.time_ns() // 1000


@dataclass
class RunResult:
    results: list[Outcome]
    start_us: int
    duration_s: float
    wall_s: float
    cpu_s: float

    @property
    def cpu_share(self) -> float:
        """The generator's CPU time over the run's wall time (1.0 = one core busy)."""
        return self.cpu_s / max(1e-9, self.wall_s)

    def summary(self, slo_ms: float, warmup_s: float = 0.0) -> dict[str, Any]:
        s = summarize(self.results, slo_ms, self.duration_s, warmup_s=warmup_s, start_us=self.start_us)
        s["generator_cpu_share"] = round(self.cpu_share, 3)
        return s


Progress = Callable[[str], None]


def _ticker(label: str, total: int, done: Callable[[], int], progress: Progress | None,
            stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.wait(2.0):
            if progress:
                progress(f"    {label}: {done()}/{total} answered")
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


class RawHTTP:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: a pool of connections, one
    request at a time each. It costs a small fraction of httpx's CPU per request, which is what
    lets a 2-core box offer more load than the gateway serves. ``post`` -> (status, body)."""

    def __init__(self, url: str, max_connections: int, timeout_s: float) -> None:
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.max, self.timeout_s = max_connections, timeout_s
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.open = 0
        self.freed = asyncio.Event()

    async def warm(self, n: int) -> None:
        """Open ``n`` connections before the run: a population of callers keeps its connections,
        and opening them all at the first burst costs both sides a CPU spike that is not the
        steady state being measured (the httpx client is warmed the same way)."""
        n = min(n, self.max - self.open)
        self.open += n
        opened = await asyncio.gather(*(asyncio.open_connection(self.host, self.port) for _ in range(n)),
                                      return_exceptions=True)
        for conn in opened:
            if isinstance(conn, BaseException):
                self.open -= 1
            else:
                self.idle.append(conn)

    async def _conn(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while True:
            if self.idle:
                reader, writer = self.idle.pop()
                if reader.at_eof():  # the server closed it while it sat idle
                    self.open -= 1
                    writer.close()
                    continue
                return reader, writer
            if self.open < self.max:
                self.open += 1
                try:
                    return await asyncio.open_connection(self.host, self.port)
                except Exception:
                    self.open -= 1
                    raise
            self.freed.clear()
            await self.freed.wait()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        reader, writer = await self._conn()
        ok = False
        try:
            writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (path.encode(), self.host.encode(), len(body), body))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            data = await reader.readexactly(length) if length else b""
            ok = True
            return status, data
        finally:
            if ok:
                self.idle.append((reader, writer))
            else:
                self.open -= 1
                writer.close()
            self.freed.set()

    async def aclose(self) -> None:
        for _, w in self.idle:
            w.close()
        self.idle.clear()


def without_gc_pauses(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` with the garbage collector off, then back as it was.

    The load generator must not stall: with a run's Outcomes and tasks alive, one collection
    of its oldest generation took 40-70 ms (timed with ``gc.callbacks``), and that pause lands
    in the callers' latency as if the system under test had made it. The run's garbage waits
    until the run is over."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return wrapper


@without_gc_pauses
def run_gateway(url: str, app: str, bodies: Sequence[bytes], times: np.ndarray, *, max_connections: int = 256,
                timeout_s: float = 10.0, progress: Progress | None = None, client: str = "raw") -> RunResult:
    """Post ``bodies[i % len]`` at ``times[i]`` (seconds from now) to the app's predict route.

    ``client``: ``raw`` (``RawHTTP``, cheap) or ``httpx`` (httpx.AsyncClient)."""
    return asyncio.run(_gateway(url, app, bodies, times, max_connections, timeout_s, progress, client))


async def _gateway(url: str, app: str, bodies: Sequence[bytes], times: np.ndarray, max_connections: int,
                   timeout_s: float, progress: Progress | None, kind: str) -> RunResult:
    import httpx

    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    path = f"/v1/apps/{app}/predict"
    headers = {"content-type": "application/json"}
    loop = asyncio.get_running_loop()
    results = [Outcome(i, 0) for i in range(len(times))]
    answered = [0]
    raw = RawHTTP(url, max_connections, timeout_s) if kind == "raw" else None
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s) as client:
        # open the connections first: connection set-up is not the system's latency
        if raw is not None:
            await raw.warm(min(max_connections, 128))
        else:
            await asyncio.gather(*(client.get("/healthz") for _ in range(min(max_connections, 64))),
                                 return_exceptions=True)

        async def one(i: int) -> None:
            r = results[i]
            r.sent_us = _now_us()
            try:
                if raw is not None:
                    status, content = await raw.post(path, bodies[i % len(bodies)])
                else:
                    resp = await client.post(path, content=bodies[i % len(bodies)], headers=headers)
                    status, content = resp.status_code, resp.content
                r.recv_us, r.status = _now_us(), status
                if status == 200:
                    body = json.loads(content)
                    r.outcome = "default" if body.get("default") else "answered"
                    r.query_id = body.get("query_id", "")
                    r.output = body.get("output")
                    r.server_ms = float(body.get("latency_ms", math.nan))
                else:
                    r.outcome = "error"
            except Exception:  # timeouts, refused connections: an error, keep going
                r.recv_us = _now_us()
                r.outcome = "error"
            answered[0] += 1

        stop = threading.Event()
        _ticker("gateway", len(times), lambda: answered[0], progress, stop)
        cpu0, wall0 = time.process_time(), time.monotonic()
        start_us = _now_us() + 20_000
        t0 = loop.time() + 0.02
        tasks: set[asyncio.Task[None]] = set()
        for i, t in enumerate(times):
            delay = t0 + t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            results[i].sched_us = start_us + int(t * 1e6)
            task = asyncio.create_task(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s + 5)
        stop.set()
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        if raw is not None:
            await raw.aclose()
    duration = float(times[-1]) if len(times) else 0.0
    return RunResult(results, start_us, duration, wall, cpu)


class KafkaLoad:
    """QueryEvents straight into the queries topic; Responses from a private reply topic."""

    def __init__(self, settings: Any, keep_trace: bool = True) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        from topics.admin import watermarks
        from topics.admin import ensure_topics
        from topics.catalogue import Catalogue
        from topics.client import consumer_config, producer_config

        self.settings = settings
        cat = Catalogue.from_settings(settings)
        self.instance = f"load{uuid.uuid4().hex[:8]}"
        # the broker stamps each Response with its append time: the reply hop splits in two
        spec = cat.replies(self.instance)
        self.reply = replace(spec, config={**spec.config, "message.timestamp.type": "LogAppendTime"})
        self.queries_topic = cat.queries.name
        ensure_topics(settings, [self.reply, cat.queries])
        self.producer = Producer(producer_config(settings))
        self.consumer = Consumer(consumer_config(settings, f"bench-{self.instance}",
                                                 **{"enable.auto.commit": False}))
        tp = TopicPartition(self.reply.name, 0)
        _, high = watermarks(self.consumer, tp)
        self.consumer.assign([TopicPartition(self.reply.name, 0, max(high, 0))])
        self.keep_trace = keep_trace

    def close(self) -> None:
        from confluent_kafka.admin import AdminClient

        from topics.client import admin_config

        self.producer.flush(5)
        self.consumer.close()
        try:
            for fut in AdminClient(admin_config(self.settings)).delete_topics([self.reply.name]).values():
                fut.result(timeout=10)
        except Exception:  # best effort: a private broker goes away anyway
            pass
        # drop the librdkafka handles now: one left for the GC keeps reconnecting to a stopped broker
        del self.producer, self.consumer

    def run_closed(self, app: str, tensors: Sequence[dict[str, Any]], duration_s: float, slo_ms: float,
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
    def run(self, app: str, tensors: Sequence[dict[str, Any]], times: np.ndarray, slo_ms: float, *,
            drain_s: float = 3.0, progress: Progress | None = None, gate: threading.Semaphore | None = None,
            stop_after_s: float | None = None) -> RunResult:
        """Send ``tensors[i % len]`` (``schemas.to_tensor`` dicts) at ``times[i]``."""
        from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

        from schemas import decode_as, encode

        prefix = uuid.uuid4().hex[:12]
        results = [Outcome(i, 0, query_id=f"{prefix}{i:09d}") for i in range(len(times))]
        slo_us = int(slo_ms * 1000)
        stop = threading.Event()
        got = [0]

        def receive() -> None:
            while not stop.is_set():
                # consume(n, timeout) waits for n records or the whole timeout: wait for one only
                first = self.consumer.poll(0.05)
                if first is None:
                    continue
                now = _now_us()
                msgs = [first, *self.consumer.consume(999, 0)]
                for m in msgs:
                    if m.error():
                        continue
                    try:
                        rec = decode_as("Response", m.value())
                    except Exception:
                        continue
                    qid = rec["query_id"]
                    if not qid.startswith(prefix):
                        continue
                    r = results[int(qid[len(prefix):])]
                    if r.recv_us:
                        continue
                    r.recv_us = now
                    if self._release is not None:
                        self._release()
                    r.outcome = "default" if rec["is_default"] else "answered"
                    r.output = rec.get("output")
                    if self.keep_trace:
                        r.trace = dict(rec.get("trace") or {})
                        r.trace["_missing"] = len(rec.get("missing") or ())
                        kind, ts_ms = m.timestamp()
                        if kind == TIMESTAMP_LOG_APPEND_TIME:
                            r.trace["_reply_appended"] = ts_ms * 1000
                    got[0] += 1

        rx = threading.Thread(target=receive, daemon=True)
        rx.start()
        tick_stop = threading.Event()
        _ticker("kafka", len(times), lambda: got[0], progress, tick_stop)
        cpu0, wall0 = time.process_time(), time.monotonic()
        start = time.monotonic() + 0.02
        start_us = _now_us() + 20_000
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
            now = _now_us()
            r.sent_us = now
            event = {"query_id": r.query_id, "app": app, "context": None, "input": tensors[i % n_t],
                     "created_us": now, "deadline_us": now + slo_us, "reply_topic": self.reply.name,
                     "reply_partition": 0, "trace": {"produced": now}}
            while True:
                try:
                    produce(topic, encode("QueryEvent", event), r.query_id.encode())
                    break
                except BufferError:
                    poll(0.01)
            poll(0)
        self.producer.flush(10)
        deadline = time.monotonic() + slo_ms / 1000 + drain_s
        while got[0] < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        tick_stop.set()
        rx.join(5)
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        results = results[:sent]
        if gate is not None:
            duration = float(stop_after_s or 0.0)
        else:
            duration = float(times[-1]) if len(times) else 0.0
        return RunResult(results, start_us, duration, wall, cpu)


# --- inputs -------------------------------------------------------------------------------------


def unique_inputs(n: int, shape: Sequence[int] = (64,), seed: int = 0, high: int = 17) -> np.ndarray:
    """``n`` distinct float32 inputs with digit-like values 0..16 (no prediction-cache hits)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, high, size=(n, *shape)).astype(np.float32)
    x.reshape(n, -1)[:, 0] = np.arange(n) % high  # spread; collisions are negligible anyway
    return x


def json_bodies(inputs: np.ndarray, slo_ms: float | None = None) -> list[bytes]:
    extra = f', "slo_ms": {slo_ms:g}' if slo_ms is not None else ""
    return [(f'{{"input": {json.dumps(row.astype(int).tolist() if np.all(row == np.round(row)) else row.tolist())}'
             f'{extra}}}').encode() for row in inputs]


def tensors(inputs: np.ndarray) -> list[dict[str, Any]]:
    from schemas import to_tensor

    return [to_tensor(np.ascontiguousarray(row)) for row in inputs]


def format_summary(s: dict[str, Any]) -> str:
    lat, eff = s.get("latency_ms", {}), s.get("effective_ms", {})
    return (f"offered {s.get('offered_qps', 0):7.1f} q/s  answered {s.get('goodput_qps', 0):7.1f} q/s in SLO  "
            f"p50 {lat.get('p50', math.nan):6.1f}  p99 {lat.get('p99', math.nan):6.1f}  "
            f"p99.9 {lat.get('p99.9', math.nan):6.1f} ms  eff.p99 {eff.get('p99', math.nan):6.1f}  "
            f"miss {s.get('slo_miss', math.nan):6.2%}  (def {s.get('default', 0)}, err {s.get('error', 0)}, "
            f"lost {s.get('lost', 0)})  gen cpu {s.get('generator_cpu_share', math.nan):.2f}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("gateway", "kafka"), default="gateway")
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="gateway (mode gateway)")
    ap.add_argument("--bootstrap", default=None, help="Kafka (mode kafka); default CLIPSTREAM_KAFKA_BOOTSTRAP")
    ap.add_argument("--app", required=True)
    ap.add_argument("--rate", type=float, required=True, help="mean arrival rate, queries/s")
    ap.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of the gaps (1 = Poisson)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds left out of the statistics")
    ap.add_argument("--slo-ms", type=float, default=50.0, help="the SLO the queries carry and are judged by")
    ap.add_argument("--shape", default="64", help="input shape, comma-separated (float32, values 0..16)")
    ap.add_argument("--connections", type=int, default=256, help="gateway keep-alive connections")
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw", help="HTTP client (mode gateway)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the summary here")
    args = ap.parse_args(argv)
    times = arrival_times(args.rate, args.cv, args.duration, args.seed)
    shape = tuple(int(s) for s in args.shape.split(","))
    inputs = unique_inputs(len(times), shape, args.seed)
    print(f"{len(times)} queries over {args.duration:g}s ({args.mode}, rate {args.rate:g}, cv {args.cv:g})", flush=True)
    if args.mode == "gateway":
        run = run_gateway(args.url, args.app, json_bodies(inputs, args.slo_ms), times,
                          max_connections=args.connections, progress=print, client=args.client)
    else:
        from clipstream.settings import get_settings

        settings = get_settings(**({"kafka_bootstrap": args.bootstrap} if args.bootstrap else {}))
        load = KafkaLoad(settings)
        try:
            run = load.run(args.app, tensors(inputs), times, args.slo_ms, progress=print)
        finally:
            load.close()
    summary = run.summary(args.slo_ms, args.warmup)
    print(format_summary(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
