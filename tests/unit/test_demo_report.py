"""The demo report's read of the selectors' counters, from real /metrics endpoints."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from clipstream.demo.report import selector_total
from clipstream.metrics_targets import free_port, stage_kind

NOT_ASKED = "clipstream_selector_not_asked_total"
Serve = Callable[[dict[str, float]], int]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start a /metrics server per counter value given; yields the ports, stops them after."""
    servers = []

    def start(not_asked: dict[str, float]) -> int:
        registry = CollectorRegistry()
        counter = Counter("clipstream_selector_not_asked", "x", ["app", "model"], registry=registry)
        for model, n in not_asked.items():
            counter.labels("digits", model).inc(n)
        port = free_port()
        servers.append(start_http_server(port, addr="127.0.0.1", registry=registry))
        return port

    yield start
    for server, thread in servers:
        server.shutdown()
        thread.join(5)


def _targets(path: Path, stages: dict[str, int]) -> str:
    groups = [{"targets": [f"127.0.0.1:{port}"], "labels": {"stage": stage_kind(stage), "name": stage}}
              for stage, port in stages.items()]
    path.write_text(json.dumps(groups))
    return str(path)


def test_the_selectors_counts_are_summed_and_other_stages_ignored(tmp_path: Path, serve: Serve) -> None:
    targets = _targets(tmp_path / "t.json", {"selector-1": serve({"knn": 3, "mlp": 2}),
                                             "selector-2": serve({"knn": 4}), "batcher": serve({"knn": 100})})
    assert selector_total(targets, NOT_ASKED) == 9.0


def test_an_unreadable_selector_or_no_targets_give_none(tmp_path: Path, serve: Serve) -> None:
    assert selector_total(None, NOT_ASKED) is None
    assert selector_total(_targets(tmp_path / "none.json", {"batcher": serve({"knn": 1})}), NOT_ASKED) is None
    gone = _targets(tmp_path / "gone.json", {"selector-1": serve({"knn": 1}), "selector-2": free_port()})
    assert selector_total(gone, NOT_ASKED) is None
