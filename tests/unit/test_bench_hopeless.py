"""bench.hopeless's reading of the stages' counters: every stage and label summed, no broker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from bench import hopeless


def test_counters_are_summed_over_stages_and_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = {}
    for stage, (m1, m2) in {"selector-1": (3, 2), "batcher": (0, 0)}.items():
        registry = CollectorRegistry()
        asked = Counter("clipstream_selector_not_asked", "x", ["app", "model"], registry=registry)
        expired = Counter("clipstream_batcher_expired", "x", ["model"], registry=registry)
        asked.labels("a", "m1").inc(m1)
        asked.labels("a", "m2").inc(m2)
        expired.labels("m1").inc(5 if stage == "batcher" else 0)
        texts[f"http://{stage}/metrics"] = generate_latest(registry).decode()
    monkeypatch.setattr(hopeless.httpx, "get", lambda url, timeout: SimpleNamespace(text=texts[url]))
    assert hopeless.counters(list(texts)) == {"not_asked": 5.0, "expired": 5.0}


def test_only_the_stages_metric_urls_are_read_from_ups_lines() -> None:
    pipe = SimpleNamespace(lines=["metrics: selector-1 http://127.0.0.1:1/metrics",
                                  "metrics: targets for Prometheus (file_sd) in /tmp/targets.json", "ready: x"])
    assert hopeless.metric_urls(pipe) == ["http://127.0.0.1:1/metrics"]  # type: ignore[arg-type]


def test_the_overload_rate_is_a_multiple_of_the_highest_rate_kept_up_with() -> None:
    # 400 kept up with (0.95 of it answered in time), 500 not: the search stopped there
    assert hopeless.overload_rate([(300.0, 299.0), (400.0, 381.0), (500.0, 430.0)], 1.5) == (400.0, 600.0)
    # a pipeline that kept up with nothing: its goodput at the lowest step is the capacity
    assert hopeless.overload_rate([(200.0, 120.0)], 1.5) == (120.0, 180.0)
    assert not hopeless.kept_up(400.0, 379.0) and hopeless.kept_up(400.0, 380.0)
