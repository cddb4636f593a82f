"""The Open Inference Protocol on the gateway: an app is its model, an input tensor's first
dimension is a batch of queries, and the answers come back as output tensors in order."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from frontend.gateway_http import HTTPProblem
from frontend.v2_messages import output_datatype, parse_infer
from registry.spec import TensorSpec
from schemas import QueryEvent, Response, Tensor
from tests.unit.test_gateway_http import FakeBus, make_app

# app pets: float32 (2, 3), class_scores over ["cat", "dog"], default "unknown"
ROWS = np.arange(18, dtype=np.float32).reshape(3, 2, 3)


def by_first_value(event: QueryEvent) -> Response:
    """dog when the example's first value is odd: each row's answer is its own."""
    first = float(event.input.array().ravel()[0])
    dog = int(first) % 2 == 1
    return Response(query_id=event.query_id, app=event.app, output="dog" if dog else "cat",
                    scores=[0.2, 0.8] if dog else [0.9, 0.1], labels=["cat", "dog"], confidence=0.8 if dog else 0.9,
                    is_default=False, default_reason=None, answered=["m1"], missing=[],
                    created_us=event.created_us, deadline_us=event.deadline_us, trace={})


def infer_body(rows: np.ndarray, **extra: object) -> dict:
    return {"id": "r-1", "inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32",
                                     "data": rows.ravel().tolist()}], **extra}


def test_a_batch_is_one_query_per_example_answered_in_order() -> None:
    rows = ROWS.copy()
    rows[1, 0, 0] = 7.0  # the middle example's answer differs
    bus = FakeBus(by_first_value)
    with TestClient(make_app(bus)) as c:
        r = c.post("/v2/models/pets/infer", json=infer_body(rows, parameters={"context": "user-7", "slo_ms": 80}))
        assert r.status_code == 200, r.text
        body = r.json()
    assert body["model_name"] == "pets" and body["id"] == "r-1"
    out = {t["name"]: t for t in body["outputs"]}
    assert out["output"] == {"name": "output", "shape": [3], "datatype": "BYTES", "data": ["cat", "dog", "cat"]}
    assert out["scores"]["shape"] == [3, 2] and out["scores"]["data"] == pytest.approx([0.9, 0.1, 0.2, 0.8, 0.9, 0.1])
    assert out["default"]["data"] == [False, False, False] and out["confidence"]["datatype"] == "FP64"
    assert len(bus.queries) == 3 and {e.context for e, _ in bus.queries} == {"user-7"}
    sent = {e.query_id: e for e, _ in bus.queries}
    for i, qid in enumerate(out["query_id"]["data"]):  # the ids feedback takes, row by row
        np.testing.assert_array_equal(sent[qid].input.array(), rows[i])
        assert sent[qid].deadline_us - sent[qid].created_us == 80_000


def test_outputs_asked_as_binary_data_come_after_the_json_as_tritons_clients_read_them() -> None:
    """tritonclient asks for every output as binary data when it names none, and reads a BYTES
    output so sent as bytes, as Triton sends it; an output asked for as JSON stays JSON."""
    import struct

    rows = ROWS[:2].copy()
    rows[1, 0, 0] = 7.0
    with TestClient(make_app(FakeBus(by_first_value))) as c:
        r = c.post("/v2/models/pets/infer", json=infer_body(rows, parameters={"binary_data_output": True}))
        assert r.status_code == 200, r.text
        asked = c.post("/v2/models/pets/infer", json=infer_body(rows, outputs=[
            {"name": "output", "parameters": {"binary_data": True}}, {"name": "confidence"}]))
    assert r.headers["content-type"] == "application/octet-stream"
    size = int(r.headers["inference-header-content-length"])
    head, blob = json.loads(r.content[:size]), r.content[size:]
    assert head["model_name"] == "pets" and head["id"] == "r-1"
    out, at = {}, 0
    for t in head["outputs"]:  # every output, its bytes in order, no data in the JSON
        assert "data" not in t
        out[t["name"]], at = blob[at:at + t["parameters"]["binary_data_size"]], at + t["parameters"]["binary_data_size"]
    assert at == len(blob)
    assert out["output"] == struct.pack("<I", 3) + b"cat" + struct.pack("<I", 3) + b"dog"
    assert np.frombuffer(out["scores"], "<f4").tolist() == pytest.approx([0.9, 0.1, 0.2, 0.8])
    assert np.frombuffer(out["confidence"], "<f8").tolist() == pytest.approx([0.9, 0.8])
    assert np.frombuffer(out["default"], "?").tolist() == [False, False]
    assert out["default_reason"] == struct.pack("<I", 0) * 2 and len(out["query_id"]) == 2 * (4 + 32)
    size = int(asked.headers["inference-header-content-length"])  # one binary, one JSON
    head = json.loads(asked.content[:size])
    assert [t["name"] for t in head["outputs"]] == ["output", "confidence"]
    assert "data" not in head["outputs"][0] and head["outputs"][1]["data"] == pytest.approx([0.9, 0.8])
    assert asked.content[size:] == struct.pack("<I", 3) + b"cat" + struct.pack("<I", 3) + b"dog"


def test_nested_data_asked_outputs_and_a_default_row() -> None:
    bus = FakeBus(None)  # nothing answers: the app's default, in time
    with TestClient(make_app(bus)) as c:
        body = {"inputs": [{"name": "x", "shape": [1, 2, 3], "datatype": "FP64", "data": ROWS[:1].tolist()}],
                "outputs": [{"name": "default"}, {"name": "scores"}]}
        r = c.post("/v2/models/pets/infer", json=body)
        assert r.status_code == 200, r.text
    outs = r.json()["outputs"]
    assert [t["name"] for t in outs] == ["default", "scores"] and "id" not in r.json()
    assert outs[0]["data"] == [True] and outs[1]["data"] == [0.0, 0.0]  # a default's scores: zeros


@pytest.mark.parametrize(("change", "reason"), [
    ({"shape": [3, 6]}, "input shape [3, 6] is not a batch of the model's [2, 3]: expected [n, 2, 3]"),
    ({"shape": [0, 2, 3]}, "the batch (its first dimension) must hold at least one example"),
    ({"datatype": "BOOL"}, "input datatype BOOL does not fit the model's FP32"),
    ({"datatype": "BYTES"}, "input datatype BYTES does not fit the model's FP32"),
    ({"datatype": "FP8"}, "input datatype 'FP8' is not one of"),
    ({"data": list(range(17))}, "input data holds 17 values, and shape [3, 2, 3] needs 18"),
    ({"data": [True] * 18}, "data[0] is a boolean, expected a number"),
])
def test_a_bad_tensor_is_a_400_with_the_reason_and_nothing_is_asked(change: dict, reason: str) -> None:
    bus = FakeBus(by_first_value)
    body = infer_body(ROWS)
    body["inputs"][0].update(change)
    with TestClient(make_app(bus)) as c:
        r = c.post("/v2/models/pets/infer", json=body)
        assert r.status_code == 400 and reason in r.json()["error"], r.text
        assert c.post("/v2/models/pets/infer", json=infer_body(ROWS)).status_code == 200  # others still served
    assert len(bus.queries) == 3


@pytest.mark.parametrize(("body", "status", "reason"), [
    ({"inputs": []}, 400, "`inputs` must hold one tensor"),
    ({"inputs": [{}, {}]}, 400, "2 inputs are read as the columns of a table, and the model takes [2, 3] per example"),
    ({"inputs": [{"shape": [1, 2, 3], "datatype": "FP32", "data": [0] * 6}], "parameters": {"slo_ms": -1}}, 400,
     "parameters: slo_ms"),
    ({"inputs": [{"shape": [1, 2, 3], "datatype": "FP32", "data": [0] * 6}], "outputs": [{"name": "logits"}]}, 400,
     "unknown output 'logits'"),
    ([1, 2], 400, "a JSON object"),
])
def test_a_bad_request_is_refused_in_the_protocols_error_body(body: object, status: int, reason: str) -> None:
    with TestClient(make_app(FakeBus(by_first_value))) as c:
        r = c.post("/v2/models/pets/infer", json=body)
        assert r.status_code == status and reason in r.json()["error"], r.text
        r = c.post("/v2/models/nope/infer", json=infer_body(ROWS))
        assert r.status_code == 404 and r.json() == {"error": "unknown app 'nope'"}


def test_health_and_metadata_as_the_protocols_clients_read_them() -> None:
    with TestClient(make_app(FakeBus(by_first_value))) as c:
        assert c.get("/v2/health/live").json() == {"live": True}
        assert c.get("/v2/health/ready").status_code == 200
        assert c.get("/v2").json()["name"] == "clipstream"
        assert c.get("/v2/models/pets/ready").json() == {"name": "pets", "ready": True}
        meta = c.get("/v2/models/pets").json()
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 2, 3]}]
        assert {t["name"]: (t["datatype"], t["shape"]) for t in meta["outputs"]} == {
            "output": ("BYTES", [-1]), "scores": ("FP32", [-1, 2]), "confidence": ("FP64", [-1]),
            "default": ("BOOL", [-1]), "default_reason": ("BYTES", [-1]), "query_id": ("BYTES", [-1])}
        assert c.get("/v2/models/big").json()["outputs"][0]["datatype"] == "FP64"  # a regression
        assert c.get("/v2/models/nope").status_code == 404


def test_per_app_keys_reach_their_apps_protocol_routes_only() -> None:
    with TestClient(make_app(FakeBus(by_first_value), api_keys=("root",), app_keys={"pk": ("pets",)})) as c:
        pk = {"X-API-Key": "pk"}
        assert c.get("/v2/health/live").status_code == 200  # a liveness probe needs no secret
        assert c.post("/v2/models/pets/infer", json=infer_body(ROWS)).status_code == 401
        assert c.post("/v2/models/pets/infer", json=infer_body(ROWS), headers=pk).status_code == 200
        assert c.post("/v2/models/big/infer", json=infer_body(ROWS), headers=pk).status_code == 403
        assert c.get("/v2/health/ready", headers=pk).status_code == 200


def test_the_output_datatype_fits_every_answer_and_the_default() -> None:
    assert output_datatype("class_scores", (0, 1, 2), -1) == "INT64"
    assert output_datatype("class_scores", ("cat", "dog"), -1) == "BYTES"
    assert output_datatype("regression", None, -1) == "FP64"
    assert output_datatype("regression", None, "none") == "BYTES"
    assert output_datatype("label", None, False, [True, False]) == "BOOL"
    assert output_datatype("label", None, 0, [1, 2.5]) == "FP64"
    assert output_datatype("regression", None, None) == "FP64"  # no default is no value: not text
    assert output_datatype("class_scores", (0, 1), None) == "INT64"


def test_a_default_row_of_an_app_without_a_default_carries_a_zero_of_the_outputs_datatype() -> None:
    from frontend.v2_messages import infer_response
    from registry.topic import AppConfig

    cfg = AppConfig("r", "single", 50.0, None, {}, ("m",))
    answers = [{"output": 42.5, "confidence": 1.0, "default": False, "query_id": "a"},
               {"output": None, "confidence": 0.0, "default": True, "default_reason": "late", "query_id": "b"}]
    out = {t["name"]: t for t in infer_response(cfg, "regression", None, answers, None, [])["outputs"]}
    assert out["output"] == {"name": "output", "shape": [2], "datatype": "FP64", "data": [42.5, 0]}
    assert out["default"]["data"] == [False, True] and out["default_reason"]["data"] == ["", "late"]


def binary_body(rows: np.ndarray, datatype: str = "FP32", raw: bytes | None = None) -> tuple[bytes, dict[str, str]]:
    """The binary data extension, as Triton's clients send by default: the JSON, then the bytes."""
    raw = rows.astype("<f4").tobytes() if raw is None else raw
    head = json.dumps({"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": datatype,
                                   "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head)), "content-type": "application/octet-stream"}


def test_an_input_sent_as_raw_bytes_after_its_json_header() -> None:
    rows = ROWS.copy()
    rows[2, 0, 0] = 9.0
    bus = FakeBus(by_first_value)
    with TestClient(make_app(bus)) as c:
        body, headers = binary_body(rows)
        r = c.post("/v2/models/pets/infer", content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == ["cat", "cat", "dog"]
        body, headers = binary_body(rows, "FP64", rows.astype("<f8").tobytes())  # a wider float is cast
        assert c.post("/v2/models/pets/infer", content=body, headers=headers).json()["outputs"][0]["data"][2] == "dog"
        for raw, reason in ((rows.astype("<f4").tobytes()[:-4], "shape [3, 2, 3] needs 72 bytes, got 68"),
                            (np.full(18, np.nan, "<f4").tobytes(), "not finite numbers")):
            body, headers = binary_body(rows, raw=raw)
            r = c.post("/v2/models/pets/infer", content=body, headers=headers)
            assert r.status_code == 400 and reason in r.json()["error"], r.text
        body, headers = binary_body(rows)
        body = body.replace(b'"binary_data_size": 72', b'"binary_data_size": 70')
        r = c.post("/v2/models/pets/infer", content=body, headers=headers)
        assert r.status_code == 400 and "binary_data_size 70 is not the 72 bytes" in r.json()["error"], r.text
        r = c.post("/v2/models/pets/infer", content=b"{}", headers={"Inference-Header-Content-Length": "99"})
        assert r.status_code == 400 and "not within the body's 2 bytes" in r.json()["error"]
    np.testing.assert_array_equal(bus.queries[2][0].input.array(), rows[2])


def test_a_batch_of_strings_as_json_or_as_the_binary_extension_is_one_array_per_string() -> None:
    text = TensorSpec("string", ())
    as_json = {"inputs": [{"name": "t", "shape": [2], "datatype": "BYTES", "data": ["héllo", ""]}]}
    _, rows, _, _, _ = parse_infer(json.dumps(as_json).encode(), text, 1 << 20)
    assert [(r.array().shape, r.array().item()) for r in rows] == [((), "héllo"), ((), "")]
    blob = Tensor.of(np.array(["héllo", ""], dtype=object)).data  # Triton's BYTES layout is a Tensor's
    head = json.dumps({"inputs": [{"name": "t", "shape": [2], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(blob)}}]}).encode()
    _, rows, _, _, _ = parse_infer(head + blob, text, 1 << 20, len(head))
    assert [r.array().item() for r in rows] == ["héllo", ""]
    with pytest.raises(HTTPProblem, match="not UTF-8"):
        parse_infer(head + b"\x01\x00\x00\x00\xff" + blob[5:], text, 1 << 20, len(head))


def test_the_protocols_clients_read_every_refusal_as_its_error_body() -> None:
    with TestClient(make_app(FakeBus(by_first_value), api_keys=("root",))) as c:
        r = c.post("/v2/models/pets/infer", json=infer_body(ROWS))
        assert r.status_code == 401 and "API key" in r.json()["error"]
        root = {"X-API-Key": "root"}
        r = c.post("/v2/models/pets/versions/1/infer", json=infer_body(ROWS), headers=root)
        assert r.status_code == 404 and "versions are not addressed here" in r.json()["error"]
        r = c.get("/v2/models/pets/infer", headers=root)
        assert r.status_code == 405 and r.json() == {"error": "Method Not Allowed"}
        r = c.post("/v2/models/pets/infer", content=b'{"inputs": [', headers=root)
        assert r.status_code == 400 and "malformed JSON" in r.json()["error"]  # a bad request, as the protocol says
        assert c.get("/v1/apps/nope", headers=root).json() == {"detail": "unknown app 'nope'"}  # /v1 keeps its own


@pytest.mark.parametrize(("datatype", "data", "reason"), [
    ("UINT8", [300] * 18, "do not fit uint8"),
    ("INT64", [2.5] * 18, "expected an integer"),
    ("FP64", [1e300] * 18, "out of range for the model's float32"),
])
def test_values_must_fit_the_datatype_they_are_sent_as(datatype: str, data: list, reason: str) -> None:
    body = infer_body(ROWS)
    body["inputs"][0].update(datatype=datatype, data=data)
    with TestClient(make_app(FakeBus(by_first_value))) as c:
        r = c.post("/v2/models/pets/infer", json=body)
        assert r.status_code == 400 and reason in r.json()["error"], r.text
        body["inputs"][0].update(data=[1] * 18)
        assert c.post("/v2/models/pets/infer", json=body).status_code == 200  # the same datatype, values that fit


def test_a_compressed_body_is_inflated_within_the_body_limit() -> None:
    import gzip
    import zlib

    raw = json.dumps(infer_body(ROWS)).encode()
    with TestClient(make_app(FakeBus(by_first_value))) as c:
        for encoding, packed in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw))):
            r = c.post("/v2/models/pets/infer", content=packed, headers={"Content-Encoding": encoding})
            assert r.status_code == 200 and len(r.json()["outputs"][0]["data"]) == 3, r.text
        bomb = gzip.compress(b" " * (2 << 20))  # 2 MiB of spaces in a few KiB
        r = c.post("/v2/models/pets/infer", content=bomb, headers={"Content-Encoding": "gzip"})
        assert r.status_code == 413 and "inflates past the limit" in r.json()["error"]
        assert "send the batch as several requests" in r.json()["error"]
        r = c.post("/v2/models/pets/infer", content=raw, headers={"Content-Encoding": "br"})
        assert r.status_code == 415 and "send gzip, deflate or none" in r.json()["error"]


def test_mlservers_output_names_answer_the_apps_answer_and_scores() -> None:
    rows = ROWS.copy()
    rows[1, 0, 0] = 7.0
    with TestClient(make_app(FakeBus(by_first_value))) as c:
        body = {"inputs": [{"name": "x", "shape": [3, 2, 3], "datatype": "FP32", "data": rows.ravel().tolist()}],
                "outputs": [{"name": "predict_proba"}, {"name": "predict"}]}
        r = c.post("/v2/models/pets/infer", json=body)
        assert r.status_code == 200, r.text
        outs = r.json()["outputs"]
        assert [(t["name"], t["datatype"], t["shape"]) for t in outs] == [("predict_proba", "FP32", [3, 2]),
                                                                          ("predict", "BYTES", [3])]
        assert outs[0]["data"] == pytest.approx([0.9, 0.1, 0.2, 0.8, 0.9, 0.1]) and outs[1]["data"] == [
            "cat", "dog", "cat"]
        body = {"inputs": [{"name": "x", "shape": [1, 200, 100], "datatype": "FP32", "data": [0.0] * 20_000}],
                "outputs": [{"name": "predict_proba"}]}
        r = c.post("/v2/models/big/infer", json=body)  # big answers a value: no scores under any name
        assert r.status_code == 400 and "app big has no output 'predict_proba'" in r.json()["error"], r.text
        for asked, reason in ((["predict", "predict"], "output 'predict' is asked for twice"),
                              (["scores", "predict_proba"], "outputs 'scores' and 'predict_proba' are one output")):
            r = c.post("/v2/models/pets/infer", json=infer_body(ROWS, outputs=[{"name": name} for name in asked]))
            assert r.status_code == 400 and reason in r.json()["error"], r.text


def test_an_output_the_app_does_not_have_is_refused() -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 200, 100], "datatype": "FP32", "data": [0.0] * 20_000}],
            "outputs": [{"name": "scores"}]}
    bus = FakeBus(by_first_value)
    with TestClient(make_app(bus)) as c:
        r = c.post("/v2/models/big/infer", json=body)  # big answers a value: no scores
        assert r.status_code == 400 and "app big has no output 'scores'" in r.json()["error"], r.text
    assert not bus.requests and not bus.queries  # refused before any example was asked


def test_a_batch_larger_than_the_admission_limit_goes_in_waves_and_is_answered() -> None:
    bus = FakeBus(by_first_value, after_ms=5)  # each answer a moment later: slots are held
    rows = np.zeros((40, 2, 3), dtype=np.float32)
    rows[:, 0, 0] = np.arange(40)  # odd: dog
    with TestClient(make_app(bus, max_inflight=8)) as c:  # a limit far below the batch
        r = c.post("/v2/models/pets/infer", json=infer_body(rows))
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == ["cat", "dog"] * 20  # every example, in order
        assert not any(r.json()["outputs"][3]["data"])  # none a default
    assert len(bus.queries) == 40


def test_batches_side_by_side_wait_for_slots_rather_than_refuse() -> None:
    from concurrent.futures import ThreadPoolExecutor

    bus = FakeBus(by_first_value, after_ms=5)
    rows = np.zeros((40, 2, 3), dtype=np.float32)
    with TestClient(make_app(bus, max_inflight=8)) as c, ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: c.post("/v2/models/pets/infer", json=infer_body(rows)), range(3)))
    assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
    assert len(bus.queries) == 120


def test_a_batch_whose_caller_went_away_sends_no_more_examples() -> None:
    from clipstream.clock import now_us
    from frontend.v2 import infer

    bus = FakeBus(by_first_value)
    raw = json.dumps(infer_body(np.zeros((40, 2, 3), dtype=np.float32))).encode()
    asked: list[int] = []

    async def gone() -> bool:  # the caller leaves after four examples went
        asked.append(1)
        return len(asked) > 4

    async def call(state) -> int:  # noqa: ANN001
        t = now_us()
        try:
            cfg = state.app_config("pets")
            parse = functools.partial(parse_infer, raw, state.input_spec(cfg), 1 << 20)
            await infer(state, cfg, parse, len(raw), (0.0, t, t), state.metrics.app("pets"), gone)
        except HTTPProblem as exc:
            return exc.status
        return 200

    with TestClient(make_app(bus)) as c:
        assert c.portal.call(call, c.app.state.gateway) == 499
    assert len(bus.queries) == 4


def test_nested_data_must_be_nested_as_the_shape_is() -> None:
    body = infer_body(ROWS[:2])
    body["inputs"][0]["data"] = [[[0, 1, 2], [3, 4, 5]], [[0, 1], [2, 3, 4, 5]]]  # 12 values, a ragged second row
    with TestClient(make_app(FakeBus(by_first_value))) as c:
        r = c.post("/v2/models/pets/infer", json=body)
        assert r.status_code == 400 and "data[1][0] is a list of 2, and shape [2, 2, 3] needs a list of 3" in r.text
        body["inputs"][0]["data"] = ROWS[:2].ravel().tolist()  # flat is fine
        assert c.post("/v2/models/pets/infer", json=body).status_code == 200
        r = c.post("/v2/models/pets/config")
        assert r.status_code == 405
        r = c.get("/v2/models/pets/config")
        assert r.status_code == 404 and "keeps no model config" in r.json()["error"]


def test_a_compressed_body_on_v1_is_refused_saying_so() -> None:
    import gzip

    with TestClient(make_app(FakeBus(by_first_value))) as c:
        r = c.post("/v1/apps/pets/predict", content=gzip.compress(b'{"input": [[1,2,3],[4,5,6]]}'),
                   headers={"Content-Encoding": "gzip"})
        assert r.status_code == 415 and "send the body uncompressed" in r.json()["detail"]


def test_a_batchs_examples_are_timed_from_when_each_went() -> None:
    """Examples of a batch wait for their wave, and are queries from when they go: the wait does
    not read as a pipeline gone slow, which would cut the admission limit for every caller."""
    bus = FakeBus(by_first_value, after_ms=8)
    rows = np.zeros((48, 2, 3), dtype=np.float32)  # 12 waves of 4, 8 ms each: far past the 30 ms SLO
    with TestClient(make_app(bus, max_inflight=8)) as c:
        r = c.post("/v2/models/pets/infer", json=infer_body(rows))
        assert r.status_code == 200 and not any(r.json()["outputs"][3]["data"]), r.text
        metrics = c.get("/metrics").text
    assert 'clipstream_gateway_admission_cuts_total{cause="late"}' not in metrics, metrics
    took = float(next(line.split()[-1] for line in metrics.splitlines()
                      if line.startswith('clipstream_gateway_query_seconds_sum{app="pets"}')))
    assert took < 48 * 0.030  # each example within the SLO, not the batch's whole time


def test_a_shape_that_differs_by_ones_only_is_the_models() -> None:
    """MLServer's string codec sends one string per example as [n, 1]; a model of shape [] takes
    them, and [n, 2, 1, 3] reaches a (2, 3) model as its own shape."""
    text = TensorSpec("string", ())
    body = {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "BYTES", "data": [["good"], ["bad"]]}]}
    _, rows, _, _, _ = parse_infer(json.dumps(body).encode(), text, 1 << 20)
    assert [r.array().item() for r in rows] == ["good", "bad"]
    padded = {"inputs": [{"name": "x", "shape": [1, 2, 1, 3], "datatype": "FP32", "data": list(range(6))}]}
    _, rows, _, _, _ = parse_infer(json.dumps(padded).encode(), TensorSpec("float32", (2, 3)), 1 << 20)
    assert rows[0].array().shape == (2, 3)
    with pytest.raises(HTTPProblem, match=r"is not a batch of the model's \[2, 3\]"):
        parse_infer(json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 2], "datatype": "FP32",
                                            "data": list(range(6))}]}).encode(), TensorSpec("float32", (2, 3)), 1 << 20)


def test_a_body_over_the_limit_is_told_what_would_fit() -> None:
    big = np.zeros((40, 2, 3), np.float32)
    with TestClient(make_app(FakeBus(by_first_value), max_body_bytes=1000)) as c:
        r = c.post("/v2/models/pets/infer", json=infer_body(big))
        assert r.status_code == 413 and "or its input in the binary data extension" in r.json()["error"], r.text
        header = json.dumps({"inputs": [{"name": "input", "shape": [40, 2, 3], "datatype": "FP32",
                                         "parameters": {"binary_data_size": big.nbytes}}]}).encode()
        r = c.post("/v2/models/pets/infer", content=header + big.tobytes(),
                   headers={"Inference-Header-Content-Length": str(len(header))})
        assert r.status_code == 413, r.text
        assert "send the batch as several requests)" in r.json()["error"] and "binary" not in r.json()["error"]
