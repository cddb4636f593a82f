"""What acks=all with idempotence costs a record's acknowledgement, on one broker and on a
3-broker cluster (replication factor 3, min.insync.replicas 2), against acks=1.

Each record is sent alone and its delivery report awaited before the next, so a reading is one
record's produce-to-ack time as a stage sees it. The settings alternate in rounds, so that load
from elsewhere on the machine lands on both alike. Report: ``out/bench/acks.json``.

    python -m bench.acks [--records 2000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import say, write_json

SETTINGS = {
    "acks=1": {"acks": 1, "enable.idempotence": False},
    "acks=all, idempotent (default)": {},
}


def _ack_times_ms(producer: Any, topic: str, n: int) -> list[float]:
    times: list[float] = []
    for i in range(n):
        done: list[float] = []
        t0 = time.perf_counter()
        producer.produce(topic, b"x" * 100, key=str(i).encode(),
                         on_delivery=lambda err, _msg: done.append(time.perf_counter()) if err is None else None)
        while not done:
            producer.poll(0.05)
        times.append((done[0] - t0) * 1000)
    return times


def measure(brokers: int, records: int, rounds: int) -> dict[str, Any]:
    from confluent_kafka import Producer

    from clipstream.infra import launcher
    from clipstream.settings import Settings
    from topics.admin import ensure_core_topics
    from topics.catalogue import Catalogue
    from topics.client import producer_config

    with tempfile.TemporaryDirectory() as state:
        infra = Settings(state_dir=Path(state))
        try:
            status = launcher.up(infra, free_ports=True, progress=lambda _: None, timeout_s=180, brokers=brokers)
            settings = Settings(kafka_bootstrap=status.kafka_bootstrap, topic_prefix=f"acks{uuid.uuid4().hex[:6]}.")
            ensure_core_topics(settings)
            topic = Catalogue.from_settings(settings).queries.name
            producers = {name: Producer(producer_config(settings, **conf)) for name, conf in SETTINGS.items()}
            for producer in producers.values():
                _ack_times_ms(producer, topic, 200)  # connections, metadata, producer ids
            readings: dict[str, list[float]] = {name: [] for name in SETTINGS}
            for _ in range(rounds):
                for name, producer in producers.items():
                    readings[name] += _ack_times_ms(producer, topic, records // rounds)
            del producers  # the handles go before their brokers do
        finally:
            launcher.down(infra)
    result = {}
    for name, times in readings.items():
        p50, p99 = np.percentile(times, [50, 99])
        result[name] = {"p50_ms": round(float(p50), 3), "p99_ms": round(float(p99), 3), "n": len(times)}
        say(f"{brokers} broker(s), {name}: ack p50 {p50:.2f} ms, p99 {p99:.2f} ms ({len(times)} records)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000, help="records per setting and cluster size")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the settings")
    args = parser.parse_args()
    report = {f"{b} broker(s)": measure(b, args.records, args.rounds) for b in (1, 3)}
    write_json("acks", {"records": args.records, "rounds": args.rounds, "results": report})


if __name__ == "__main__":
    main()
