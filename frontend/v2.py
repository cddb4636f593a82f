"""The Open Inference Protocol (KServe's V2, which Triton, MLServer and Seldon speak) over the
gateway's apps, so a client written for those servers calls clipstream unchanged.

An app is the protocol's model: callers address apps, as they do on ``/v1``. A request's one
input tensor holds a batch along its first dimension. Each example becomes its own query, with
its own admission slot, deadline and cache entry, and the answers come back as one set of
output tensors in the order the examples came (docs/design/0113). Errors are ``{"error": ...}``
bodies, as the protocol's clients expect.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
import uuid
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from clipstream.clock import now_us
from clipstream.errors import DecodeError, InputError
from frontend.ask import Asked, answered, ask
from frontend.gateway_http import HTTPProblem, parse_json, read_body
from frontend.gateway_models import PredictRequest, validation_reason
from frontend.http_protocol import RECEIVED_US
from frontend.inputs import parse_rows
from frontend.predict_body import OFFLOAD_BYTES
from frontend.state import GatewayState
from registry.spec import TensorSpec, not_finite
from registry.topic import AppConfig
from schemas.tensor import array_of, wire_size
from topics.sizes import input_limit, too_large_input

# the protocol's datatypes for clipstream's dtypes; string and bytes are both its BYTES
DATATYPES: dict[str, str] = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64", "string": "BYTES", "bytes": "BYTES",
}
_DTYPE_OF = {v: k for k, v in DATATYPES.items() if k != "bytes"}
OUTPUTS = ("output", "scores", "confidence", "default", "query_id")


class TensorIn(BaseModel):
    name: str = "input"
    shape: list[int] = Field(description="The batch first, then the model's input shape.")
    datatype: str = Field(description="BOOL, UINT8-64, INT8-64, FP16/32/64, or BYTES (strings).")
    data: list[Any] = Field(description="The values in row-major order, flat or nested.")


class InferRequest(BaseModel):
    """For the OpenAPI schema: the body is read by hand (size cap, one check for every path)."""

    id: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="`context` and `slo_ms`, as a predict's.")
    inputs: list[TensorIn] = Field(description="One tensor: an app's models take one input.")
    outputs: list[dict[str, str]] | None = Field(None, description=f"Names among {', '.join(OUTPUTS)}; all when "
                                                 "left out.")


def server_metadata() -> dict[str, Any]:
    return {"name": "clipstream", "version": "1", "extensions": []}


def model_metadata(state: GatewayState, cfg: AppConfig) -> dict[str, Any]:
    """The app as the protocol's model: its input (the batch first, -1) and the outputs an
    infer answers with."""
    spec = state.input_spec(cfg)
    kind, labels = state.outputs(cfg)
    inputs = [] if spec is None else [{"name": "input", "datatype": DATATYPES[spec.dtype], "shape": [-1, *spec.shape]}]
    outputs = [{"name": "output", "datatype": output_datatype(kind, labels, cfg.default_output), "shape": [-1]}]
    if kind == "class_scores" and labels:
        outputs.append({"name": "scores", "datatype": "FP32", "shape": [-1, len(labels)]})
    outputs += [{"name": "confidence", "datatype": "FP64", "shape": [-1]},
                {"name": "default", "datatype": "BOOL", "shape": [-1]},
                {"name": "query_id", "datatype": "BYTES", "shape": [-1]}]
    return {"name": cfg.name, "versions": [], "platform": "clipstream", "inputs": inputs, "outputs": outputs}


def parse_infer(raw: bytes, spec: TensorSpec | None, max_record_bytes: int, header_length: int | None = None
                ) -> tuple[PredictRequest, list[np.ndarray], str | None, list[str]]:
    """An infer body -> (the request's context and SLO, one array per example, the request's
    id, the outputs asked for). ``header_length``: the binary data extension's JSON length
    (``Inference-Header-Content-Length``), the input's raw bytes after it, as Triton's clients
    send by default. HTTPProblem 400 says why not, or 413 for an example no record could carry."""
    if header_length is not None and not 0 < header_length <= len(raw):
        raise _bad(f"Inference-Header-Content-Length {header_length} is not within the body's {len(raw)} bytes")
    body = parse_json(raw[:header_length] if header_length is not None else raw)
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object with `inputs`")
    tensors = body.get("inputs")
    if not isinstance(tensors, list) or len(tensors) != 1 or not isinstance(tensors[0], dict):
        raise _bad("`inputs` must hold one tensor: an app's models take one input, with the batch as its first "
                   "dimension")
    tensor = tensors[0]
    shape, datatype = tensor.get("shape"), tensor.get("datatype")
    if not (isinstance(shape, list) and shape and all(type(d) is int and d >= 0 for d in shape) and shape[0] >= 1):
        raise _bad(f"input shape {shape!r} must be a list of non-negative integers, the batch first (at least 1)")
    if datatype not in _DTYPE_OF:
        raise _bad(f"input datatype {datatype!r} is not one of {', '.join(sorted(_DTYPE_OF))}")
    spec = spec or TensorSpec(_DTYPE_OF[datatype], tuple(shape[1:]))
    _fits(shape, datatype, spec)
    binary = (tensor.get("parameters") or {}).get("binary_data_size") if isinstance(tensor.get("parameters"), dict) \
        else None
    try:
        if binary is not None:
            rows = _binary_rows(raw[header_length or len(raw):], binary, shape, datatype, spec)
        else:
            values = _flat(tensor.get("data"))
            if len(values) != math.prod(shape):
                raise _bad(f"input data holds {len(values)} values, and shape {shape} needs {math.prod(shape)}")
            rows = parse_rows(values, spec, shape[0])
        req = PredictRequest.model_validate({"input": None, **_parameters(body.get("parameters"))})
    except (InputError, DecodeError) as exc:
        raise _bad(str(exc)) from None
    except ValidationError as exc:
        raise _bad(f"parameters: {validation_reason(exc)}") from None
    arrays = [rows[i:i + 1].reshape(rows.shape[1:]) for i in range(len(rows))]  # arrays, even of one string
    biggest = max(wire_size(a) for a in arrays)
    if biggest > input_limit(max_record_bytes):
        raise HTTPProblem(413, too_large_input(biggest, max_record_bytes))
    rid = body.get("id")
    if rid is not None and not isinstance(rid, str):
        raise _bad("`id` must be a string")
    return req, arrays, rid, _wanted(body.get("outputs"))


def _binary_rows(blob: bytes, size: Any, shape: list[int], datatype: str, spec: TensorSpec) -> np.ndarray:
    """The examples of an input sent as raw bytes: numbers little-endian in row-major order,
    BYTES as each element's uint32 length and bytes (the layout a ``Tensor`` carries)."""
    if type(size) is not int or size != len(blob):
        raise _bad(f"binary_data_size {size!r} is not the {len(blob)} bytes after the JSON header")
    given = spec.dtype if datatype == "BYTES" else _DTYPE_OF[datatype]
    arr = array_of(given, shape, blob)
    if given == "bool" and blob.translate(None, b"\x00\x01"):
        raise InputError("a binary BOOL input holds bytes other than 0 and 1")
    if given != spec.dtype:
        arr = arr.astype(spec.dtype)
    if not_finite(arr):
        raise InputError(f"input has values that are not finite numbers (or out of range for {spec.dtype})")
    return arr


def infer_response(cfg: AppConfig, kind: str, labels: tuple[Any, ...] | None, answers: list[dict[str, Any]],
                   request_id: str | None, wanted: list[str]) -> dict[str, Any]:
    """The answers as the protocol's output tensors, one row per example, in their order. A
    default's scores are zeros: ``default`` says which rows those are."""
    n = len(answers)
    outs = [a["output"] for a in answers]
    datatype = output_datatype(kind, labels, cfg.default_output, outs)
    tensors: dict[str, dict[str, Any]] = {
        "output": {"shape": [n], "datatype": datatype, "data": outs if datatype != "BYTES" else [str(o) for o in outs]},
        "confidence": {"shape": [n], "datatype": "FP64", "data": [float(a["confidence"]) for a in answers]},
        "default": {"shape": [n], "datatype": "BOOL", "data": [bool(a["default"]) for a in answers]},
        "query_id": {"shape": [n], "datatype": "BYTES", "data": [a["query_id"] for a in answers]},
    }
    if kind == "class_scores" and labels:
        width = len(labels)
        rows = [a["scores"] if a.get("scores") and len(a["scores"]) == width else [0.0] * width for a in answers]
        tensors["scores"] = {"shape": [n, width], "datatype": "FP32", "data": [x for row in rows for x in row]}
    names = [name for name in (wanted or OUTPUTS) if name in tensors]
    out: dict[str, Any] = {"model_name": cfg.name, "outputs": [{"name": name, **tensors[name]} for name in names]}
    if request_id is not None:
        out["id"] = request_id
    return out


async def infer(state: GatewayState, cfg: AppConfig, raw: bytes, header_length: int | None,
                when: tuple[float, int, int], counts: tuple[Any, ...]) -> dict[str, Any]:
    """Every example asked at once, each holding its own admission slot until its answer; one
    refused (503) refuses the request, as a single predict would be."""
    if state.bus is None:
        raise state.overloaded("gateway is not connected to Kafka")
    if state.late_for(cfg.slo_ms):
        raise state.overloaded(f"gateway overloaded (event loop {state.loop_lag_ms:.0f} ms late)")
    parse = functools.partial(parse_infer, raw, state.input_spec(cfg), state.settings.max_record_bytes, header_length)
    # a batch of images costs milliseconds of parsing: keep the loop answering others
    parsed = await asyncio.get_running_loop().run_in_executor(None, parse) if len(raw) > OFFLOAD_BYTES else parse()
    req, arrays, request_id, wanted = parsed
    asked = Asked(cfg, req, *when)

    async def one(array: np.ndarray) -> dict[str, Any]:
        counts[0].inc()
        inflight, waited_ms = await state.admit(cfg.name, cfg.slo_ms)
        query_id = uuid.uuid4().hex
        try:
            reply = await ask(state, asked, query_id, array)
        finally:
            state.release()
        return answered(state, asked, query_id, reply, waited_ms, inflight, counts)

    results = await asyncio.gather(*(one(a) for a in arrays), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            if isinstance(r, HTTPProblem) and r.status == 503:
                counts[3].inc()
            raise r
    kind, labels = state.outputs(cfg)
    return infer_response(cfg, kind, labels, results, request_id, wanted)  # type: ignore[arg-type]


def add_routes(app: FastAPI, state: GatewayState) -> None:
    """The protocol's health, metadata and infer routes; its errors as ``{"error": ...}``."""

    def problem(exc: HTTPProblem) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, exc.status, headers=exc.headers)

    @app.get("/v2/health/live", summary="Open Inference Protocol: the server is alive")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", summary="Open Inference Protocol: ready for inference (as /readyz)")
    async def ready() -> JSONResponse:
        ok = state.registry is not None and state.bus is not None
        return JSONResponse({"ready": ok}, 200 if ok else 503)

    @app.get("/v2", summary="Open Inference Protocol: the server's metadata")
    async def server() -> dict[str, Any]:
        return server_metadata()

    @app.get("/v2/models/{app}", summary="Open Inference Protocol: an app's inputs and outputs")
    async def metadata(app: str) -> JSONResponse:
        try:
            return JSONResponse(model_metadata(state, state.app_config(app)))
        except HTTPProblem as exc:
            return problem(exc)

    @app.get("/v2/models/{app}/ready", summary="Open Inference Protocol: the app has a model to ask")
    async def app_ready(app: str) -> JSONResponse:
        try:
            cfg = state.app_config(app)
        except HTTPProblem as exc:
            return problem(exc)
        ok = bool(cfg.models) and state.bus is not None
        return JSONResponse({"name": cfg.name, "ready": ok}, 200 if ok else 503)

    @app.post("/v2/models/{app}/infer", summary="Open Inference Protocol: a batch of examples, one query each",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": InferRequest.model_json_schema()}}}})
    async def infer_route(app: str, request: Request) -> JSONResponse:
        t0, arrived = time.perf_counter(), now_us()
        created = min(arrived, request.scope.get(RECEIVED_US, arrived))
        try:
            cfg = state.app_config(app)
            state.reading += 1
            try:
                raw = await read_body(request, state.gw.max_body_bytes, state.gw.body_timeout_s)
            finally:
                state.reading -= 1
            header = request.headers.get("inference-header-content-length")
            if header is not None and not header.isdigit():
                raise _bad(f"Inference-Header-Content-Length {header[:32]!r} is not a number of bytes")
            return JSONResponse(await infer(state, cfg, raw, int(header) if header else None, (t0, arrived, created),
                                            state.metrics.app(cfg.name)))
        except HTTPProblem as exc:
            return problem(exc)


def _bad(reason: str) -> HTTPProblem:
    return HTTPProblem(400, reason)


def _fits(shape: list[int], datatype: str, spec: TensorSpec) -> None:
    """The tensor's shape is a batch of the model's, of a datatype whose values it takes: the
    model's own, or a number of the same kind (JSON numbers have no width)."""
    if tuple(shape[1:]) != spec.shape:
        raise _bad(f"input shape {shape} is not a batch of the model's {list(spec.shape)}: expected "
                   f"{['n', *spec.shape]}".replace("'n'", "n"))
    given, takes = _DTYPE_OF[datatype], spec.dtype
    if datatype == "BYTES" or takes in ("string", "bytes"):
        ok = datatype == DATATYPES[takes]
    else:
        ok = (given == "bool") == (takes == "bool") and bool(np.can_cast(given, takes, casting="same_kind"))
    if not ok:
        raise _bad(f"input datatype {datatype} does not fit the model's {DATATYPES[takes]} ({takes})")


def _flat(data: Any) -> list[Any]:
    """A tensor's values in row-major order, whether sent flat or nested."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(x, list) for x in data):
        return data
    out: list[Any] = []
    for x in data:
        out.extend(_flat(x))
    return out


def _parameters(params: Any) -> dict[str, Any]:
    """The request's ``context`` and ``slo_ms``, from its parameters (others are left alone:
    clients add their own, such as ``content_type``)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise _bad("`parameters` must be an object")
    return {k: params[k] for k in ("context", "slo_ms") if k in params}


def _wanted(outputs: Any) -> list[str]:
    if outputs is None:
        return []
    names = [o.get("name") if isinstance(o, dict) else None for o in outputs] if isinstance(outputs, list) else [None]
    unknown = [n for n in names if n not in OUTPUTS]
    if unknown:
        raise _bad(f"unknown output {unknown[0]!r}: an app answers {', '.join(OUTPUTS)}")
    return names  # type: ignore[return-value]


def output_datatype(kind: str | None, labels: tuple[Any, ...] | None, default: Any, outs: list[Any] = ()) -> str:
    """The one datatype every answer of the app fits (its labels or values, and its default):
    BOOL, INT64, FP64, or BYTES (written as text). Without labels, the answers decide."""
    values = [*(labels or outs), default, *([0.0] if kind == "regression" else [])]
    types = {type(v) for v in values}
    if types <= {bool}:
        return "BOOL"
    if types <= {int}:
        return "INT64"
    if types <= {int, float}:
        return "FP64"
    return "BYTES"
