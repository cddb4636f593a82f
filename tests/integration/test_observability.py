"""Observability on a running `clipstream up` with API keys on: every stage's /metrics read with
prometheus_client's own parser after known traffic, and the gateway's dashboard drawn by a
real headless Chromium under load (its screenshot: out/test-artifacts/dashboard.png)."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import yaml
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from batchers.cache import cache_key
from clipstream.infra.launcher import pick_free_ports
from clipstream.testing.browser import DRAWN_PANELS, Browser, find_chromium, panel_points_js
from clipstream.testing.models import digits, make_onnx_digits_model
from clipstream.testing.procs import UpProcess, predict_admitted, wait_until
from frontend.client import Client
from schemas import Tensor
from topics.metrics import SEGMENTS

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
KEY = "obs-test-key"
CALLERS, EACH, REPEATS = 16, 25, 20

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def pipeline(infra: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    tmp = tmp_path_factory.mktemp("observability")
    tag = uuid.uuid4().hex[:6]
    app, models = f"obs{tag}", [f"obs{tag}a", f"obs{tag}b"]  # names no other test's cache holds
    for m in models:
        make_onnx_digits_model(tmp / "models", m)
    (tmp / "app.yaml").write_text(yaml.safe_dump({
        "apps": [{"name": app, "policy": "exp4", "slo_ms": 3000, "default_output": -1, "models": models}],
        "models": [{"name": m, "version": "1", "path": f"models/{m}/1", "replicas": 1, "batch_delay_ms": 5}
                   for m in models],
    }))
    port = pick_free_ports(1)[0]
    prefix = f"t{uuid.uuid4().hex[:12]}."
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": prefix, "CLIPSTREAM_STATE_DIR": str(tmp / "state"),
           "PYTHONUNBUFFERED": "1", "CLIPSTREAM_GATEWAY_API_KEYS": KEY, "CLIPSTREAM_UP_WARM_UP_S": "3"}
    up = UpProcess(tmp / "app.yaml", port, env, ROOT)
    client = Client(f"http://127.0.0.1:{port}", app=app, api_key=KEY)
    try:
        up.wait_ready(240)
        yield SimpleNamespace(up=up, port=port, app=app, models=models, client=client, prefix=prefix,
                              url=f"http://127.0.0.1:{port}", state=tmp / "state" / "up" / f"gateway-{port}")
    finally:
        client.close()
        up.stop(90)


def targets(p: SimpleNamespace) -> dict[str, str]:
    """Stage name -> /metrics URL, from the file_sd JSON `up` wrote."""
    groups = json.loads((p.state / "prometheus-targets.json").read_text())
    return {g["labels"]["name"]: f"http://{g['targets'][0]}/metrics" for g in groups}


def scrape(url: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            out[key] = out.get(key, 0.0) + s.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def scrape_kind(p: SimpleNamespace, kind: str) -> Samples:
    """The samples of every stage of one kind, summed (two selector members add up)."""
    out: Samples = {}
    for name, url in targets(p).items():
        if name.split("-", 1)[0].rstrip("s") == kind:
            for key, v in scrape(url).items():
                out[key] = out.get(key, 0.0) + v
    return out


def test_up_prints_a_metrics_line_per_stage_and_the_dashboard(pipeline):
    p = pipeline
    lines = [l for l in p.up.lines if l.startswith("metrics: ") and l.endswith("/metrics")]
    printed = {l.split()[1]: l.split()[2] for l in lines}
    assert printed == targets(p)
    assert {name.split("-", 1)[0] for name in printed} == {"gateway", "selector", "batchers", "worker"}
    assert f"dashboard: {p.url}/dashboard" in p.up.lines
    for name, url in printed.items():  # each answers with the process collector's families
        samples = scrape(url)
        assert total(samples, "process_cpu_seconds_total") > 0, name
        assert total(samples, "process_resident_memory_bytes") > 10e6, name


def test_metrics_after_known_traffic(pipeline):
    p = pipeline
    x, _ = digits()
    before = {k: scrape_kind(p, k) for k in ("gateway", "selector", "batcher")}

    answers: dict[int, dict[str, Any]] = {}

    def caller(k: int) -> None:  # distinct inputs, many callers at once: batches form
        for i in range(EACH):
            answers[k * EACH + i] = predict_admitted(p.client, p.app, x[k * EACH + i].tolist())

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent = CALLERS * EACH
    # repeat inputs both models answered (on a saturated machine some answers are defaults),
    # once the workers have cached them (just after sending the predictions)
    both = [i for i, a in sorted(answers.items()) if sorted(a["models"]["answered"]) == sorted(p.models)]
    assert len(both) >= REPEATS, f"only {len(both)} of {sent} answered by both models"
    repeated = [x[i] for i in both[:REPEATS]]
    cache = redis.Redis.from_url(os.environ["CLIPSTREAM_REDIS_URL"])
    keys = [cache_key(m, "1", Tensor.of(np.asarray(v, np.float32))) for m in p.models for v in repeated]
    wait_until(lambda: cache.exists(*keys) == len(keys), 30, "the workers to fill the cache")
    middle = scrape_kind(p, "batcher")
    for v in repeated:  # the same inputs again, one at a time: each a cache hit for each model
        predict_admitted(p.client, p.app, v.tolist())
    def settled() -> dict[str, Samples] | None:  # a selector counts an answer just after sending it
        now = {k: scrape_kind(p, k) for k in ("gateway", "selector", "batcher")}
        name = "clipstream_selector_answers_total"
        done = total(now["selector"], name, app=p.app) - total(before["selector"], name, app=p.app)
        return now if done >= sent + REPEATS else None

    after = wait_until(settled, 10, "the selectors to count every answer")

    def delta(kind: str, name: str, start: Samples | None = None, **labels: str) -> float:
        old = before[kind] if start is None else start
        return total(after[kind], name, **labels) - total(old, name, **labels)

    # the gateway: every query of the app, answered (a refused one was retried and counted apart)
    answered = (delta("gateway", "clipstream_gateway_answers_total", app=p.app, outcome="prediction")
                + delta("gateway", "clipstream_gateway_answers_total", app=p.app, outcome="default"))
    refused = delta("gateway", "clipstream_gateway_answers_total", app=p.app, outcome="refused")
    assert answered == sent + REPEATS
    assert delta("gateway", "clipstream_gateway_queries_total", app=p.app) == sent + REPEATS + refused
    assert delta("gateway", "clipstream_gateway_query_seconds_count", app=p.app) == sent + REPEATS
    # the selectors: one Response per query, its latency, and its time split by stage
    assert delta("selector", "clipstream_selector_answers_total", app=p.app) == sent + REPEATS
    assert delta("selector", "clipstream_selector_answer_seconds_count", app=p.app) == sent + REPEATS
    for segment, _, _ in SEGMENTS:
        assert delta("selector", "clipstream_stage_latency_seconds_count", segment=segment) > 0, segment
    weights = [total(after["selector"], "clipstream_policy_weight", app=p.app, model=m) for m in p.models]
    members = sum(1 for name in targets(p) if name.startswith("selector-"))
    assert all(w > 0 for w in weights) and abs(sum(weights) - members) < 1e-6, weights  # each member's sum 1
    # the batcher: batches of more than one request under load, the AIMD limit, the cache
    for m in p.models:
        batches = total(middle, "clipstream_batcher_batches_total", model=m) - total(
            before["batcher"], "clipstream_batcher_batches_total", model=m)
        items = total(middle, "clipstream_batcher_batched_requests_total", model=m) - total(
            before["batcher"], "clipstream_batcher_batched_requests_total", model=m)
        assert batches > 0 and items / batches > 1.0, (m, items, batches)
        assert total(after["batcher"], "clipstream_batcher_aimd_limit", model=m, replica="0") >= 1
        hits = delta("batcher", "clipstream_batcher_cache_hits_total", middle, model=m)
        assert hits == REPEATS, (m, hits)
        assert delta("batcher", "clipstream_batcher_cache_misses_total", middle, model=m) == 0
        assert ("clipstream_batcher_queue_depth", (("model", m),)) in after["batcher"]
    worker = scrape_kind(p, "worker")
    for m in p.models:
        assert total(worker, "clipstream_worker_batch_size_count", model=m) > 0
        assert total(worker, "clipstream_worker_device_seconds_sum", model=m) > 0


def test_dead_letters_and_consumer_lag(pipeline):
    p = pipeline
    producer = Producer({"bootstrap.servers": os.environ["CLIPSTREAM_KAFKA_BOOTSTRAP"]})
    producer.produce(f"{p.prefix}queries", b"not a query record")
    assert producer.flush(10) == 0
    wait_until(lambda: total(scrape_kind(p, "selector"), "clipstream_dead_letters_total",
                             stage="selector", reason="undecodable query") == 1, 30,
               "the selector's dead letter to be counted")
    # librdkafka reports each consumer's lag every few seconds
    wait_until(lambda: any(n == "clipstream_consumer_lag_records" and dict(ls)["topic"] == f"{p.prefix}queries"
                           for n, ls in scrape_kind(p, "selector")), 30, "the selectors' consumer lag")
    wait_until(lambda: any(n == "clipstream_consumer_lag_records" for n, _ in scrape_kind(p, "worker")), 30,
               "the workers' consumer lag")


def test_dashboard_draws_every_panel_in_headless_chromium(pipeline):
    p = pipeline
    assert find_chromium(), "no chromium: scripts/system-deps.sh installs Debian's chromium package"
    assert httpx.get(f"{p.url}/dashboard/data").status_code == 401  # the data needs the key
    assert httpx.get(f"{p.url}/dashboard").status_code == 200  # the page and scripts do not
    x, _ = digits()
    stop = threading.Event()

    def load(k: int) -> None:  # under load while the page draws
        i = 0
        while not stop.is_set():
            predict_admitted(p.client, p.app, (x[(k * 97 + i) % len(x)] + np.float32(i % 7)).tolist())
            i += 1

    threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    try:
        with Browser() as browser:
            browser.open(f"{p.url}/dashboard#key={KEY}")
            drawn = browser.wait_for(panel_points_js(DRAWN_PANELS), timeout_s=90)
            browser.wait_for("Number(document.body.dataset.updates) >= 6", timeout_s=30)  # a few seconds drawn
            assert set(drawn) == set(DRAWN_PANELS) and all(n > 0 for n in drawn.values()), drawn
            series = browser.evaluate("document.getElementById('panel-weights').dataset.series")
            assert int(series) == len(p.models)
            assert "API key" not in browser.evaluate("document.getElementById('status').textContent")
            assert KEY not in browser.evaluate("location.href")  # taken out of the address once read
            shot = browser.screenshot(ROOT / "out" / "test-artifacts" / "dashboard.png")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert shot.stat().st_size > 20_000
