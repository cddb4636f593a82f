"""What reading and writing one record per query costs the batcher: faust, aiokafka, librdkafka.

    .venv/bin/python -m bench.intake [--rates 200,800] [--seconds 8] [--quick]

A producer sends ``ModelRequest`` records to a one-partition topic at a fixed rate; a reader
process decodes each one, as the batcher does, and the CPU it used is read from /proc over
the run. Readers: ``faust`` (an agent of the batcher's own faust app, the batcher's intake
until 2026-11-22), ``aiokafka`` (``getmany`` on the event loop), and ``librdkafka``
(``batchers.intake.Intake``, the batcher's intake now). Also each record's latency
from produce to decode. Then writers: a process sends one record at a time at the same rates
through ``faust`` (the batcher app's producer, its way out until 2026-11-22), ``aiokafka`` and
``librdkafka`` (a confluent-kafka ``Producer``, the batcher's way out now); its CPU is reported
net of a writer that only keeps the pace (``pacing``). Writes ``out/bench/intake.json`` and
``intake.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bench.common import figure, private_infra, save_figure, say, write_json
from bench.machine import CLK_TCK, cpu_snapshot, machine_info

READERS = ("faust", "aiokafka", "librdkafka")
WRITERS = ("pacing", "faust", "aiokafka", "librdkafka")  # pacing: the same loop, sending nothing


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's threads, summed by thread name (digits dropped): for the
    broker's JVM, its request threads against its JIT compiler threads. Read under
    /proc/<pid>/task/ (``cpu_snapshot`` reads /proc/<pid>/stat, the whole process)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip().rstrip("0123456789-")
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def _cpu_s(pid: int) -> float:
    return cpu_snapshot({pid: "p"}).get("p", 0.0)


def _child_cpu(argv: list[str], env: dict[str, str], what: str, between: Callable[[], None] | None = None
               ) -> tuple[str, float]:
    """Start ``python -m bench.intake ARGV``; from its "ready" line to its next line (while
    ``between`` runs here, if given), the CPU seconds it used. Returns (that line, seconds)."""
    child = subprocess.Popen([sys.executable, "-m", "bench.intake", *argv], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = child.stdout.readline().strip() if child.stdout else ""
        if line != "ready":
            raise RuntimeError(f"{what} did not start (said {line!r}); see its stderr above")
        cpu0 = _cpu_s(child.pid)
        if between is not None:
            between()
        line = child.stdout.readline().strip() if child.stdout else ""
        return line, _cpu_s(child.pid) - cpu0
    finally:
        child.kill()
        child.wait(10)


# --- reader processes ----------------------------------------------------------------------


def _counter(expected: int) -> Callable[[bytes], None]:
    """Decode a record; after ``expected`` of them print the latency line once."""
    from clipstream.clock import now_us
    from schemas import decode_as

    lat: list[int] = []

    def on(value: bytes) -> None:
        lat.append(now_us() - decode_as("ModelRequest", value)["trace"]["dispatched"])
        if len(lat) == expected:
            lat.sort()
            print(f"done {lat[len(lat) // 2]} {lat[int(len(lat) * 0.99)]}", flush=True)

    return on


async def _wait_assigned(app: Any, topics: list[str]) -> None:
    """Until a faust app's partitions are assigned and their start offsets resolved (nothing is missed)."""
    while True:
        assigned = app.consumer.assignment()
        tps = [tp for tp in assigned if tp.topic in topics]
        if {tp.topic for tp in tps} >= set(topics):
            for tp in tps:
                try:
                    await app.consumer.position(tp)
                except Exception:  # a rebalance in between: try again
                    break
            else:
                return
        await asyncio.sleep(0.05)


def _read_faust(topic: str, on: Callable[[bytes], None]) -> None:
    from batchers.app import _use_uvloop, faust_app, serve
    from clipstream.settings import get_settings

    _use_uvloop()
    app = faust_app(get_settings(), f"bench-intake-{topic}", f"/tmp/bench-intake-{topic}")
    source = app.topic(topic, value_type=bytes, key_type=bytes)

    @app.agent(source)
    async def read(stream: Any) -> None:
        async for event in stream.events():
            on(event.value)

    @app.task
    async def announce() -> None:
        await _wait_assigned(app, [topic])
        print("ready", flush=True)

    serve(app)


async def _read_aiokafka(topic: str, on: Callable[[bytes], None]) -> None:
    from aiokafka import AIOKafkaConsumer

    from clipstream.settings import get_settings
    from topics.client import aiokafka_kwargs

    consumer = AIOKafkaConsumer(topic, group_id=f"bench-intake-{topic}", auto_offset_reset="latest",
                                fetch_max_wait_ms=200, **aiokafka_kwargs(get_settings()))
    await consumer.start()
    while not consumer.assignment():
        await asyncio.sleep(0.05)
    for tp in consumer.assignment():
        await consumer.position(tp)
    print("ready", flush=True)
    while True:
        for records in (await consumer.getmany(timeout_ms=100)).values():
            for r in records:
                on(r.value)


async def _read_librdkafka(topic: str, on: Callable[[bytes], None]) -> None:
    from batchers.intake import Intake, Record
    from clipstream.settings import get_settings

    def deliver(records: list[Record]) -> None:
        for value, _ in records:
            on(value)  # type: ignore[arg-type]

    intake = Intake(get_settings(), topic, f"bench-intake-{topic}", deliver)
    intake.start(asyncio.get_running_loop())
    while not intake.ready.is_set():
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    await asyncio.Event().wait()


def reader_main(kind: str, topic: str, expected: int) -> None:
    on = _counter(expected)
    if kind == "faust":
        _read_faust(topic, on)
        return
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(_read_aiokafka(topic, on) if kind == "aiokafka" else _read_librdkafka(topic, on))


# --- writer processes ----------------------------------------------------------------------


async def _paced(send: Callable[[bytes], Any], rate: float, n: int) -> None:
    """``n`` records at ``rate``, one at a time; "ready" before, "done" after."""
    value = bytes(300)  # about a ModelRequest of 64 floats
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(n):
        pause = t0 + i / rate - loop.time()
        if pause > 0:
            await asyncio.sleep(pause)
        await send(value)


async def _write(kind: str, topic: str, rate: float, n: int) -> None:
    from clipstream.settings import get_settings
    from topics.client import aiokafka_kwargs, producer_config

    settings = get_settings()
    if kind == "pacing":
        async def nothing(value: bytes) -> None:
            return None
        await _paced(nothing, rate, n)
    elif kind == "aiokafka":
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(linger_ms=0, acks=1, **aiokafka_kwargs(settings))
        await producer.start()

        async def send(value: bytes) -> None:
            await producer.send(topic, value)  # the delivery future is not awaited, as in the batcher
        await _paced(send, rate, n)
        await producer.flush()
        await producer.stop()
    else:
        from confluent_kafka import Producer

        rdk = Producer(producer_config(settings))

        async def produce(value: bytes) -> None:
            rdk.produce(topic, value)
            rdk.poll(0)
        await _paced(produce, rate, n)
        rdk.flush(10)
    print("done", flush=True)


def _write_faust(topic: str, rate: float, n: int) -> None:
    from batchers.app import _use_uvloop, faust_app, serve
    from clipstream.settings import get_settings

    _use_uvloop()
    app = faust_app(get_settings(), f"bench-write-{topic}", f"/tmp/bench-write-{topic}", consumer=False)

    @app.task
    async def write() -> None:
        async def send(value: bytes) -> None:
            await app.producer.send(topic, None, value, None, None, None)
        await _paced(send, rate, n)
        await app.producer.flush()
        print("done", flush=True)

    serve(app)


def writer_main(kind: str, topic: str, rate: float, n: int) -> None:
    if kind == "faust":
        _write_faust(topic, rate, n)
        return
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(_write(kind, topic, rate, n))


def run_writer(settings: Any, env: dict[str, str], kind: str, rate: float, seconds: float) -> dict[str, Any]:
    from topics.admin import ensure_topics
    from topics.catalogue import TopicSpec

    topic = f"bench-write-{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, [TopicSpec(topic, 1)])
    n = int(rate * seconds)
    line, cpu = _child_cpu(["--writer", kind, "--topic", topic, "--rate", str(rate), "--expected", str(n)], env,
                           f"writer {kind}")
    if line != "done":
        raise RuntimeError(f"writer {kind} stopped before sending all {n} records")
    return {"writer": kind, "rate_qps": rate, "records": n, "cpu_us_per_record": cpu * 1e6 / n}


# --- one run -------------------------------------------------------------------------------


def run_one(settings: Any, env: dict[str, str], kind: str, rate: float, seconds: float) -> dict[str, Any]:
    import numpy as np
    from confluent_kafka import Producer

    from clipstream.clock import now_us
    from schemas import encode, to_tensor
    from topics.admin import ensure_topics
    from topics.catalogue import TopicSpec
    from topics.client import producer_config

    topic = f"bench-intake-{uuid.uuid4().hex[:8]}"
    ensure_topics(settings, [TopicSpec(topic, 1)])
    n = int(rate * seconds)
    producer = Producer(producer_config(settings))
    x = to_tensor(np.random.default_rng(0).random(64, dtype=np.float32))

    def send() -> None:
        t0 = time.monotonic()
        for i in range(n):
            pause = t0 + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            record = {"query_id": uuid.uuid4().hex, "app": "bench", "model": "m", "input": x,
                      "deadline_us": now_us() + 10_000_000, "selector_partition": 0, "trace": {"dispatched": now_us()}}
            producer.produce(topic, encode("ModelRequest", record))
            producer.poll(0)
        producer.flush(10)

    line, cpu = _child_cpu(["--reader", kind, "--topic", topic, "--expected", str(n)], env, f"reader {kind}", send)
    if not line.startswith("done"):
        raise RuntimeError(f"reader {kind} stopped before reading all {n} records")
    _, p50, p99 = line.split()
    row = {"reader": kind, "rate_qps": rate, "records": n, "cpu_us_per_record": cpu * 1e6 / n,
           "latency_ms_p50": int(p50) / 1000, "latency_ms_p99": int(p99) / 1000}
    say(f"  {kind:10s} {rate:5.0f} q/s: {row['cpu_us_per_record']:6.0f} us CPU/record, "
        f"produce->decoded p50 {row['latency_ms_p50']:.2f} ms, p99 {row['latency_ms_p99']:.2f} ms")
    return row


def plot(rows: list[dict[str, Any]], writes: list[dict[str, Any]]) -> None:
    fig, axes = figure(1, 3, (16, 4))
    rates = sorted({r["rate_qps"] for r in rows})
    width = 0.8 / len(READERS)
    for i, kind in enumerate(READERS):
        mine = {r["rate_qps"]: r for r in rows if r["reader"] == kind}
        xs = [j + i * width for j in range(len(rates))]
        axes[0][0].bar(xs, [mine[q]["cpu_us_per_record"] if q in mine else 0 for q in rates], width, label=kind)
        axes[0][1].bar(xs, [mine[q]["latency_ms_p99"] if q in mine else 0 for q in rates], width, label=kind)
    for ax, title in ((axes[0][0], "reader CPU per record (us)"), (axes[0][1], "produce -> decoded p99 (ms)")):
        ax.set_xticks([j + width for j in range(len(rates))], [f"{q:g} q/s" for q in rates])
        ax.set_title(title)
        ax.legend()
    kinds = [k for k in WRITERS if k != "pacing"]
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        mine = {w["rate_qps"]: w for w in writes if w["writer"] == kind}
        axes[0][2].bar([j + i * width for j in range(len(rates))],
                       [mine[q]["net_cpu_us_per_record"] if q in mine else 0 for q in rates], width, label=kind)
    axes[0][2].set_xticks([j + width for j in range(len(rates))], [f"{q:g} q/s" for q in rates])
    axes[0][2].set_title("writer CPU per record, net of pacing (us)")
    axes[0][2].legend()
    save_figure(fig, "intake")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rates", default="200,800")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--quick", action="store_true", help="3 s per run")
    ap.add_argument("--reader", choices=READERS, help=argparse.SUPPRESS)
    ap.add_argument("--writer", choices=WRITERS, help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--expected", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.reader:
        reader_main(args.reader, args.topic, args.expected)
        return {}
    if args.writer:
        writer_main(args.writer, args.topic, args.rate, args.expected)
        return {}
    seconds = 3.0 if args.quick else args.seconds
    rows: list[dict[str, Any]] = []
    writes: list[dict[str, Any]] = []
    with private_infra() as (settings, env, status):
        assert status.kafka_pid is not None, "private_infra started no broker"
        broker0 = _thread_cpu(status.kafka_pid)
        for rate in [float(r) for r in args.rates.split(",") if r]:
            say(f"intake at {rate:g} q/s for {seconds:g} s per reader")
            for kind in READERS:
                rows.append(run_one(settings, env, kind, rate, seconds))
            say(f"writing at {rate:g} q/s for {seconds:g} s per writer")
            mine = [run_writer(settings, env, kind, rate, seconds) for kind in WRITERS]
            for w in mine:
                w["net_cpu_us_per_record"] = w["cpu_us_per_record"] - mine[0]["cpu_us_per_record"]
                say(f"  {w['writer']:10s} {rate:5.0f} q/s: {w['cpu_us_per_record']:6.0f} us CPU/record "
                    f"({w['net_cpu_us_per_record']:.0f} more than pacing alone)")
            writes += mine
        broker1 = _thread_cpu(status.kafka_pid)
    # a fresh broker, as every benchmark starts one: how much of its CPU goes to the JIT
    used = {k: v - broker0.get(k, 0.0) for k, v in broker1.items()}
    broker = {k: round(v, 2) for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v >= 0.05}
    say(f"the broker's CPU seconds by thread over the runs (a fresh broker): {broker}")
    by = {(r["reader"], r["rate_qps"]): r["cpu_us_per_record"] for r in rows}
    net = {(w["writer"], w["rate_qps"]): w["net_cpu_us_per_record"] for w in writes}
    rates = sorted({r["rate_qps"] for r in rows})
    summary = {**{f"faust_over_librdkafka_at_{q:g}": by[("faust", q)] / by[("librdkafka", q)] for q in rates},
               **{f"write_faust_over_librdkafka_at_{q:g}": net[("faust", q)] / net[("librdkafka", q)] for q in rates}}
    report = {"machine": machine_info(), "seconds": seconds, "rows": rows, "writes": writes,
              "broker_cpu_s_by_thread": broker, "summary": summary}
    write_json("intake", report)
    plot(rows, writes)
    return report


if __name__ == "__main__":
    main()
