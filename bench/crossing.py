"""What one Kafka crossing costs: a record produced by one client and fetched by another, on the
single broker ``make demo`` uses, with the clients' settings every stage uses
(``topics.client``), and the same crossing under the settings one might try instead.

A query through clipstream makes five such crossings (query, request, batch, predictions,
answer), so five times the broker's CPU per crossing at a rate is a floor under the
pipeline's CPU per query at that rate that no stage's Python can lower; the issue 33 rows of
``bench.figures`` are read against it. Each variant runs at each rate for a few seconds of
open-loop sends (a record every ``1/rate`` s), and reports per record: the broker's CPU (utime
+ stime of its JVM, compiler threads apart), this process's CPU (the producer and the consumer,
librdkafka's threads included), the produce requests the broker served, and the p50 of the
crossing (send to poll). The broker's own idle CPU (measured apart and reported) is part of
each row, as it is of the pipeline's figures. Apart from the rows, an ensemble's fan-out is
measured both ways the selector can send it: five records for five topics produced back to back
(one per model), and one record that names all five models (the default).

    .venv/bin/python -m bench.crossing [--quick]     # out/bench/crossing.json and .png
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.common import OUT, figure, save_figure, say, write_json
from bench.machine import CLK_TCK, jit_cpu_s, machine_info
from clipstream.infra import launcher
from clipstream.settings import Settings
from topics.client import admin_config, consumer_config, producer_config

RATES = (100.0, 300.0, 1000.0)
CROSSINGS_PER_QUERY = 5  # queries, requests, batches, predictions, replies
RECORD_BYTES = 3200  # about a QueryEvent of a 28x28 float image
# what the stages use, then one change at a time
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "stages' settings": ({}, {}),
    "one produce in flight": ({"max.in.flight.requests.per.connection": 1}, {}),
    "linger 1 ms": ({"linger.ms": 1}, {}),
    "acks=1, no idempotence": ({"acks": 1, "enable.idempotence": False}, {}),
}
# the stages' settings, with the same records/s sent this many at a time: what a crossing
# costs when a record shares its wake-ups and requests with others (a stage's group or batch)
BURSTS = {"stages' settings, bursts of 8": 8}
FAN_OUT = 5  # the demo ensemble's models: one request record per model, each on its model's topic
FAN_OUT_RATE = 200.0  # about the ensemble's highest rate within its SLO on 2 cores


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def idle_cores(pid: int, seconds: float = 5.0) -> float:
    """The broker's CPU with no client sending: its own timers, the controller, idle fetches."""
    c0, j0 = _cpu_s(pid), jit_cpu_s(pid) or 0.0
    time.sleep(seconds)
    return ((_cpu_s(pid) - c0) - ((jit_cpu_s(pid) or 0.0) - j0)) / seconds


class CountedProducer:
    """A producer whose produce requests so far are read from librdkafka's statistics, which it
    emits every half second and ``poll`` serves."""

    def __init__(self, settings: Settings, **extra: Any) -> None:
        self.latest: dict[str, Any] = {}
        self.producer = Producer(producer_config(settings, **extra, **{
            "statistics.interval.ms": 500, "stats_cb": lambda s: self.latest.update(json.loads(s))}))

    def requests(self) -> int:
        """Produce requests sent so far, as of a report taken now (waits for the next one)."""
        time.sleep(0.6)
        self.producer.poll(0)
        return sum(b.get("req", {}).get("Produce", 0) for b in self.latest.get("brokers", {}).values())


def fresh_topics(settings: Settings, prefix: str, n: int) -> tuple[AdminClient, list[str]]:
    """``n`` new one-partition topics (the caller deletes them with the admin client)."""
    names = [f"{prefix}-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    admin = AdminClient(admin_config(settings))
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in names]).values():
        fut.result(10)
    return admin, names


@dataclass
class OpenLoopRun:
    """What one open-loop run measured: per message (a record, or a query's records to every
    topic), the broker's and this process's CPU, and the latencies; the produce requests and
    the consumer's polls that brought a record, in all."""

    sent: int
    latencies: list[float]
    broker_cpu_s: float
    clients_cpu_s: float
    produce_requests: int
    polls: int

    def per_message_us(self, seconds: float) -> float:
        return round(seconds * 1e6 / max(1, len(self.latencies)), 1)

    def p50_ms(self) -> float | None:
        return round(float(np.percentile(self.latencies, 50)) * 1000, 2) if self.latencies else None


def open_loop(settings: Settings, broker_pid: int, prefix: str, topics: int, rate: float, seconds: float,
              producer_extra: dict[str, Any] | None = None, consumer_extra: dict[str, Any] | None = None,
              burst: int = 1) -> OpenLoopRun:
    """``rate`` messages/s, ``burst`` back to back at a time, over ``topics`` fresh one-partition
    topics: a message is one record to each topic, all with its key, and it has arrived once one
    consumer reading every topic (as a stage does) has read them all."""
    admin, names = fresh_topics(settings, prefix, topics)
    counted = CountedProducer(settings, **(producer_extra or {}))
    producer = counted.producer
    consumer = Consumer(consumer_config(settings, f"{prefix}-{names[0]}", **{"auto.offset.reset": "earliest"},
                                        **(consumer_extra or {})))
    consumer.subscribe(names)
    while not consumer.assignment():  # joined: the first record is not held back by a rebalance
        consumer.poll(0.1)
    n = int(rate * seconds)
    seen: dict[bytes, int] = {}
    latencies: list[float] = []
    polls = [0]
    done = threading.Event()

    def consume() -> None:
        while len(latencies) < n and not done.is_set():
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            polls[0] += 1
            key = msg.key()
            seen[key] = seen.get(key, 0) + 1
            if seen[key] == topics:
                latencies.append(time.perf_counter() - float(msg.value()[:20]))

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    payload = b"x" * RECORD_BYTES
    requests0 = counted.requests()
    c0, b0, j0 = _cpu_s(os.getpid()), _cpu_s(broker_pid), jit_cpu_s(broker_pid) or 0.0
    start = time.perf_counter()
    for i in range(n):
        while (left := start + (i - i % burst) / rate - time.perf_counter()) > 0:
            time.sleep(left)
        value, key = f"{time.perf_counter():20.6f}".encode() + payload, str(i).encode()
        for topic in names:
            producer.produce(topic, value, key=key)
        producer.poll(0)
    producer.flush(10)
    reader.join(15)
    done.set()
    c1, b1, j1 = _cpu_s(os.getpid()), _cpu_s(broker_pid), jit_cpu_s(broker_pid) or 0.0
    requests = counted.requests() - requests0
    consumer.close()
    admin.delete_topics(names)
    return OpenLoopRun(n, latencies, (b1 - b0) - (j1 - j0), c1 - c0, requests, polls[0])


def crossing(settings: Settings, broker_pid: int, rate: float, seconds: float,
             producer_extra: dict[str, Any], consumer_extra: dict[str, Any], burst: int = 1) -> dict[str, Any]:
    """One open-loop run of ``rate`` records/s over a fresh one-partition topic, ``burst``
    records back to back at a time."""
    run = open_loop(settings, broker_pid, "crossing", 1, rate, seconds, producer_extra, consumer_extra, burst)
    return {
        "rate": rate, "records": run.sent, "received": len(run.latencies),
        "broker_cpu_us_per_record": run.per_message_us(run.broker_cpu_s),
        "clients_cpu_us_per_record": run.per_message_us(run.clients_cpu_s),
        "records_per_produce_request": round(run.sent / run.produce_requests, 2) if run.produce_requests > 0 else None,
        "p50_ms": run.p50_ms(),
    }


def fan_out(settings: Settings, broker_pid: int, rate: float, seconds: float, models: int = FAN_OUT,
            grouped: bool = False) -> dict[str, Any]:
    """An ensemble query's requests, open loop at ``rate`` queries/s: ``models`` records for as
    many topics produced back to back (one per model), or one record that names them all
    (``grouped``, what the selector sends, docs/design/0082). Per query: the broker's and the
    clients' CPU, the produce requests (librdkafka sends each partition's records in requests
    of their own), the polls that brought records, and the p50 until its last record was read."""
    topics = 1 if grouped else models
    run = open_loop(settings, broker_pid, "fanout", topics, rate, seconds)
    return {"models": models, "grouped": grouped, "topics": topics, "rate": rate, "queries": run.sent,
            "received": len(run.latencies), "linger_ms": 0,
            "produce_requests_per_fan_out": round(run.produce_requests / run.sent, 2),
            "broker_cpu_us_per_fan_out": run.per_message_us(run.broker_cpu_s),
            "clients_cpu_us_per_fan_out": run.per_message_us(run.clients_cpu_s),
            "polls_per_fan_out": round(run.polls / max(1, len(run.latencies)), 2),
            "p50_ms": run.p50_ms()}


def plot(rows: list[dict[str, Any]], out_dir: Path) -> None:
    fig, axes = figure(size=(7, 4))
    ax = axes[0][0]
    for name in [*VARIANTS, *BURSTS]:
        mine = [r for r in rows if r["variant"] == name]
        ax.plot([r["rate"] for r in mine], [r["broker_cpu_us_per_record"] for r in mine], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("records/s")
    ax.set_ylabel("broker CPU per record crossing (µs)")
    ax.set_title("One Kafka crossing, single broker")
    ax.legend(fontsize=8)
    save_figure(fig, "crossing", out_dir)


def main(argv: list[str] | None = None, out_dir: Path = OUT) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (noisier)")
    args = ap.parse_args(argv)
    seconds = 4.0 if args.quick else 8.0
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-crossing-") as tmp:
        infra = Settings(state_dir=Path(tmp) / "infra")
        say("crossing: starting a single Kafka broker (and Redis) on free ports")
        status = launcher.up(infra, free_ports=True, progress=lambda _: None, die_with_parent=True, brokers=1)
        try:
            settings = Settings(kafka_bootstrap=status.kafka_bootstrap, redis_url=status.redis_url)
            assert status.kafka_pid is not None
            for _ in range(3):  # the broker's JIT and heap warm up
                crossing(settings, status.kafka_pid, 1000.0, seconds, {}, {})
            idle = idle_cores(status.kafka_pid)
            say(f"  the broker idles at {idle:.3f} of a core (in each row's figure, spread over its records)")
            for rate in RATES:  # variants side by side at each rate, so a drift does not favour one
                runs = [(name, prod, cons, 1) for name, (prod, cons) in VARIANTS.items()]
                runs += [(name, {}, {}, burst) for name, burst in BURSTS.items()]
                for name, prod, cons, burst in runs:
                    row = {"variant": name, **crossing(settings, status.kafka_pid, rate, seconds, prod, cons, burst)}
                    rows.append(row)
                    say(f"  {name:24s} {rate:6.0f}/s: broker {row['broker_cpu_us_per_record']:6.0f} µs, clients "
                        f"{row['clients_cpu_us_per_record']:6.0f} µs per record; {row['records_per_produce_request']} "
                        f"records per produce request; p50 {row['p50_ms']} ms")
            fans = [fan_out(settings, status.kafka_pid, FAN_OUT_RATE, seconds, grouped=g)
                    for g in (False, True, True, False)]  # ABBA: a drift does not favour one
            for f in fans:
                say(f"  an ensemble's {f['models']} requests as {f['topics']} record(s) at {f['rate']:g}/s: "
                    f"broker {f['broker_cpu_us_per_fan_out']:,.0f} + clients {f['clients_cpu_us_per_fan_out']:,.0f} µs, "
                    f"{f['produce_requests_per_fan_out']} produce requests, {f['polls_per_fan_out']} polls; "
                    f"p50 {f['p50_ms']} ms")
        finally:
            launcher.down(infra)
    base = {r["rate"]: r for r in rows if r["variant"] == "stages' settings"}
    floor = {f"{rate:g}": round(CROSSINGS_PER_QUERY * r["broker_cpu_us_per_record"], 1) for rate, r in base.items()}
    say(f"crossing: {CROSSINGS_PER_QUERY} crossings per query cost the broker alone {floor} µs per query")
    report = {"machine": machine_info(), "seconds": seconds, "broker_idle_cores": round(idle, 4), "record_bytes": RECORD_BYTES,
              "crossings_per_query": CROSSINGS_PER_QUERY, "broker_floor_us_per_query": floor, "rows": rows,
              "fan_out": fans}
    write_json("crossing", report, out_dir)
    plot(rows, out_dir)
    return report


if __name__ == "__main__":
    main()
