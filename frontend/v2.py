"""The Open Inference Protocol (KServe's V2, which Triton, MLServer and Seldon speak) over the
gateway's apps, so a client written for those servers calls clipstream unchanged. The messages
are read and written in ``frontend.v2_messages``.

An app is the protocol's model: callers address apps, as they do on ``/v1``. A request's one
input tensor holds a batch along its first dimension. Each example becomes its own query, with
its own admission slot, deadline and cache entry, and the answers come back as one set of
output tensors in the order the examples came (docs/design/0113). Errors are ``{"error": ...}``
bodies, as the protocol's clients expect.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from clipstream.clock import now_us
from frontend.ask import Asked, answered, ask
from frontend.gateway_http import HTTPProblem, RawAnswer, read_body
from frontend.gateway_models import MAX_SLO_MS
from frontend.http_protocol import RECEIVED_US
from frontend.predict_body import OFFLOAD_BYTES
from frontend.state import GatewayState
from frontend.v2_binary import with_binary
from frontend.v2_messages import (BATCH_LIMIT, DATATYPES, ErrorV2, InferRequest, Parsed, app_outputs, bad,
                                  check_outputs, decoded, infer_response, output_datatype, parse_infer)
from registry.topic import AppConfig
from schemas import Tensor


# how long a batch's examples may wait for admission slots, in all: as long as a query's longest SLO
BATCH_WAIT_S = MAX_SLO_MS / 1000.0
# what to do about a batch over the body limit
BATCH_BODY_HINT = f" ({BATCH_LIMIT}, or its input in the binary data extension, which takes a third of JSON's size)"
BINARY_BODY_HINT = f" ({BATCH_LIMIT})"  # a body in the binary data extension already


async def _stays() -> bool:
    return False


def server_ready(state: GatewayState) -> bool:
    return state.registry is not None and state.kafka_problem() is None


async def app_ready(state: GatewayState, cfg: AppConfig) -> tuple[bool, str | None]:
    """Whether the app can answer, and if not why: it has models, the gateway reaches Kafka, and
    a replica of each model has said it has the model loaded (``clipstream.loaded``; without
    Redis that cannot be read, and the app counts as ready: Redis is a cache)."""
    if (lost := state.kafka_problem()) is not None:
        return False, lost
    if not cfg.models:
        return False, f"app {cfg.name} has no models linked"
    why = await state.not_loaded(cfg.models)
    return why is None, why


def unversioned(app: str) -> HTTPProblem:
    return HTTPProblem(404, f"versions are not addressed here: an app answers with the versions the registry "
                            f"serves; ask for model {app[:64]!r} without one")


def server_metadata() -> dict[str, Any]:
    return {"name": "clipstream", "version": "1", "extensions": ["binary_tensor_data"]}


def model_metadata(state: GatewayState, cfg: AppConfig) -> dict[str, Any]:
    """The app as the protocol's model: its input (the batch first, -1) and the outputs an
    infer answers with."""
    spec = state.input_spec(cfg)
    kind, labels = state.outputs(cfg)
    inputs = [] if spec is None else [{"name": "input", "datatype": DATATYPES[spec.dtype], "shape": [-1, *spec.shape]}]
    described = {"output": (output_datatype(kind, labels, cfg.default_output), [-1]),
                 "scores": ("FP32", [-1, len(labels or ())]), "confidence": ("FP64", [-1]), "default": ("BOOL", [-1]),
                 "default_reason": ("BYTES", [-1]), "query_id": ("BYTES", [-1])}
    outputs = [{"name": name, "datatype": described[name][0], "shape": described[name][1]}
               for name in app_outputs(kind, labels)]
    return {"name": cfg.name, "versions": [], "platform": "clipstream", "inputs": inputs, "outputs": outputs}


async def infer(state: GatewayState, cfg: AppConfig, parse: Callable[[], Parsed], size: int,
                when: tuple[float, int, int], counts: tuple[Any, ...],
                gone: Callable[[], Awaitable[bool]] = _stays) -> dict[str, Any]:
    """Each example asked as its own query, holding an admission slot until its answer. A batch
    has at most half the admission limit in flight at once, so the callers beside it keep their
    turn, and its later examples go as the earlier ones are answered, each with the SLO from when
    it goes. Its examples wait for slots as long as its caller does (``BATCH_WAIT_S``), behind
    other batches too. A refusal (503), or a caller ``gone``, sends none of those still waiting.
    ``parse`` reads the request (of ``size`` bytes) as HTTP or gRPC carries it."""
    if (lost := state.kafka_problem()) is not None:
        raise state.overloaded(lost)
    if state.late_for(cfg.slo_ms):
        raise state.overloaded(f"gateway overloaded (event loop {state.loop_lag_ms:.0f} ms late)")
    # a batch of images costs milliseconds of parsing: keep the loop answering others
    parsed = await asyncio.get_running_loop().run_in_executor(None, parse) if size > OFFLOAD_BYTES else parse()
    req, tensors, request_id, wanted, _ = parsed
    kind, labels = state.outputs(cfg)
    check_outputs(cfg, kind, labels, wanted)
    t0, arrived, created = when
    wave = asyncio.Semaphore(max(1, state.limit // 2))
    stopped: list[HTTPProblem] = []
    until = time.monotonic() + BATCH_WAIT_S

    async def one(tensor: Tensor) -> dict[str, Any]:
        async with wave:
            if not stopped and await gone():
                stopped.append(HTTPProblem(499, "the caller went away"))
            if stopped:
                raise stopped[0]
            try:
                inflight, waited_ms = await state.admit(cfg.name, cfg.slo_ms, max(0.0, until - time.monotonic()))
            except HTTPProblem as exc:
                stopped.append(exc)
                raise
            counts[0].inc()
            asked = Asked(cfg, req, t0, arrived, created, sent=now_us())
            query_id = uuid.uuid4().hex
            try:
                reply = await ask(state, asked, query_id, tensor)
            finally:
                state.release()
            return answered(state, asked, query_id, reply, waited_ms, inflight, counts)

    if len(tensors) == 1:  # asked on this task: no task of its own to make and gather
        try:
            results: list[Any] = [await one(tensors[0])]
        except Exception as exc:
            results = [exc]
    else:
        results = await asyncio.gather(*(one(t) for t in tensors), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            if stopped and stopped[0].status == 503:  # counted as one refused query, as a refused predict is
                counts[0].inc()
                counts[3].inc()
            raise stopped[0] if stopped else r
    return infer_response(cfg, kind, labels, results, request_id, wanted)  # type: ignore[arg-type]


def add_routes(app: FastAPI, state: GatewayState) -> None:
    """The protocol's health, metadata and infer routes. Their HTTPProblems are rendered as the
    protocol's ``{"error": ...}`` by the gateway's handler (``gateway_http.error_key``)."""

    @app.get("/v2/health/live", summary="Open Inference Protocol: the server is alive")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", summary="Open Inference Protocol: ready for inference (as /readyz)")
    async def health_ready() -> JSONResponse:
        ok = server_ready(state)
        return JSONResponse({"ready": ok}, 200 if ok else 503)

    @app.get("/v2", summary="Open Inference Protocol: the server's metadata")
    async def server() -> dict[str, Any]:
        return server_metadata()

    @app.get("/v2/models/{app}", summary="Open Inference Protocol: an app's inputs and outputs")
    async def metadata(app: str) -> dict[str, Any]:
        return model_metadata(state, state.app_config(app))

    @app.get("/v2/models/{app}/ready", summary="Open Inference Protocol: a replica of each of the app's models has "
                                               "it loaded (else 503 with the reason)")
    async def model_ready(app: str) -> JSONResponse:
        cfg = state.app_config(app)
        ok, why = await app_ready(state, cfg)
        return JSONResponse({"name": cfg.name, "ready": ok, **({"reason": why} if why else {})}, 200 if ok else 503)

    @app.api_route("/v2/models/{app}/versions/{rest:path}", methods=["GET", "POST"], include_in_schema=False)
    async def versioned(app: str, rest: str) -> None:
        raise unversioned(app)

    @app.get("/v2/models/{app}/config", include_in_schema=False)
    async def config(app: str) -> None:
        raise HTTPProblem(404, f"clipstream keeps no model config: GET /v2/models/{app[:64]} gives the app's inputs "
                               "and outputs")

    @app.post("/v2/models/{app}/infer", summary="Open Inference Protocol: a batch of examples, one query each",
              responses={c: {"model": ErrorV2} for c in (400, 401, 403, 404, 408, 413, 503)},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": InferRequest.model_json_schema()}}}})
    async def infer_route(app: str, request: Request) -> Response:
        # declared for the OpenAPI schema: GatewayAPI serves these requests before the router
        answer = await infer_http(state, app, request)
        if isinstance(answer, RawAnswer):
            return Response(answer.body, headers=answer.headers)
        return JSONResponse(answer)


async def infer_http(state: GatewayState, app: str, request: Request) -> dict[str, Any] | RawAnswer:
    """``POST /v2/models/{app}/infer``: the body (JSON, or the binary data extension's JSON
    and raw bytes, compressed or not) read and asked by ``infer``."""
    t0, arrived = time.perf_counter(), now_us()
    created = min(arrived, request.scope.get(RECEIVED_US, arrived))
    cfg = state.app_config(app)
    header = request.headers.get("inference-header-content-length")
    hint = BATCH_BODY_HINT if header is None else BINARY_BODY_HINT
    state.reading += 1
    try:
        raw = await read_body(request, state.gw.max_body_bytes, state.gw.body_timeout_s, hint=hint, inflates=True)
    finally:
        state.reading -= 1
    raw = decoded(raw, request.headers.get("content-encoding"), state.gw.max_body_bytes)
    if header is not None and not header.isdigit():
        raise bad(f"Inference-Header-Content-Length {header[:32]!r} is not a number of bytes")
    read: list[Parsed] = []

    def parse() -> Parsed:
        read.append(parse_infer(raw, state.input_spec(cfg), state.settings.max_record_bytes,
                                int(header) if header else None))
        return read[0]

    answer = await infer(state, cfg, parse, len(raw), (t0, arrived, created), state.metrics.app(cfg.name),
                         request.is_disconnected)
    binary = with_binary(answer, read[0][4])
    if binary is None:
        return answer
    head, blob = binary  # the binary data extension: the JSON, then the outputs' bytes
    return RawAnswer(head + blob, {"content-type": "application/octet-stream",
                                   "inference-header-content-length": str(len(head))})
