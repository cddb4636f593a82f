"""The Open Inference Protocol over gRPC: tritonclient's gRPC client against the gateway's
service, answered by the same infer as the HTTP routes (a fake bus stands for Kafka)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from clipstream.testing.procs import wait_until
from frontend.v2_grpc import parse_request, start_grpc
from frontend.v2_proto import MESSAGES
from registry.spec import TensorSpec
from tests.unit.test_gateway_http import FakeBus, make_app
from tests.unit.test_gateway_v2 import ROWS, by_first_value

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402


def _fields(descriptor: Any, prefix: str = "") -> set[tuple[Any, ...]]:
    out = {(prefix + descriptor.name, f.name, f.number, f.type, f.is_repeated,
            f.message_type.name if f.message_type else "") for f in descriptor.fields}
    for nested in descriptor.nested_types:
        out |= _fields(nested, f"{prefix}{descriptor.name}.")
    return out


def test_the_messages_carry_the_protocols_field_numbers() -> None:
    from tritonclient.grpc import service_pb2

    for name, cls in MESSAGES.items():
        if "." not in name:
            ours, theirs = _fields(cls.DESCRIPTOR), _fields(getattr(service_pb2, name).DESCRIPTOR)
            assert ours <= theirs, (name, ours - theirs)
    assert set(service_pb2.DESCRIPTOR.services_by_name) == {"GRPCInferenceService"}


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[tuple[Any, FakeBus, Any]]:
    """A gateway over a fake bus with its gRPC server on a free port, and a client of it."""
    bus = FakeBus(by_first_value)
    gw = {"max_body_bytes": 4096, **getattr(request, "param", {})}
    with TestClient(make_app(bus, grpc_port=0, **gw)) as c:
        state = c.app.state.gateway
        server, port = c.portal.call(start_grpc, state, state.gw, False, 1.0)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            yield client, bus, c
        finally:
            client.close()
            c.portal.call(server.stop, 0)


def _input(rows: np.ndarray, datatype: str = "FP32") -> Any:
    tensor = grpcclient.InferInput("input", list(rows.shape), datatype)
    tensor.set_data_from_numpy(rows)
    return tensor


def test_tritonclient_infers_a_batch_one_query_per_example(served: tuple[Any, FakeBus, Any]) -> None:
    client, bus, _ = served
    rows = ROWS.copy()
    rows[1, 0, 0] = 7.0
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("pets")
    result = client.infer("pets", [_input(rows)], request_id="r-9", parameters={"context": "user-3", "slo_ms": 90})
    assert [o.decode() for o in result.as_numpy("output")] == ["cat", "dog", "cat"]
    np.testing.assert_allclose(result.as_numpy("scores"), [[0.9, 0.1], [0.2, 0.8], [0.9, 0.1]], rtol=1e-6)
    assert result.as_numpy("default").tolist() == [False, False, False]
    assert result.get_response().id == "r-9"
    sent = {e.query_id: e for e, _ in bus.queries}
    ids = [q.decode() for q in result.as_numpy("query_id")]
    for i, qid in enumerate(ids):  # each row's own query, with the request's context and SLO
        np.testing.assert_array_equal(sent[qid].input.array(), rows[i])
        assert sent[qid].context == "user-3" and sent[qid].deadline_us - sent[qid].created_us == 90_000


def test_metadata_and_asked_outputs(served: tuple[Any, FakeBus, Any]) -> None:
    client, _, _ = served
    meta = client.get_model_metadata("pets", as_json=True)
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "2", "3"]}]
    assert [o["name"] for o in meta["outputs"]][:2] == ["output", "scores"]
    assert client.get_server_metadata(as_json=True)["name"] == "clipstream"
    result = client.infer("pets", [_input(ROWS[:2])], outputs=[grpcclient.InferRequestedOutput("confidence")])
    assert result.as_numpy("confidence").tolist() == pytest.approx([0.9, 0.9]) and result.as_numpy("output") is None


@pytest.mark.parametrize("call, code, words", [
    (lambda c: c.infer("nope", [_input(ROWS)]), "StatusCode.NOT_FOUND", "unknown app"),
    (lambda c: c.infer("pets", [_input(ROWS[:, :1])]), "StatusCode.INVALID_ARGUMENT", "is not a batch of the model's"),
    (lambda c: c.infer("pets", [_input(ROWS > 5, "BOOL")]), "StatusCode.INVALID_ARGUMENT",
     "does not fit the model's FP32"),
    (lambda c: c.infer("pets", [_input(ROWS)], model_version="2"), "StatusCode.NOT_FOUND", "versions are not"),
    (lambda c: c.infer("pets", [_input(ROWS)], outputs=[grpcclient.InferRequestedOutput("logits")]),
     "StatusCode.INVALID_ARGUMENT", "unknown output 'logits'"),
    (lambda c: c.infer("pets", [_input(ROWS)], outputs=[grpcclient.InferRequestedOutput("output", class_count=2)]),
     "StatusCode.INVALID_ARGUMENT", "classification (class_count) is not offered; ask for `scores`"),
    (lambda c: c.infer("pets", [_input(np.zeros((0, 2, 3), np.float32))]), "StatusCode.INVALID_ARGUMENT",
     "the batch (its first dimension) must hold at least one example"),
    (lambda c: c.infer("pets", [_input(np.zeros((300, 2, 3), np.float32))]), "StatusCode.RESOURCE_EXHAUSTED",
     "over the limit of 4096 (CLIPSTREAM_GATEWAY_MAX_BODY_BYTES)"),
    (lambda c: c.get_model_config("pets"), "StatusCode.UNIMPLEMENTED",
     "ModelConfig is not offered: clipstream keeps no model config: ModelMetadata gives"),
    (lambda c: c.get_inference_statistics("pets"), "StatusCode.UNIMPLEMENTED", "ModelStatistics is not offered"),
    (lambda c: c.get_log_settings(), "StatusCode.UNIMPLEMENTED", "the Open Inference Protocol's methods only"),
])
def test_refusals_carry_the_status_and_the_reason(served: tuple[Any, FakeBus, Any], call: Any, code: str,
                                                    words: str) -> None:
    client, bus, c = served
    with pytest.raises(InferenceServerException) as err:
        call(client)
    assert err.value.status() == code and words in err.value.message()
    assert bus.queries == []
    assert 'route="grpc-' in c.get("/metrics").text  # counted, the methods not offered too


@pytest.mark.parametrize("served", [{"api_keys": ("k1",), "app_keys": {"k2": ("other",)}}], indirect=True)
def test_api_keys_are_read_from_the_metadata(served: tuple[Any, FakeBus, Any]) -> None:
    client, bus, _ = served
    assert client.is_server_live()  # a liveness probe needs no key
    for headers, code in ((None, "UNAUTHENTICATED"), ({"x-api-key": "bad"}, "UNAUTHENTICATED"),
                          ({"authorization": "Bearer k2"}, "PERMISSION_DENIED")):
        with pytest.raises(InferenceServerException) as err:
            client.infer("pets", [_input(ROWS)], headers=headers)
        assert err.value.status() == f"StatusCode.{code}", err.value.message()
    assert client.is_server_ready(headers={"authorization": "Bearer k2"})  # a per-app key reaches the server's
    result = client.infer("pets", [_input(ROWS)], headers={"authorization": "Bearer k1"})
    assert result.as_numpy("output").shape == (3,) and len(bus.queries) == 3
    for headers, code in ((None, "UNAUTHENTICATED"), ({"authorization": "Bearer k1"}, "UNIMPLEMENTED")):
        with pytest.raises(InferenceServerException) as err:  # a method not offered: the key comes first
            client.get_model_config("pets", headers=headers)
        assert err.value.status() == f"StatusCode.{code}", err.value.message()


def test_typed_contents_are_read_as_the_raw_bytes_are() -> None:
    spec = TensorSpec("float32", (2, 3))
    request = MESSAGES["ModelInferRequest"](model_name="pets")
    tensor = request.inputs.add(name="input", datatype="FP64", shape=[3, 2, 3])
    tensor.contents.fp64_contents.extend(ROWS.ravel().tolist())
    request.parameters["slo_ms"].int64_param = 70
    req, examples, rid, wanted, binary = parse_request(request, spec, 1 << 20)
    assert [e.array().tolist() for e in examples] == ROWS.tolist() and req.slo_ms == 70 and rid is None
    assert wanted == [] and binary == frozenset()  # gRPC answers carry raw contents anyway
    text = MESSAGES["ModelInferRequest"](model_name="t")
    text.inputs.add(name="input", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(["hé".encode(), b"x"])
    _, examples, _, _, _ = parse_request(text, TensorSpec("string", ()), 1 << 20)
    assert [e.array().item() for e in examples] == ["hé", "x"]
    half = MESSAGES["ModelInferRequest"](model_name="pets")
    half.inputs.add(name="input", datatype="FP16", shape=[1, 2, 3])
    with pytest.raises(Exception, match="FP16 has no typed contents field: send it in raw_input_contents"):
        parse_request(half, spec, 1 << 20)
    both = MESSAGES["ModelInferRequest"](model_name="pets")
    both.inputs.add(name="input", datatype="FP32", shape=[1, 2, 3]).contents.fp32_contents.extend([0.0] * 6)
    both.raw_input_contents.append(np.ones(6, "<f4").tobytes())
    with pytest.raises(Exception, match="both contents and raw_input_contents: send its values in one of them"):
        parse_request(both, spec, 1 << 20)
    # FP32 values written in the INT32 field: said as such, not as a tensor with no values
    astray = MESSAGES["ModelInferRequest"](model_name="pets")
    astray.inputs.add(name="input", datatype="FP32", shape=[1, 2, 3]).contents.int_contents.extend([5] * 6)
    with pytest.raises(Exception, match="a FP32 input's values go in contents.fp32_contents, and this one has "
                                        "them in contents.int_contents"):
        parse_request(astray, spec, 1 << 20)


def test_calls_in_flight_are_answered_as_the_gateway_stops() -> None:
    """The lifespan's shutdown waits for the gRPC calls in flight (``state.draining``) before it
    lets go of Kafka, and a call after it finds no server."""
    import threading

    bus = FakeBus(by_first_value, after_ms=300)
    got: list[Any] = []
    with TestClient(make_app(bus, grpc_port=0)) as c:
        state = c.app.state.gateway
        _, port = c.portal.call(start_grpc, state, state.gw, False, 5.0)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        call = threading.Thread(target=lambda: got.append(client.infer("pets", [_input(ROWS)],
                                                                      parameters={"slo_ms": 3000})))
        call.start()
        wait_until(lambda: len(bus.queries) == 3, 5, "the call's three examples sent")
    call.join(10)  # the client's context exits (the gateway stops) while the answers are 300 ms away
    assert got and [o.decode() for o in got[0].as_numpy("output")] == ["cat", "cat", "cat"]
    assert got[0].as_numpy("default").tolist() == [False, False, False]
    with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
        client.infer("pets", [_input(ROWS)], client_timeout=2)
    client.close()


class _SlowOnZero(FakeBus):
    """Answers a query whose first value is 0 after 400 ms, any other at once."""

    def publish_query(self, event: Any, key: bytes) -> Any:
        self.after_ms = 400.0 if float(event.input.array().ravel()[0]) == 0 else 0.0
        return super().publish_query(event, key)


def test_a_stream_answers_each_request_when_ready_and_goes_on_past_a_refusal() -> None:
    """``ModelStreamInfer`` (tritonclient's ``start_stream``/``async_stream_infer``): every
    request asked at once, answers sent as they are ready (a quick one passes a slow one), each
    with its request's id; a refused request is an error on the stream, which goes on."""
    import queue

    bus = _SlowOnZero(by_first_value)
    rows = ROWS.copy()
    rows[1, 0, 0] = 7.0
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with TestClient(make_app(bus, grpc_port=0)) as c:
        state = c.app.state.gateway
        server, port = c.portal.call(start_grpc, state, state.gw, False, 1.0)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer("pets", [_input(rows[:1])], request_id="slow", parameters={"slo_ms": 2000})
        client.async_stream_infer("pets", [_input(rows[1:])], request_id="quick", parameters={"slo_ms": 900})
        client.async_stream_infer("nope", [_input(ROWS[1:])], request_id="lost")
        answers = [got.get(timeout=10) for _ in range(3)]
        client.stop_stream()
        metrics = c.get("/metrics").text
        client.close()
        c.portal.call(server.stop, 0)
    errors = [e.message() for r, e in answers if e is not None]
    assert len(errors) == 1 and "unknown app 'nope'" in errors[0]
    done = [r for r, e in answers if e is None]
    assert [r.get_response().id for r in done] == ["quick", "slow"]  # the quick one did not wait
    assert [o.decode() for o in done[0].as_numpy("output")] == ["dog", "cat"]
    assert [o.decode() for o in done[1].as_numpy("output")] == ["cat"]
    assert len(bus.queries) == 3 and {e.deadline_us - e.created_us for e, _ in bus.queries} >= {900_000}
    assert 'route="grpc-stream",status="200"' in metrics and 'route="grpc-stream",status="404"' in metrics


@pytest.mark.parametrize("served", [{"app_keys": {"k2": ("other",)}}], indirect=True)
def test_a_streams_requests_are_let_in_by_its_key(served: tuple[Any, FakeBus, Any]) -> None:
    import queue

    client, bus, _ = served
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)), headers={"x-api-key": "k2"})
    client.async_stream_infer("pets", [_input(ROWS)], request_id="r-1")
    result, error = got.get(timeout=10)
    client.stop_stream()
    assert result is None and "this API key is not allowed for app 'pets'" in error.message()
    assert bus.queries == []


def test_a_burst_on_a_busy_loop_is_answered_or_refused_in_words_and_counted() -> None:
    """gRPC's own queue of calls the loop has not taken up yet cancels calls past 1,000 without a
    reason; the gateway's is larger, so a burst reaches its admission."""
    import collections
    import time as clock

    import grpc

    from frontend.v2_proto import SERVICE

    def slow(event: Any) -> Any:  # every answer holds the loop for half a millisecond
        clock.sleep(0.0005)
        return by_first_value(event)

    bus = FakeBus(slow, after_ms=5.0)
    n = 2500
    with TestClient(make_app(bus, grpc_port=0)) as c:
        state = c.app.state.gateway
        server, port = c.portal.call(start_grpc, state, state.gw, False, 1.0)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(f"/{SERVICE}/ModelInfer", request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=MESSAGES["ModelInferResponse"].FromString)
            request = MESSAGES["ModelInferRequest"](model_name="pets")
            request.inputs.add(name="input", datatype="FP32", shape=[1, 2, 3])
            request.raw_input_contents.append(ROWS[:1].tobytes())
            calls = [call.future(request) for _ in range(n)]
            codes = collections.Counter(f.exception().code() if f.exception() else grpc.StatusCode.OK for f in calls)
        metrics = c.get("/metrics").text
        c.portal.call(server.stop, 0)
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith('clipstream_gateway_requests_total{route="grpc-infer"'))
    assert counted == n
