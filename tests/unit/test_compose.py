"""docker-compose.yml parses, names Kafka, Redis and one service per stage, and every stage's
command is one the real ``clipstream`` CLI accepts, serving the demo's five models as its group."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from clipstream.cli import main as clipstream_cli
from clipstream.demo.train import GROUP

ROOT = Path(__file__).resolve().parents[2]
# services that are not a clipstream stage
INFRA = ("kafka", "redis", "prometheus", "grafana")


def _services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_compose_parses_and_names_its_services():
    services = _services()
    assert {"kafka", "redis", "gateway", "selector", "batcher"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:3.9")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    # every stage runs the same `clipstream` commands a user runs by hand
    for name, svc in services.items():
        if name not in INFRA:
            assert svc["command"][0] == "clipstream", name


def _parse(argv: list[str]) -> click.Context:
    """The sub-command's context as click builds it: unknown options or a missing required one
    raise here, as they would when the container starts."""
    ctx = clipstream_cli.make_context("clipstream", argv[1:2])
    command = clipstream_cli.get_command(ctx, argv[1])
    assert command is not None, f"no such command: {argv[1]}"
    return command.make_context(argv[1], list(argv[2:]))


def test_every_stage_command_parses_and_the_demos_group_is_batched_and_served(tmp_path, monkeypatch):
    # the registry service applies the app file `make demo` writes (mounted at out/demo); the
    # CLI checks that it exists
    (tmp_path / "out" / "demo").mkdir(parents=True)
    (tmp_path / "out" / "demo" / "app.yaml").write_text("apps: []\n")
    monkeypatch.chdir(tmp_path)
    batched: list[str] = []
    served: list[str] = []
    for name, svc in _services().items():
        if name in INFRA:
            continue
        ctx = _parse(svc["command"])
        if svc["command"][1] == "batcher":
            batched += ctx.params["model_names"]
        elif svc["command"][1] == "worker":
            served.append(ctx.params["name"])
    assert batched == [GROUP] and served == [GROUP]  # the five models, served as one (docs/design/0088)


def test_kafka_and_redis_are_not_published_and_the_gateway_only_on_loopback():
    services = _services()
    assert "ports" not in services["kafka"] and "ports" not in services["redis"]
    assert "--requirepass" in services["redis"]["command"]
    assert all(p.startswith("127.0.0.1:") for p in services["gateway"]["ports"])
    for name, svc in services.items():
        if name not in INFRA:
            assert svc["environment"]["CLIPSTREAM_REDIS_PASSWORD"], name
    for name in ("prometheus", "grafana"):  # reachable from the host's loopback only
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), name


def _families() -> set[str]:
    """Every metric family name the stages expose (as Prometheus sees it: counters with _total)."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from batchers.metrics import batcher_registry
    from frontend.gateway import create_app
    from selector.metrics import SelectorMetrics
    from topics.metrics import PROCESS
    from workers.metrics import WorkerMetrics

    app = create_app()
    replica = {"replica": 0, "max_batch_size": 1, "in_flight": 0, "batches": 0, "items": 0, "suspect": False}
    svc = SimpleNamespace(counts={"requests": 0, "cached": 0, "expired": 0},
                          core=SimpleNamespace(queue=[], dispatcher=SimpleNamespace(stats=lambda: [replica])))
    registries: list[CollectorRegistry] = [
        app.state.gateway.metrics.registry, SelectorMetrics().registry, batcher_registry(lambda: {"m": svc}),
        WorkerMetrics("m", 0, "1").registry, PROCESS]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
            names.update(family.name + suffix for suffix in suffixes)
            names.update(s.name for s in family.samples)
    return names


def test_prometheus_and_grafana_are_provisioned_with_every_panel_on_real_families():
    import json
    import re

    services = _services()
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["file_sd_configs"][0]["files"]
    targets = json.loads((ROOT / "deploy" / "prometheus" / "targets.json").read_text())
    scraped = {t.split(":")[0] for group in targets for t in group["targets"]}
    stages = {name for name in services if name not in INFRA and name != "registry"}
    assert scraped == stages  # every long-running stage, on the port compose gives it
    assert all(t.endswith(":9100") for group in targets for t in group["targets"])
    for mount in services["grafana"]["volumes"]:
        assert (ROOT / mount.split(":")[0]).exists(), mount
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "clipstream.json").read_text())
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for panel in ("throughput", "p99", "outcome", "batch size", "queue depth", "cache hit", "weights",
                  "stage", "stragglers", "dead letters", "device busy"):
        assert panel in titles, panel
    known = _families()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\b((?:clipstream|process)_[a-z_]+)", target["expr"]):
                assert name in known, (panel["title"], name)
