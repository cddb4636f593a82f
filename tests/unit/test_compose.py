"""docker-compose.yml parses and names Kafka, Redis and one service per stage."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_parses_and_names_its_services():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka", "redis", "gateway", "selector"} <= set(services)
    assert any(name.startswith("batcher") for name in services)
    assert any(name.startswith("worker") for name in services)
    assert services["kafka"]["image"].startswith("apache/kafka:3.9")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    # every stage runs the same `clipstream` commands a user runs by hand
    for name, svc in services.items():
        if name not in ("kafka", "redis"):
            assert svc["command"][0] == "clipstream", name
