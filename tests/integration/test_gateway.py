"""The REST gateway as a real process against real Kafka and Redis, the test playing the selector.

``FakeSelector`` reads ``queries`` and answers each QueryEvent on its reply topic and partition
(or on ``responses`` when it has none), or stays silent, or answers late, chosen by the query's
context. The full pipeline (real selector, batchers, workers) is tested elsewhere; here every
REST contract of the gateway is checked end to end over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from clipstream.clock import now_us
from clipstream.redisclient import stored_predictions_key
from clipstream.settings import Settings
from frontend.client import Client
from frontend.gateway_kafka import KafkaBus, watermarks
from frontend.producer import Producer as QueryProducer
from frontend.producer import ResponseReader
from registry.outputs import stored_answer
from registry.topic import RegistryWriter
from schemas import Feedback, QueryEvent, Response, Tensor, decode_as, encode
from clipstream.testing.procs import predict_admitted, stop_process, wait_until
from topics import Catalogue, TopicSpec, consumer_config, producer_config
from topics.admin import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.component]  # the test plays a neighbouring stage

GOOD = [[1, 2, 3], [4, 5, 6]]
APP_SLO_MS = 40.0
MODEL_YAML = """backend: python
class: nowhere:Model
input: {dtype: float32, shape: [2, 3]}
output: {kind: class_scores, labels: [cat, dog]}
"""


class FakeSelector:
    """Answers queries by context: ``silent`` never, ``late`` 80 ms past the deadline, else at once."""

    def __init__(self, settings: Settings) -> None:
        cat = Catalogue.from_settings(settings)
        self.responses_topic = cat.responses.name
        self.seen: list[tuple[QueryEvent, bytes]] = []
        self._consumer = Consumer(consumer_config(settings, f"fake-sel-{uuid.uuid4().hex}"))
        parts = []
        for p in range(cat.queries.partitions):
            _, high = watermarks(self._consumer, TopicPartition(cat.queries.name, p))
            parts.append(TopicPartition(cat.queries.name, p, high))
        self._consumer.assign(parts)
        self._producer = Producer(producer_config(settings))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0)
            msg = self._consumer.poll(0.02)
            if msg is None or msg.error():
                continue
            event = decode_as(QueryEvent, msg.value())
            self.seen.append((event, msg.key()))
            if event.context == "silent":
                continue
            delay = 0.0
            if event.context == "late":
                delay = max(0.0, (event.deadline_us / 1e6 - time.time())) + 0.08
            threading.Timer(delay, self._reply, (event,)).start()

    def _reply(self, event: QueryEvent) -> None:
        x = event.input.array()
        record = Response(
            query_id=event.query_id, app=event.app,
            output="dog" if float(x.sum()) > 10 else "cat", scores=[0.25, 0.75],
            labels=["cat", "dog"], confidence=0.5, is_default=False,
            default_reason=None, answered=["m1"], missing=["m2"],
            created_us=event.created_us, deadline_us=event.deadline_us,
            trace=dict(event.trace),
        )
        topic = event.reply_topic or self.responses_topic
        kwargs = {} if event.reply_partition is None else {"partition": event.reply_partition}
        self._producer.produce(topic, value=encode(record), key=event.query_id.encode(), **kwargs)
        self._producer.poll(0)

    def event_of(self, query_id: str) -> tuple[QueryEvent, bytes]:
        return next((e, k) for e, k in self.seen if e.query_id == query_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._producer.flush(5)
        self._consumer.close()


class GatewayProcess:
    """``clipstream gateway --port 0`` in a subprocess; the URL comes from its ready line."""

    def __init__(self, settings: Settings, log: Path, **gateway_env: str) -> None:
        env = dict(os.environ)
        env.update({"CLIPSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
                    "CLIPSTREAM_REDIS_URL": settings.redis_url,
                    "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix})
        env.update({f"CLIPSTREAM_GATEWAY_{k.upper()}": v for k, v in gateway_env.items()})
        self.instance = gateway_env.get("instance", "")
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "clipstream.cli", "gateway", "--port", "0"],
            stdout=subprocess.PIPE, stderr=self._log, env=env, text=True,
        )
        self.url = self._wait_ready(log, timeout_s=60)

    def _wait_ready(self, log: Path, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("ready: gateway "):
                    return line.split()[-1]
            if self.proc.poll() is not None:
                break
        self.stop()
        raise AssertionError(f"gateway did not start:\n{log.read_text()[-3000:]}")

    def metric(self, name: str) -> float:
        for line in httpx.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self) -> None:
        stop_process(self.proc, 15)
        self._log.close()



@pytest.fixture(scope="module")
def gw_settings(infra: Any) -> Settings:
    return Settings(kafka_bootstrap=infra.kafka_bootstrap, redis_url=infra.redis_url,
                    topic_prefix=f"t{uuid.uuid4().hex[:12]}.")


@pytest.fixture(scope="module")
def selector(gw_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeSelector]:
    folder = tmp_path_factory.mktemp("m1")
    (folder / "model.yaml").write_text(MODEL_YAML)
    with RegistryWriter(gw_settings) as writer:  # creates the core topics too
        writer.model("m1", "1", folder)
        writer.app("pets", policy="exp4", slo_ms=APP_SLO_MS, default_output="unknown")
        writer.link("pets", "m1")
    fake = FakeSelector(gw_settings)
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def gateway(gw_settings: Settings, selector: FakeSelector, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(gw_settings, tmp_path_factory.mktemp("gw") / "gw.log", instance="gwa")
    yield gw
    gw.stop()


def test_predict_returns_the_selectors_answer(gateway: GatewayProcess, selector: FakeSelector, gw_settings):
    with Client(gateway.url) as client:
        got = predict_admitted(client, "pets", GOOD, context="user-42")
    assert got["output"] == "dog" and got["scores"] == [0.25, 0.75] and got["confidence"] == 0.5
    assert got["default"] is False and got["models"] == {"answered": ["m1"], "missing": ["m2"]}
    assert 0 < got["latency_ms"] < APP_SLO_MS + 20
    event, key = selector.event_of(got["query_id"])
    assert key == b"user-42" and event.app == "pets" and event.context == "user-42"
    assert event.deadline_us - event.created_us == int(APP_SLO_MS * 1000)
    assert event.trace["produced"] == event.created_us
    assert event.reply_topic == Catalogue.from_settings(gw_settings).replies("gwa").name
    assert event.input.array().dtype.name == "float32"


def test_default_within_slo_plus_20ms_when_nothing_answers(gateway: GatewayProcess):
    slo = 50.0
    walls, served = [], []
    with httpx.Client(base_url=gateway.url) as http:
        for _ in range(5):
            t0 = time.perf_counter()
            r = http.post("/v1/apps/pets/predict", json={"input": GOOD, "context": "silent", "slo_ms": slo})
            walls.append((time.perf_counter() - t0) * 1000)
            body = r.json()
            assert r.status_code == 200 and body["default"] is True and body["output"] == "unknown"
            assert body["confidence"] == 0.0 and body["models"]["answered"] == []
            served.append(body["latency_ms"])
    assert max(served) <= slo + 20, served
    assert sorted(walls)[len(walls) // 2] <= slo + 20, walls  # what the caller waited, HTTP included


def test_late_responses_are_discarded_and_counted(gateway: GatewayProcess):
    count, quick = "clipstream_gateway_late_response_seconds_count", 'clipstream_gateway_late_response_seconds_bucket{le="0.05"}'
    before, before_count, before_quick = (gateway.metric(m) for m in ("clipstream_gateway_late_responses_total", count, quick))
    got = predict_admitted(Client(gateway.url), "pets", GOOD, context="late", slo_ms=30)
    assert got["default"] is True
    wait_until(lambda: gateway.metric("clipstream_gateway_late_responses_total") >= before + 1)
    # the fake selector replied 80 ms past the deadline: timed in the histogram, above its 50 ms bucket
    assert gateway.metric(count) - before_count > gateway.metric(quick) - before_quick


def test_error_statuses(gateway: GatewayProcess):
    with httpx.Client(base_url=gateway.url) as http:
        assert http.post("/v1/apps/nope/predict", json={"input": GOOD}).status_code == 404
        r = http.post("/v1/apps/pets/predict", json={"input": [[1, 2, 3]]})
        assert r.status_code == 422 and "shape [2, 3]" in r.json()["detail"]
        r = http.post("/v1/apps/pets/predict", json={"input": [[1, 2, "3"], [4, 5, 6]]})
        assert r.status_code == 422 and "string" in r.json()["detail"]
        assert http.post("/v1/apps/pets/predict", content=b"{nope").status_code == 422
        big = json.dumps({"input": GOOD, "pad": "x" * (1 << 20)})
        assert http.post("/v1/apps/pets/predict", content=big).status_code == 413
        assert http.post("/v1/apps/pets/feedback", json={"query_id": "q"}).status_code == 422
        assert http.get("/healthz").status_code == 200
        r = http.get("/readyz")
        assert r.status_code == 200 and r.json()["checks"] == {"registry": True, "kafka": True, "redis": True}
        assert "clipstream_gateway_requests_total" in http.get("/metrics").text
        assert "/v1/apps/{app}/predict" in http.get("/openapi.json").json()["paths"]


def test_feedback_lands_on_the_feedback_topic(gateway: GatewayProcess, gw_settings: Settings):
    topic = Catalogue.from_settings(gw_settings).feedback.name
    consumer = Consumer(consumer_config(gw_settings, f"fb-{uuid.uuid4().hex}"))
    try:
        parts = []
        for p in range(gw_settings.selector_partitions):
            _, high = watermarks(consumer, TopicPartition(topic, p))
            parts.append(TopicPartition(topic, p, high))
        consumer.assign(parts)
        with Client(gateway.url) as client:
            qid = predict_admitted(client, "pets", GOOD)["query_id"]
            client.feedback(qid, "cat")  # app remembered from predict
        r = httpx.post(f"{gateway.url}/v1/apps/pets/feedback", json={"query_id": "q-r", "reward": 0.25})
        assert r.status_code == 202
        got = {}
        deadline = time.monotonic() + 15
        while len(got) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                record = decode_as(Feedback, msg.value())
                got[record.query_id] = record
        assert got[qid].label == "cat" and got[qid].app == "pets" and got[qid].reward is None
        assert got["q-r"].reward == 0.25 and got["q-r"].label is None
    finally:
        consumer.close()


def test_feedback_for_another_apps_stored_query_is_refused(gateway: GatewayProcess, gw_settings: Settings,
                                                           redis_client: Any) -> None:
    """The stored predictions (real Redis, as the selector writes them) say whose query it was:
    a caller of pets cannot teach another app, and is not told which one it was."""
    qid = f"q-other-{uuid.uuid4().hex}"
    record = stored_answer("secret-app", None, {"value": "dog"}, {"m1": {"value": "dog"}})
    redis_client.set(stored_predictions_key(qid), json.dumps(record), ex=60)
    r = httpx.post(f"{gateway.url}/v1/apps/pets/feedback", json={"query_id": qid, "label": "dog"})
    assert r.status_code == 409 and "another app, not 'pets'" in r.json()["detail"], r.text
    assert "secret-app" not in r.text
    redis_client.set(stored_predictions_key(qid), json.dumps(stored_answer("pets", None, {"value": "dog"}, {})), ex=60)
    r = httpx.post(f"{gateway.url}/v1/apps/pets/feedback", json={"query_id": qid, "label": "dog"})
    assert r.status_code == 202 and r.json() == {"accepted": True, "query_id": qid}


def test_two_instances_each_get_only_their_own_replies(gateway, selector, gw_settings, tmp_path):
    other = GatewayProcess(gw_settings, tmp_path / "gwb.log", instance="gwb")
    try:
        urls = [gateway.url, other.url] * 10
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda u: predict_admitted(Client(u), "pets", GOOD, slo_ms=500), urls))
        assert all(a["default"] is False and a["output"] == "dog" for a in answers)
        cat = Catalogue.from_settings(gw_settings)
        topics = {selector.event_of(a["query_id"])[0].reply_topic for a in answers}
        assert topics == {cat.replies("gwa").name, cat.replies("gwb").name}
        # a reply routed to the wrong instance would show up there as late/unknown
        assert other.metric("clipstream_gateway_late_responses_total") == 0
    finally:
        other.stop()


def test_api_keys_and_overload(gw_settings: Settings, selector: FakeSelector, tmp_path: Path):
    gw = GatewayProcess(gw_settings, tmp_path / "keyed.log", instance="gwk", api_keys="k1,k2",
                        max_inflight="2", retry_after_s="3")
    try:
        url, body = f"{gw.url}/v1/apps/pets/predict", {"input": GOOD}
        assert httpx.post(url, json=body).status_code == 401
        assert httpx.post(url, json=body, headers={"X-API-Key": "k2"}).status_code == 200
        assert predict_admitted(Client(gw.url, api_key="k1"), "pets", GOOD)["output"] == "dog"
        assert httpx.get(f"{gw.url}/healthz").status_code == 200
        slow = {"input": GOOD, "context": "silent", "slo_ms": 400}
        with ThreadPoolExecutor(6) as pool:
            rs = list(pool.map(lambda _: httpx.post(url, json=slow, headers={"X-API-Key": "k1"}, timeout=5), range(6)))
        codes = sorted(r.status_code for r in rs)
        assert codes.count(200) >= 1 and codes.count(503) >= 1, codes
        assert all(r.headers["retry-after"] == "3" for r in rs if r.status_code == 503)
    finally:
        gw.stop()


def test_producer_and_response_reader(gateway: GatewayProcess, selector: FakeSelector, gw_settings: Settings):
    delivered: list[tuple[str, Any]] = []
    with ResponseReader(gw_settings) as reader, QueryProducer(settings=gw_settings) as producer:
        ids = [producer.send_query("pets", GOOD, context=f"p{i}", on_delivery=lambda q, e: delivered.append((q, e)))
               for i in range(3)]
        producer.send_feedback("pets", ids[0], label="dog")
        producer.flush()
        got = reader.collect(ids, timeout_s=15)
    assert set(got) == set(ids) and all(isinstance(r, Response) and r.output == "dog" for r in got.values())
    assert sorted(q for q, e in delivered if e is None) == sorted(ids)
    event, key = selector.event_of(ids[0])
    assert event.reply_topic is None and key == b"p0"
    assert event.deadline_us - event.created_us == int(APP_SLO_MS * 1000)  # the app's SLO


def test_a_query_the_broker_refuses_is_counted_with_no_thread_serving_reports(gw_settings: Settings):
    """The loop serves the queries' delivery reports (docs/design/0050): a query the broker
    takes wakes no thread, and one it refuses is still counted as a delivery error."""
    small = TopicSpec(f"{gw_settings.topic_prefix}small-{uuid.uuid4().hex[:8]}", 1, {"max.message.bytes": "256"})
    ensure_topics(gw_settings, [small])
    bus = KafkaBus(gw_settings, f"t{uuid.uuid4().hex[:8]}")
    query = QueryEvent(query_id="q-big", app="pets", context=None, input=Tensor.of(np.zeros(256, np.float32)),
                       created_us=now_us(), deadline_us=now_us() + 5_000_000)

    async def run() -> tuple[int, list[str]]:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, bus.start, loop)
        errors: list[int] = []
        bus.on_delivery_error = lambda: errors.append(1)
        try:
            bus.publish_query(query, b"q-ok")  # the real queries topic takes it
            bus.queries_topic = small.name  # a record over this topic's limit is refused
            bus.publish_query(query, b"q-big")
            deadline = time.monotonic() + 10
            # every report served: nothing is left that could count the refusal a second time
            while (not errors or bus._producer.pending()) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert bus._producer.pending() == 0, "the loop did not serve both queries' reports"
            return len(errors), [t.name for t in threading.enumerate()]
        finally:
            bus.close(delete_reply_topic=True)

    errors, threads = asyncio.run(run())
    assert errors == 1, "the refused query was not counted"
    assert "gateway-poll" not in threads, "a thread still serves the queries' reports"
