"""The REST Client against the gateway app in-process (fake bus): answers, errors, feedback forms."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

import clipstream
from clipstream.errors import ClipstreamError, ConfigError, InfraError, InputError
from frontend.client import (
    Client, GatewayInputError, GatewayUnavailable, NotFound, Overloaded, Unauthorized, post_predict,
)
from tests.unit.test_gateway_http import GOOD, FakeBus, answer, make_app


@pytest.fixture
def bus() -> FakeBus:
    return FakeBus(answer)


@pytest.fixture
def client(bus: FakeBus):
    with TestClient(make_app(bus)) as http:
        yield Client(http=http)


def test_public_names_are_re_exported():
    assert clipstream.Client is Client
    from frontend.producer import Producer, ResponseReader

    assert clipstream.Producer is Producer and clipstream.ResponseReader is ResponseReader
    with pytest.raises(AttributeError):
        clipstream.NoSuchName  # noqa: B018


def test_predict_returns_the_json_and_accepts_numpy(client, bus):
    got = client.predict("pets", np.array(GOOD, dtype=np.float64), context="u1", slo_ms=40)
    assert got["output"] == "dog" and got["default"] is False
    event, key = bus.queries[0]
    assert key == b"u1" and event.deadline_us - event.created_us == 40_000


def test_predict_sends_a_numpy_input_as_its_raw_bytes_when_asked(client, bus):
    x = np.array(GOOD, dtype=">f4")  # big-endian here: sent little-endian, as a Tensor holds it
    got = client.predict("pets", x, context="u1", slo_ms=40, binary=True)
    assert got["output"] == "dog"
    event, key = bus.queries[0]
    assert key == b"u1" and event.deadline_us - event.created_us == 40_000
    np.testing.assert_array_equal(event.input.array(), x)
    with pytest.raises(GatewayInputError, match="not one example: 24 bytes"):
        client.predict("pets", np.array(GOOD, dtype=np.float64), binary=True)  # not the model's dtype


def test_errors_carry_the_server_reason(client):
    with pytest.raises(NotFound) as info:
        client.predict("nope", GOOD)
    assert info.value.status == 404 and "nope" in info.value.reason
    with pytest.raises(GatewayInputError) as info:
        client.predict("pets", [[1, 2]])
    assert isinstance(info.value, InputError) and "shape [2, 3]" in info.value.reason
    assert isinstance(info.value, ClipstreamError)


def test_feedback_forms(client, bus):
    qid = client.predict("pets", GOOD)["query_id"]
    client.feedback(qid, "dog")  # the short form: app remembered from predict
    client.feedback("pets", "q-other", "cat")
    client.feedback("pets", "q-r", reward=0.5)
    client.feedback("q-k", label="cat", app="pets")
    got = [(r.query_id, r.app, r.label, r.reward) for r, _ in bus.feedback]
    assert got == [(qid, "pets", "dog", None), ("q-other", "pets", "cat", None),
                   ("q-r", "pets", None, 0.5), ("q-k", "pets", "cat", None)]
    with pytest.raises(ConfigError):
        client.feedback("never-seen", "cat")  # no app known for it
    with pytest.raises(InputError):
        client.feedback("q", app="pets")  # neither label nor reward
    # as tritonclient reads a V2 answer's query_id and label: bytes and numpy values
    client.feedback(np.array([b"q-v2"], dtype=object)[0], label=np.str_("dog"), app="pets")
    client.feedback(np.bytes_(b"q-v2b"), label="cat", app="pets")
    assert [r.query_id for r, _ in bus.feedback[-2:]] == ["q-v2", "q-v2b"] and bus.feedback[-2][0].label == "dog"
    with pytest.raises(InputError, match="not UTF-8 text"):
        client.feedback(b"\xff\xfe", label="cat", app="pets")
    with pytest.raises(InputError, match="must be the text an answer gave; got int 7"):
        client.feedback(7, label="cat", app="pets")


def test_default_app_of_the_client(bus):
    with TestClient(make_app(bus)) as http:
        c = Client(app="pets", http=http)
        assert c.predict(input=GOOD)["output"] == "dog"
        assert c.predict(GOOD)["output"] == "dog"  # a lone argument is the input
        assert c.predict("pets", GOOD)["output"] == "dog"
        with pytest.raises(TypeError, match=r"predict\(APP, INPUT\), or predict\(INPUT\) with Client\(url, app=APP\)"):
            Client(http=http).predict(GOOD)  # no default app: the one argument is an app, and the input is missing
        c.feedback("q-1", "cat")
        assert bus.feedback[-1][0].app == "pets"


def test_api_key_and_overload_statuses():
    with TestClient(make_app(api_keys=("s3cret",))) as http:
        with pytest.raises(Unauthorized):
            Client(http=http).predict("pets", GOOD)
    with TestClient(make_app(api_keys=("s3cret",))) as http:
        assert Client(http=http, api_key="s3cret").predict("pets", GOOD)["output"] == "dog"
    with TestClient(make_app(max_inflight=1)) as http:
        http.app.state.gateway.inflight = 1  # one request already waiting
        with pytest.raises(Overloaded) as info:
            Client(http=http).predict("pets", GOOD)
        assert info.value.retry_after == 1.0


def test_unreachable_gateway_is_an_infra_error():
    with pytest.raises(GatewayUnavailable) as info:
        Client("http://127.0.0.1:1", timeout=2).predict("pets", GOOD)
    assert isinstance(info.value, InfraError)


def _flaky(fails: list[Exception]) -> httpx.MockTransport:
    """A transport that raises each of ``fails`` in turn, then answers every call."""
    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if fails:
            raise fails.pop(0)
        return httpx.Response(200, json={"query_id": "q1", "output": 1, "default": False})

    transport = httpx.MockTransport(handle)
    transport.calls = calls  # type: ignore[attr-defined]
    return transport


@pytest.mark.parametrize("exc", [httpx.ConnectError("refused"), httpx.RemoteProtocolError("disconnected"),
                                 httpx.ReadError("reset")])
def test_a_predict_whose_connection_failed_is_sent_once_more(exc: Exception) -> None:
    transport = _flaky([exc])
    client = Client(http=httpx.Client(transport=transport, base_url="http://gw"))
    assert client.predict("pets", GOOD)["query_id"] == "q1"
    assert len(transport.calls) == 2  # type: ignore[attr-defined]


def test_a_predict_fails_after_its_one_retry_and_feedback_never_retries() -> None:
    transport = _flaky([httpx.ConnectError("refused")] * 2)
    client = Client(http=httpx.Client(transport=transport, base_url="http://gw"))
    with pytest.raises(GatewayUnavailable, match="unreachable"):
        client.predict("pets", GOOD)
    transport = _flaky([httpx.ConnectError("refused")])
    client = Client(http=httpx.Client(transport=transport, base_url="http://gw"), app="pets")
    with pytest.raises(GatewayUnavailable):
        client.feedback("q1", 1)
    assert len(transport.calls) == 1  # type: ignore[attr-defined]


def test_the_async_predict_retries_as_the_client_does() -> None:
    import asyncio

    async def go(fails: list[Exception]) -> tuple[int, int]:
        transport = _flaky(fails)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            r = await post_predict(http, "/v1/apps/pets/predict", {"input": GOOD})
        return r.status_code, len(transport.calls)  # type: ignore[attr-defined]

    assert asyncio.run(go([httpx.ReadError("reset")])) == (200, 2)
    with pytest.raises(httpx.ConnectError):
        asyncio.run(go([httpx.ConnectError("refused")] * 2))


class _KafkaProducer:
    """Stands in for confluent_kafka's Producer: keeps what is produced, delivers nothing."""

    def __init__(self, config: dict) -> None:
        self.produced: list[tuple[str, bytes]] = []
        self.keys: list[bytes] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: object) -> None:
        self.produced.append((topic, value))
        self.keys.append(key)

    def poll(self, timeout_s: float) -> int:
        return 0


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch):
    import confluent_kafka

    from clipstream.settings import Settings
    from frontend.producer import Producer

    monkeypatch.setattr(confluent_kafka, "Producer", _KafkaProducer)
    made = Producer(settings=Settings(topic_prefix="t."))
    made._registry = _Registry()  # type: ignore[assignment]
    return made


class _Registry:
    """App ``pets`` over one model taking float32[3] that scores labels a and b; app ``plain``
    over one answering a label of its own."""

    def view(self) -> Any:
        from pathlib import Path

        from registry.spec import ModelSpec, OutputSpec, TensorSpec
        from registry.topic import AppConfig, ModelConfig, RegistryView

        spec = ModelSpec(Path("/m"), "python", TensorSpec("float32", (3,)), OutputSpec("class_scores", ("a", "b")))
        plain = ModelSpec(Path("/n"), "python", TensorSpec("float32", (3,)), OutputSpec("label"))
        return RegistryView(apps={"pets": AppConfig("pets", "exp4", 50.0, None, {}, ("m",)),
                                  "plain": AppConfig("plain", "single", 50.0, None, {}, ("n",))},
                            models={"m": ModelConfig("m", "1", Path("/m"), spec=spec),
                                    "n": ModelConfig("n", "1", Path("/n"), spec=plain)})


def test_the_producer_fetches_the_queries_topic_before_stamping_its_first_query(monkeypatch) -> None:
    """A fresh producer's first record waits for metadata and a connection: paid before the
    query's deadline starts, not out of it."""
    import confluent_kafka

    import frontend.producer as producer_module
    from clipstream.settings import Settings

    steps: list[str] = []

    class Warmed(_KafkaProducer):
        def list_topics(self, topic: str, timeout: float) -> None:
            steps.append(f"metadata {topic}")

        def produce(self, topic: str, value: bytes, key: bytes, on_delivery: object) -> None:
            steps.append(f"produce {topic}")

    class Registry(_Registry):
        def start(self) -> Any:
            return self

        def wait_ready(self, timeout_s: float) -> None:
            pass

    monkeypatch.setattr(confluent_kafka, "Producer", Warmed)
    monkeypatch.setattr(producer_module, "RegistryFollower", lambda settings: Registry())
    monkeypatch.setattr(producer_module, "now_us", lambda: steps.append("stamped") or 0)
    made = producer_module.Producer(settings=Settings(topic_prefix="t."))
    made.send_query("pets", np.zeros(3, np.float32))
    made.send_query("pets", np.zeros(3, np.float32))
    assert steps == ["metadata t.queries", "stamped", "produce t.queries", "stamped", "produce t.queries"]


def test_producer_casts_a_numpy_input_to_the_models_dtype_and_checks_its_shape(producer) -> None:
    from schemas import QueryEvent, decode_as

    producer.send_query("pets", np.array([0.1, 0.2, 0.3]))  # float64, as scikit-learn gives rows
    [(_, value)] = producer._producer.produced
    assert decode_as(QueryEvent, value).input.dtype == "float32"
    with pytest.raises(InputError, match=r"input has shape \[2, 3\] \(the model takes shape \[3\], dtype float32\); "
                                         "send one example per query"):
        producer.send_query("pets", np.zeros((2, 3)))
    with pytest.raises(InputError, match="input dtype complex128 cannot be cast to float32"):
        producer.send_query("pets", np.zeros(3, complex))


@pytest.mark.parametrize("slo_ms", [float("nan"), float("inf"), float("-inf"), 0, -5.0, 60_000.001, 10**9])
def test_producer_refuses_an_slo_outside_the_gateways_range(producer, slo_ms):
    with pytest.raises(InputError, match=r"slo_ms must be in \(0, 60000\] ms"):
        producer.send_query("pets", np.zeros(3, np.float32), slo_ms=slo_ms)
    assert producer._producer.produced == []


@pytest.mark.parametrize("slo_ms", [0.5, 80, 60_000])
def test_producer_sends_an_slo_within_the_range_as_the_deadline(producer, slo_ms):
    from schemas import QueryEvent, decode_as

    qid = producer.send_query("pets", np.zeros(3, np.float32), slo_ms=slo_ms)
    [(topic, value)] = producer._producer.produced
    event = decode_as(QueryEvent, value)
    assert topic == "t.queries" and event.query_id == qid
    assert event.deadline_us - event.created_us == int(slo_ms * 1000)


@pytest.mark.parametrize("label", [10**400, 2**63, float("nan"), [1, 2]])
def test_producer_refuses_feedback_no_app_could_take(producer, label):
    with pytest.raises(InputError, match="feedback label: "):
        producer.send_feedback("pets", "q1", label=label)
    assert producer._producer.produced == []


def test_producer_checks_a_label_against_the_apps_labels(producer):
    from schemas import Feedback, decode_as

    for label in ("c", 3, True):
        with pytest.raises(InputError, match=r"feedback label: label .* is not one of the app's labels \['a', 'b'\]"):
            producer.send_feedback("pets", "q1", label=label)
    assert producer._producer.produced == []
    producer.send_feedback("pets", "q1", label="b", context="user-7")
    [(_, value)] = producer._producer.produced
    assert decode_as(Feedback, value).label == "b"
    assert producer._producer.keys == [b"q1"]  # keyed by its query, as the gateway keys it


def test_producer_refuses_feedback_for_an_app_not_in_the_registry(producer):
    with pytest.raises(ConfigError, match="unknown app 'cats'"):
        producer.send_feedback("cats", "q1", reward=1.0)
    assert producer._producer.produced == []


def test_an_app_removed_or_already_waited_for_is_refused_at_once(producer):
    import dataclasses
    import time

    class Removing(_Registry):
        removed = False

        def view(self) -> Any:
            view = super().view()
            return dataclasses.replace(view, apps={}) if self.removed else view

    producer._registry = Removing()
    producer.send_query("pets", [0.1, 0.2, 0.3])  # seen in the registry
    producer._registry.removed = True

    def refused(app: str) -> float:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=f"unknown app '{app}'"):
            producer.send_query(app, [0.1, 0.2, 0.3])
        return time.monotonic() - t0

    assert refused("pets") < 0.5  # removed: no wait for a record that may yet come
    assert refused("cats") >= 2.0  # never seen: its record may be on its way, once
    assert refused("cats") < 0.5


@pytest.mark.parametrize("reward", [True, float("nan"), float("inf"), 1.5, -0.1])
def test_producer_refuses_a_reward_the_learner_would_refuse(producer, reward):
    with pytest.raises(InputError, match=r"feedback reward refused: .* is not a number in \[0, 1\]"):
        producer.send_feedback("pets", "q1", reward=reward)
    assert producer._producer.produced == []


def test_producer_sends_a_numpy_reward(producer):
    from schemas import Feedback, decode_as

    producer.send_feedback("pets", "q1", reward=np.float32(0.5))
    [(_, value)] = producer._producer.produced
    assert decode_as(Feedback, value).reward == 0.5


def test_producer_sends_feedback_with_an_int64_label(producer):
    from schemas import Feedback, decode_as

    producer.send_feedback("plain", "q1", label=2**63 - 1)
    [(_, value)] = producer._producer.produced
    assert decode_as(Feedback, value).label == 2**63 - 1


def test_the_kafka_producer_refuses_an_input_no_record_could_carry(producer) -> None:
    from clipstream.settings import Settings

    producer.settings = Settings(topic_prefix="t.", max_record_bytes=64 * 1024)
    producer._array = lambda app, x: x  # the model's shape is not what is tested here
    with pytest.raises(InputError, match="over the 60416 bytes a query may carry"):
        producer.send_query("pets", np.zeros(60417, np.uint8))
    assert producer._producer.produced == []


@pytest.mark.parametrize("context", ["", "x" * 257, 42])
def test_the_kafka_producer_takes_the_contexts_the_gateway_takes(producer, context) -> None:
    with pytest.raises(InputError, match="context must be text of 1 to 256 characters"):
        producer.send_query("pets", np.zeros(3, np.float32), context=context)
    assert producer._producer.produced == []
    producer.send_query("pets", np.zeros(3, np.float32), context="x" * 256)


def test_the_kafka_producer_refuses_an_input_that_is_not_finite(producer) -> None:
    with pytest.raises(InputError, match="input has values that are not finite numbers"):
        producer.send_query("pets", np.array([0.0, np.nan, 1.0], np.float32))
    assert producer._producer.produced == []


def test_a_binary_body_of_text_or_bytes_is_its_one_element():
    from frontend.client import _raw

    assert _raw("héllo") == "héllo".encode()
    assert _raw(b"\x00\xff") == b"\x00\xff"
    assert _raw(np.array("ab")) == b"ab"  # numpy's fixed-width text: its one element, not UTF-32
    assert _raw(np.array(b"ab\x00x")) == b"ab\x00x"
    assert _raw(np.array("ab", dtype=object)) == b"ab"  # never the object's pointer
    with pytest.raises(InputError, match="binary=True sends one string or bytes element, not an array of 2"):
        _raw(np.array(["a", "b"]))
    assert _raw(np.arange(2, dtype=">i2")) == b"\x00\x00\x01\x00"  # numbers: little-endian


def test_bytes_go_as_the_raw_body_even_without_binary(client, bus):
    with pytest.raises(GatewayInputError, match="a binary input of 2 bytes is not one example"):
        client.predict("pets", b"ab")  # sent, not a TypeError from JSON: the gateway's reason comes back


def test_an_input_json_cannot_carry_is_an_input_error_before_anything_is_sent(client, bus):
    bad = np.array(GOOD, dtype=np.float64)
    bad[0, 1] = np.nan
    with pytest.raises(InputError, match="not finite numbers .NaN or infinity.: JSON cannot carry them"):
        client.predict("pets", bad)
    with pytest.raises(InputError, match="input cannot be sent as JSON"):
        client.predict("pets", {"x": object()})
    with pytest.raises(InputError, match="binary=True sends a numpy array's own bytes: pass an array of the model's"):
        client.predict("pets", GOOD, binary=True)  # a list has no dtype to send
    assert bus.queries == []


def test_a_response_reader_with_no_kafka_raises_the_clipstream_error_the_readme_promises() -> None:
    """As the Producer does: one InfraError naming where it looked and what to do, not
    librdkafka's exception."""
    from clipstream.errors import InfraError
    from frontend.producer import ResponseReader

    with pytest.raises(InfraError, match=r"Kafka at 127.0.0.1:1 did not answer .*check CLIPSTREAM_KAFKA_BOOTSTRAP"):
        ResponseReader(bootstrap="127.0.0.1:1")
