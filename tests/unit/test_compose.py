"""docker-compose.yml parses, names Kafka, Redis and one service per stage, and every stage's
command is one the real ``clipstream`` CLI accepts, serving the demo's five models."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from clipstream.cli import main as clipstream_cli
from clipstream.demo.train import MODELS

ROOT = Path(__file__).resolve().parents[2]


def _services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_compose_parses_and_names_its_services():
    services = _services()
    assert {"kafka", "redis", "gateway", "selector", "batcher"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:3.9")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    # every stage runs the same `clipstream` commands a user runs by hand
    for name, svc in services.items():
        if name not in ("kafka", "redis"):
            assert svc["command"][0] == "clipstream", name


def _parse(argv: list[str]) -> click.Context:
    """The sub-command's context as click builds it: unknown options or a missing required one
    raise here, as they would when the container starts."""
    ctx = clipstream_cli.make_context("clipstream", argv[1:2])
    command = clipstream_cli.get_command(ctx, argv[1])
    assert command is not None, f"no such command: {argv[1]}"
    return command.make_context(argv[1], list(argv[2:]))


def test_every_stage_command_parses_and_every_demo_model_is_batched_and_served(tmp_path, monkeypatch):
    # the registry service applies the app file `make demo` writes (mounted at out/demo); the
    # CLI checks that it exists
    (tmp_path / "out" / "demo").mkdir(parents=True)
    (tmp_path / "out" / "demo" / "app.yaml").write_text("apps: []\n")
    monkeypatch.chdir(tmp_path)
    batched: list[str] = []
    served: list[str] = []
    for name, svc in _services().items():
        if name in ("kafka", "redis"):
            continue
        ctx = _parse(svc["command"])
        if svc["command"][1] == "batcher":
            batched += ctx.params["model_names"]
        elif svc["command"][1] == "worker":
            served.append(ctx.params["name"])
    assert sorted(batched) == sorted(MODELS)
    assert sorted(served) == sorted(MODELS)
