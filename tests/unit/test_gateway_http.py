"""The gateway's HTTP layer with an injected registry and a fake bus: no broker, no Redis.

Covers what does not depend on Kafka: 401/404/413/422, the QueryEvent the gateway builds,
the mapping of a reply to JSON, the default at the deadline, feedback, metrics and OpenAPI.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from clipstream.clock import now_us
from clipstream.errors import InfraError, InputError
from clipstream.settings import Settings
from frontend.gateway import create_app
from frontend.gateway_http import fast_route
from frontend.http_protocol import RECEIVED_US, stamped_protocol
from frontend.gateway_kafka import KafkaBus
from frontend.settings import GatewaySettings
from registry.spec import ModelSpec, OutputSpec, TensorSpec
from registry.topic import AppConfig, ModelConfig, RegistryView
from schemas import Feedback, ModelRequest, Prediction, QueryEvent, Response, Tensor

SPEC = ModelSpec(Path("/m"), "python", TensorSpec("float32", (2, 3)),
                 OutputSpec("class_scores", ("cat", "dog")), cls="x:Y")
GOOD = [[1, 2, 3], [4, 5, 6]]


class FakeRegistry:
    def __init__(self, ready: bool = True) -> None:
        self.ready = ready
        big = ModelSpec(Path("/b"), "python", TensorSpec("float32", (200, 100)),
                        OutputSpec("regression"), cls="x:Y")
        self._view = RegistryView(
            apps={"pets": AppConfig("pets", "exp4", 30.0, "unknown", {}, ("m1",)),
                  "big": AppConfig("big", "single", 30.0, 0.0, {}, ("m2",))},
            models={"m1": ModelConfig("m1", "1", Path("/m"), spec=SPEC),
                    "m2": ModelConfig("m2", "1", Path("/b"), spec=big)},
        )

    def view(self) -> RegistryView:
        return self._view

    def wait_ready(self, timeout_s: float = 30.0) -> RegistryView:
        if not self.ready:
            raise InfraError("not read yet")
        return self._view


class FakeBus:
    """Records what the gateway publishes; answers with ``reply(event)`` (``after_ms`` later) or never."""

    reply_topic = "t.replies.unit"

    def __init__(self, reply: Any = None, after_ms: float = 0.0, predict: Any = None) -> None:
        self.reply = reply
        self.after_ms = after_ms
        self.predict = predict or regression_of(1.5)  # a one-model app's model, asked straight
        self.queries: list[tuple[QueryEvent, bytes]] = []
        self.requests: list[ModelRequest] = []
        self.topics: set[str] = set()
        self.feedback: list[tuple[Feedback, bytes]] = []
        self.on_late = lambda late_by_us: None
        self.on_delivery_error = lambda: None

    def publish_query(self, event: QueryEvent, key: bytes) -> asyncio.Future:
        self.queries.append((event, key))
        fut = asyncio.get_running_loop().create_future()
        if self.reply is not None and self.after_ms:
            asyncio.get_running_loop().call_later(self.after_ms / 1000, fut.set_result, self.reply(event))
        elif self.reply is not None:
            fut.set_result(self.reply(event))
        return fut

    def publish_request(self, request: ModelRequest) -> asyncio.Future:
        assert request.model in self.topics, "the gateway makes sure of the topic first"
        self.requests.append(request)
        fut = asyncio.get_running_loop().create_future()
        if self.predict is not None:
            fut.set_result(self.predict(request))
        return fut

    def request_topic(self, model: str) -> str | None:
        return f"t.requests.{model}" if model in self.topics else None

    def ensure_request_topic(self, model: str) -> None:
        self.topics.add(model)

    def forget(self, query_id: str) -> None:
        pass

    async def publish_feedback(self, record: Feedback, key: bytes, timeout_s: float) -> None:
        self.feedback.append((record, key))

    def kafka_ok(self, timeout_s: float = 2.0) -> bool:
        return True


def answer(event: QueryEvent) -> Response:
    return Response(query_id=event.query_id, app=event.app, output="dog",
                    scores=[0.25, 0.75], labels=["cat", "dog"], confidence=1.0,
                    is_default=False, default_reason=None, answered=["m1"], missing=[],
                    created_us=event.created_us, deadline_us=event.deadline_us, trace={})


def regression_of(value: float, status: str = "ok", error: str | None = None) -> Any:
    """A model that answers every request with ``value`` (or fails with ``status``)."""
    def predict(request: ModelRequest) -> Prediction:
        output = Tensor.of(np.array(value, dtype=np.float64)) if status == "ok" else None
        return Prediction(request.query_id, request.model, "1", status, output, error,
                          {**request.trace, "worker_out": now_us()})
    return predict


async def _pong() -> bool:
    return True


def make_app(bus: FakeBus | None = None, registry: FakeRegistry | None = None, **gw: Any):
    # TestClient runs the loop in a thread that shares the GIL with the test building ~100 KB
    # requests: its wake-ups read 5 ms late now and then, which the 5 ms loop-lag guard rightly
    # answers with 503. That guard has its own test; here it stays out of the way.
    gw.setdefault("max_loop_lag_ms", 1000.0)
    return create_app(
        GatewaySettings(instance="unit", **gw), Settings(topic_prefix="t."),
        registry=registry or FakeRegistry(), bus=bus or FakeBus(answer), redis_ping=_pong,
    )


@pytest.fixture
def bus() -> FakeBus:
    return FakeBus(answer)


@pytest.fixture
def client(bus: FakeBus):
    with TestClient(make_app(bus)) as c:
        yield c


def test_predict_publishes_a_query_event_and_maps_the_reply(client, bus):
    r = client.post("/v1/apps/pets/predict", json={"input": GOOD, "context": "user-42", "slo_ms": 80})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output"] == "dog" and body["scores"] == [0.25, 0.75] and body["labels"] == ["cat", "dog"]
    assert body["confidence"] == 1.0 and body["default"] is False
    assert body["models"] == {"answered": ["m1"], "missing": []}
    assert body["latency_ms"] >= 0
    (event, key), = bus.queries
    assert key == b"user-42" and event.query_id == body["query_id"]
    assert event.deadline_us - event.created_us == 80_000
    assert event.trace == {"produced": event.created_us}
    assert event.reply_topic == "t.replies.unit" and event.reply_partition == 0
    assert event.input.dtype == "float32" and event.input.shape == [2, 3]


def test_no_reply_gives_the_default_at_the_app_slo():
    bus = FakeBus(reply=None)
    with TestClient(make_app(bus)) as c:
        t0 = time.perf_counter()
        r = c.post("/v1/apps/pets/predict", json={"input": GOOD})
        waited_ms = (time.perf_counter() - t0) * 1000
        assert 'clipstream_gateway_defaults_total{source="gateway_timeout"} 1' in c.get("/metrics").text
    body = r.json()
    assert r.status_code == 200 and body["default"] is True and body["output"] == "unknown"
    assert body["confidence"] == 0.0 and body["models"] == {"answered": [], "missing": ["m1"]}
    assert 30 <= body["latency_ms"] <= 50, body  # app SLO 30 ms + 5 ms margin
    assert waited_ms < 30 + 20 + 50  # generous for the in-process client on a busy machine
    key = bus.queries[0][1]
    assert key == body["query_id"].encode()  # no context: keyed by query id


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"input": [[1, 2, 3], [4, 5]]}, "shape [2, 3]"),
        ({"input": [[1, 2, 3], [4, 5, True]]}, "boolean"),
        ({"input": [[1, 2, 3], [4, 5, "x"]]}, "string"),
        ({}, "input: Field required"),
        ({"input": GOOD, "slo_ms": 0}, "slo_ms"),
        ({"input": GOOD, "slo_ms": "50"}, "slo_ms"),
        ({"input": GOOD, "context": 42}, "context"),
        ([1, 2], "body"),
    ],
)
def test_bad_predict_bodies_are_422_with_the_reason(client, bus, body, reason):
    r = client.post("/v1/apps/pets/predict", json=body)
    assert r.status_code == 422 and reason in r.json()["detail"], r.text
    assert bus.queries == []


def test_malformed_json_and_unknown_app(client):
    r = client.post("/v1/apps/pets/predict", content=b'{"input": [1,', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "malformed JSON" in r.json()["detail"]
    r = client.post("/v1/apps/pets/predict", content=b'{"input": NaN}')
    assert r.status_code == 422
    assert client.post("/v1/apps/nope/predict", json={"input": GOOD}).status_code == 404
    assert client.post("/v1/apps/nope/feedback", json={"query_id": "q", "label": 1}).status_code == 404


@pytest.mark.parametrize("method, path, hit", [
    ("POST", "/v1/apps/pets/predict", ("predict", "pets")),
    ("POST", "/v1/apps/my app/predict", ("predict", "my app")),  # ASGI paths arrive percent-decoded
    ("POST", "/v2/models/pets/infer", ("v2-infer", "pets")),
    ("GET", "/v1/apps/pets/predict", None),
    ("GET", "/v2/models/pets/infer", None),
    ("POST", "/v1/apps//predict", None),
    ("POST", "/v1/apps/pets/feedback", ("feedback", "pets")),
    ("POST", "/v1/apps/pets/learn", None),
    ("POST", "/v1/apps/a/b/predict", None),
    ("POST", "/v2/apps/pets/predict", None),
    ("POST", "/v1/models/pets/infer", None),
    ("POST", "/v2/models/pets/versions/1/infer", None),
])
def test_the_fast_paths_take_only_predict_feedback_and_infer_posts(method, path, hit):
    assert fast_route({"type": "http", "method": method, "path": path}) == hit


def test_the_fast_path_answers_as_fastapi_did(client):
    """The same statuses, JSON and content type as the FastAPI route; other methods still reach
    the router (405), so the fast path only shortens the way, it does not change the API."""
    r = client.post("/v1/apps/nope/predict", json={"input": GOOD})
    assert (r.status_code, r.headers["content-type"]) == (404, "application/json")
    assert r.json() == {"detail": "unknown app 'nope'"}
    r = client.post("/v1/apps/" + "x" * 10_000 + "/predict", json={"input": GOOD})
    assert r.status_code == 404 and len(r.text) < 300 and "1-128 letters" in r.json()["detail"]  # not echoed whole
    assert client.get("/v1/apps/pets/predict").status_code == 405


def test_body_over_the_limit_is_413_declared_or_streamed():
    with TestClient(make_app(max_body_bytes=100)) as c:
        big = {"input": GOOD, "pad": "x" * 200}
        r = c.post("/v1/apps/pets/predict", json=big)
        assert r.status_code == 413  # and what to do: raise the limit, or send the input's raw bytes
        assert "CLIPSTREAM_GATEWAY_MAX_BODY_BYTES" in r.json()["detail"] and "application/octet-stream" in r.text
        raw = c.post("/v1/apps/pets/predict", content=b"\0" * 200, headers={"content-type": "application/octet-stream"})
        assert raw.status_code == 413 and "octet-stream" not in raw.json()["detail"], raw.text  # raw already
        assert "CLIPSTREAM_MAX_RECORD_BYTES with it" in raw.json()["detail"]
        # no Content-Length (chunked): the actual bytes are counted
        chunks = (b'{"input": [[1,2,3],[4,5,6]], "pad": "' + b"x" * 50 for _ in range(3))
        r = c.post("/v1/apps/pets/predict", content=chunks)
        assert r.status_code == 413 and "limit of 100 bytes" in r.json()["detail"]
        assert c.post("/v1/apps/pets/predict", json={"input": GOOD}).status_code == 200


def test_api_keys_bearer_or_header():
    with TestClient(make_app(api_keys=("k1", "k2"))) as c:
        url, body = "/v1/apps/pets/predict", {"input": GOOD}
        assert c.post(url, json=body).status_code == 401
        assert c.post(url, json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.post(url, json=body, headers={"Authorization": "Bearer k2"}).status_code == 200
        assert c.post(url, json=body, headers={"X-API-Key": "k1"}).status_code == 200
        assert c.get("/metrics").status_code == 401
        assert c.get("/healthz").status_code == 200  # liveness stays open


def test_the_deadline_counts_from_when_the_server_began_reading_the_request():
    bus = FakeBus(answer)
    app = make_app(bus)
    stamp = now_us() - 20_000  # the request waited 20 ms in the server before its handler ran

    async def stamped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope = {**scope, RECEIVED_US: stamp}
        await app(scope, receive, send)

    with TestClient(stamped) as c:
        body = c.post("/v1/apps/pets/predict", json={"input": GOOD}).json()
    event = bus.queries[0][0]
    assert event.created_us == stamp and event.deadline_us == stamp + 30_000
    assert body["latency_ms"] >= 20.0  # the caller's wait, not the handler's


def test_uvicorn_protocol_stamps_each_request_when_parsing_begins():
    import threading

    import uvicorn

    seen: list[tuple[int, int]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append((scope[RECEIVED_US], now_us()))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    protocol = stamped_protocol()
    assert protocol is not None  # uvicorn[standard] brings httptools
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, http=protocol,
                                           lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        port = server.servers[0].sockets[0].getsockname()[1]
        for _ in range(3):
            before = now_us()
            assert httpx.get(f"http://127.0.0.1:{port}/x").status_code == 204
            stamp, handled = seen[-1]
            assert before <= stamp <= handled <= now_us()
    finally:
        server.should_exit = True
        thread.join(10)


def test_feedback_is_202_and_forwarded(client, bus):
    r = client.post("/v1/apps/pets/feedback", json={"query_id": "q1", "label": "dog"})
    assert r.status_code == 202 and r.json()["query_id"] == "q1"
    r = client.post("/v1/apps/pets/feedback", json={"query_id": "q2", "reward": 1, "context": "u1"})
    assert r.status_code == 202
    (first, k1), (second, k2) = bus.feedback
    assert (first.label, first.reward, first.app, k1) == ("dog", None, "pets", b"q1")
    # keyed by query id; the caller's context is not the feedback's (the stored one is)
    assert (second.label, second.reward, second.context, k2) == (None, 1.0, None, b"q2")
    for bad in ({"query_id": "q3"}, {"label": 1}, {"query_id": "q", "reward": 2}, {"query_id": "q", "label": [1]}):
        assert client.post("/v1/apps/pets/feedback", json=bad).status_code == 422, bad
    assert len(bus.feedback) == 2


def test_feedback_with_an_integer_label_beyond_int64_is_422_not_500(client, bus):
    # big answers a regression value; 10**400 is a JSON integer no Avro long or double holds
    for digits in ("1" + "0" * 400, str(2**63)):
        r = client.post("/v1/apps/big/feedback", content=b'{"query_id": "q", "label": %s}' % digits.encode(),
                        headers={"content-type": "application/json"})
        assert r.status_code == 422 and "int64 range" in r.json()["detail"], r.text
    assert bus.feedback == []


def test_feedback_that_kafka_bus_cannot_encode_is_422_not_500():
    """The bus's own guard: a plain-label app takes any text, but a lone surrogate
    (``"\\ud800"`` is valid JSON) has no UTF-8 for Avro, so the encode fails before Kafka."""
    registry = FakeRegistry()
    registry._view = RegistryView(apps={"tags": AppConfig("tags", "exp4", 30.0, "unknown", {}, ("m3",))},
                                  models={"m3": ModelConfig("m3", "1", Path("/t"))})  # no spec: plain labels
    bus = KafkaBus(Settings(topic_prefix="t."), "unit")
    bus._loop, bus._producer = object(), object()  # type: ignore[assignment]  # "started"; neither is used
    with TestClient(make_app(bus, registry)) as c:  # type: ignore[arg-type]
        r = c.post("/v1/apps/tags/feedback", content=b'{"query_id": "q", "label": "\\ud800"}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 422 and "feedback cannot be stored" in r.json()["detail"], r.text
    # a label past the double range, had it got by the route's check (OverflowError, not ValueError)
    with pytest.raises(InputError, match="feedback cannot be stored"):
        asyncio.run(bus.publish_feedback(Feedback("q", "tags", None, 10**400, None, 1), b"q", 1.0))
    assert bus._acked is None  # no producer was made for records that never encoded


def test_readyz_metrics_and_openapi(client):
    assert client.get("/readyz").json() == {"ready": True, "checks": {"registry": True, "kafka": True, "redis": True}}
    client.post("/v1/apps/pets/predict", json={"input": GOOD})
    text = client.get("/metrics").text
    assert 'clipstream_gateway_requests_total{route="predict",status="200"} 1' in text
    assert "clipstream_gateway_request_seconds_count" in text and "clipstream_gateway_inflight 0" in text
    assert 'clipstream_gateway_direct_app{app="big"} 1.0' in text and 'direct_app{app="pets"}' not in text
    doc = client.get("/openapi.json").json()
    predict = doc["paths"]["/v1/apps/{app}/predict"]["post"]
    assert "input" in predict["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert {"200", "404", "413", "422", "503"} <= set(predict["responses"])
    with TestClient(make_app(registry=FakeRegistry(ready=False))) as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["checks"]["registry"] is False


def test_readyz_stays_ready_while_redis_is_away_and_says_so() -> None:
    """Queries are answered without Redis (a cache): a load balancer must keep this gateway."""
    async def away() -> bool:
        raise ConnectionError("Redis is frozen")

    app = make_app()
    with TestClient(app) as c:
        app.state.gateway.redis_ping = away
        r = c.get("/readyz")
        assert r.status_code == 200 and r.json() == {
            "ready": True, "checks": {"registry": True, "kafka": True, "redis": False}}


def test_large_inputs_are_parsed_off_the_loop_with_the_same_rules(client, bus):
    rows = [[0.5] * 100 for _ in range(200)]  # ~100 KB of JSON: parsed in a worker thread
    r = client.post("/v1/apps/big/predict", json={"input": rows})
    assert r.status_code == 200 and bus.requests[-1].input.shape == [200, 100]
    rows[150][7] = "x"
    r = client.post("/v1/apps/big/predict", json={"input": rows})
    assert r.status_code == 422 and "input[150][7] is a string" in r.json()["detail"]


def test_the_gateway_runs_on_uvloop_unless_told_not_to():
    import uvloop

    from frontend.gateway_cli import _loop_factory

    assert _loop_factory(False) is None
    factory = _loop_factory(True)
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
