"""The Open Inference Protocol over gRPC (KServe's ``GRPCInferenceService``), beside the
gateway's HTTP routes and on its event loop, for the clients of Triton and MLServer that speak
gRPC. A request is read into what an HTTP infer asks (``v2_messages.Parsed``) and answered by
the same ``v2.infer``, so both fronts share every check, the admission and the query path; the
answers go back as raw output contents, as Triton sends them (docs/design/0114).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import numpy as np

from clipstream.clock import now_us
from frontend.gateway_http import HTTPProblem, key_allowed, key_apps, key_of
from frontend.settings import GatewaySettings
from frontend.state import GatewayState
from frontend.v2 import app_ready, infer, model_metadata, server_metadata, server_ready, unversioned
from frontend.v2_messages import (INPUTS, Parsed, bad, checked_input, columns, examples, predict_request, read_rows,
                                  wanted)
from frontend.v2_proto import MESSAGES, METHODS, SERVICE, STREAM
from registry.spec import TensorSpec
from schemas.tensor import packed

log = logging.getLogger(__name__)

# the HTTP status of a refusal as the gRPC status its clients read
CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED, 415: grpc.StatusCode.INVALID_ARGUMENT, 499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# where each method's requests are counted (``clipstream_gateway_requests``), by HTTP status
ROUTES = {"ServerLive": "grpc-server", "ServerReady": "grpc-server", "ServerMetadata": "grpc-server",
          "ModelReady": "grpc-model", "ModelMetadata": "grpc-model", "ModelInfer": "grpc-infer",
          "ModelStreamInfer": "grpc-stream"}  # a stream's requests, each counted
OPEN_METHODS = frozenset({"ServerLive"})  # as /v2/health/live: a liveness probe needs no secret
SERVER_METHODS = frozenset({"ServerReady", "ServerMetadata"})  # as /v2: a per-app key reaches them
# the typed contents field that carries each datatype's values (FP16 has none: raw only)
CONTENTS = {"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
            "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
            "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
RECEIVE_FACTOR = 4  # gRPC reads messages up to this many times the body limit, to refuse them in words
# a stream's requests read ahead of their answers being sent: past it, the stream is read no further
# until the caller takes answers, so a caller that only writes holds this much of the gateway at most
STREAM_WINDOW = 256
# calls gRPC holds for the gateway's loop to take up. Past gRPC's own default (1,000) it cancels
# calls at random, with no reason and uncounted, before the gateway sees them; under this limit
# a burst reaches the admission, which answers what it cannot take with a counted 503
PENDING_CALLS = 10_000
# Triton's methods beyond the protocol's, and what to call instead
NOT_OFFERED = {
    "ModelConfig": "clipstream keeps no model config: ModelMetadata gives the app's inputs and outputs, and "
                   "batching is the pipeline's (an app's SLO and its models' max_batch_size)",
    "ModelStatistics": "the gateway's /metrics gives each app's queries, answers, defaults and latency",
    "RepositoryIndex": "models are deployed with clipstream's commands (deploy-model, link): see its README",
    "RepositoryModelLoad": "models are deployed with clipstream's commands (deploy-model, link): see its README",
    "RepositoryModelUnload": "models are removed with clipstream's commands: see its README",
}
_NUMPY = {"BOOL": "?", "INT64": "<i8", "FP32": "<f4", "FP64": "<f8"}  # the output tensors' datatypes


def parse_request(request: Any, spec: TensorSpec | None, max_record_bytes: int) -> Parsed:
    """A ``ModelInferRequest`` -> what it asks, read as an HTTP infer is: each input from
    ``raw_input_contents`` (tritonclient's way) or from its typed ``contents``; several inputs
    are the columns of a table."""
    inputs, raw = request.inputs, request.raw_input_contents
    if not inputs:
        raise bad(INPUTS)
    if raw and len(raw) != len(inputs):
        raise bad(f"raw_input_contents holds {len(raw)} tensors, and there are {len(inputs)} inputs")

    def read(i: int, spec: TensorSpec | None) -> np.ndarray:
        tensor = inputs[i]
        shape, datatype = list(tensor.shape), tensor.datatype
        shape, spec = checked_input(shape, datatype, spec)
        if raw:
            if tensor.HasField("contents"):
                raise bad("the input has both contents and raw_input_contents: send its values in one of them")
            return read_rows(shape, datatype, spec, blob=raw[i])
        if datatype not in CONTENTS:
            raise bad(f"{datatype} has no typed contents field: send it in raw_input_contents")
        field = CONTENTS[datatype]
        given = [f.name for f, _ in tensor.contents.ListFields()]
        if given and field not in given:  # the values are there, in another type's field
            raise bad(f"a {datatype} input's values go in contents.{field}, and this one has them in "
                      f"contents.{given[0]}: send them in {field}, or set the datatype they are")
        if datatype == "BYTES":
            return read_rows(shape, datatype, spec, blob=packed(list(tensor.contents.bytes_contents)))
        return read_rows(shape, datatype, spec, values=list(getattr(tensor.contents, field)))

    rows = read(0, spec) if len(inputs) == 1 else columns([t.name for t in inputs], spec, read)
    params = {k: _value(v) for k, v in request.parameters.items() if k in ("context", "slo_ms")}
    asked = wanted([{"name": o.name, "parameters": {k: _value(v) for k, v in o.parameters.items()}}
                    for o in request.outputs]) if request.outputs else []
    return predict_request(params), examples(rows, max_record_bytes), request.id or None, asked, frozenset()


def _value(param: Any) -> Any:
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def infer_reply(answer: dict[str, Any], reply: Any = None) -> Any:
    """An infer's answer (``v2_messages.infer_response``) as a ``ModelInferResponse`` (written
    into ``reply`` where given), each output's values in ``raw_output_contents``: little-endian
    numbers, BYTES as each element's uint32 length and UTF-8 bytes."""
    if reply is None:
        reply = MESSAGES["ModelInferResponse"]()
    reply.model_name, reply.id = answer["model_name"], answer.get("id", "")
    for out in answer["outputs"]:
        reply.outputs.add(name=out["name"], datatype=out["datatype"], shape=out["shape"])
        if out["datatype"] == "BYTES":
            blob = packed([str(v) for v in out["data"]])
        else:
            blob = np.asarray(out["data"], dtype=_NUMPY[out["datatype"]]).tobytes()
        reply.raw_output_contents.append(blob)
    return reply


def metadata_reply(meta: dict[str, Any]) -> Any:
    reply = MESSAGES["ModelMetadataResponse"](name=meta["name"], versions=meta["versions"], platform=meta["platform"])
    for side in ("inputs", "outputs"):
        for t in meta[side]:
            getattr(reply, side).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
    return reply


class _Unanswered(grpc.GenericRpcHandler):
    """Any other method of the service (Triton's own: model config, statistics, streaming,
    shared memory): UNIMPLEMENTED saying what to use instead, counted, where gRPC would only
    say "Method not found!"."""

    def __init__(self, owner: "InferenceService") -> None:
        self.owner = owner

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:  # type: ignore[override]
        prefix = f"/{SERVICE}/"
        if not details.method.startswith(prefix):
            return None
        name = details.method[len(prefix):]
        why = NOT_OFFERED.get(name, "clipstream answers the Open Inference Protocol's methods only")

        async def refuse(requests: Any, context: Any) -> None:
            keyless = self.owner._refusal("ServerMetadata", None, context)  # a caller without a key hears that first
            if keyless is not None:
                self.owner.state.metrics.requests.inc("grpc-other", str(keyless.status))
                await context.abort(CODES[keyless.status], keyless.detail)
            self.owner.state.metrics.requests.inc("grpc-other", "501")
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not offered: {why}")

        return grpc.stream_stream_rpc_method_handler(refuse)


class InferenceService:
    """The protocol's methods over the gateway's state, each behind the gateway's API keys
    (``authorization: Bearer <key>`` or ``x-api-key`` metadata) and counted as HTTP requests are."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def handler(self) -> grpc.GenericRpcHandler:
        methods = {}
        for name, (request, response) in METHODS.items():
            methods[name] = grpc.unary_unary_rpc_method_handler(
                self._guarded(name, getattr(self, name)), request_deserializer=MESSAGES[request].FromString,
                response_serializer=MESSAGES[response].SerializeToString)
        for name, (request, response) in STREAM.items():
            methods[name] = grpc.stream_stream_rpc_method_handler(
                getattr(self, name), request_deserializer=MESSAGES[request].FromString,
                response_serializer=MESSAGES[response].SerializeToString)
        return grpc.method_handlers_generic_handler(SERVICE, methods)

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 (the protocol's names)
        return MESSAGES["ServerLiveResponse"](live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return MESSAGES["ServerReadyResponse"](ready=server_ready(self.state))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return MESSAGES["ServerMetadataResponse"](**server_metadata())

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        ready, _ = await app_ready(self.state, self._app(request.name, request.version))
        return MESSAGES["ModelReadyResponse"](ready=ready)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return metadata_reply(model_metadata(self.state, self._app(request.name, request.version)))

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return infer_reply(await self._infer(request, context))

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:  # noqa: N802
        """Each request on the stream asked as ``ModelInfer`` asks it, at once, and answered on
        the stream as soon as its answer is ready, so answers may pass one another: a caller
        matches them by ``id``, as Triton's callers do. A refused request is answered with an
        ``error_message`` (and its ``id``), and the stream goes on."""
        answers: asyncio.Queue[Any] = asyncio.Queue()
        asked: set[asyncio.Task[None]] = set()
        room = asyncio.Semaphore(STREAM_WINDOW)

        async def one(request: Any) -> None:
            answers.put_nowait(await self._streamed(request, context))

        async def read() -> None:
            try:
                async for request in requests:
                    await room.acquire()
                    task = asyncio.create_task(one(request))
                    asked.add(task)
                    task.add_done_callback(asked.discard)
                if asked:  # the caller has sent its last request: answer those in flight
                    await asyncio.wait(set(asked))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
                room.release()
            reader.result()  # a stream that broke while being read ends with its error
        finally:
            for task in (reader, *asked):
                task.cancel()

    async def _streamed(self, request: Any, context: Any) -> Any:
        reply = MESSAGES["ModelStreamInferResponse"]()
        try:
            answer = await self._counted("ModelStreamInfer", self._infer, request, context)
            infer_reply(answer, reply.infer_response)
        except HTTPProblem as exc:
            wait = exc.headers.get("Retry-After")
            reply.error_message = exc.detail + (f" (retry after {wait} s)" if wait else "")
            reply.infer_response.model_name, reply.infer_response.id = request.model_name, request.id
        return reply

    async def _infer(self, request: Any, context: Any) -> dict[str, Any]:
        t0, arrived = time.perf_counter(), now_us()
        state = self.state
        size = request.ByteSize()
        if size > state.gw.max_body_bytes:
            raise HTTPProblem(413, f"the request is {size} bytes, over the limit of {state.gw.max_body_bytes} "
                                   f"(CLIPSTREAM_GATEWAY_MAX_BODY_BYTES): send the batch as several requests")
        cfg = self._app(request.model_name, request.model_version)
        parse = functools.partial(parse_request, request, state.input_spec(cfg), state.settings.max_record_bytes)

        async def gone() -> bool:
            return bool(context.cancelled())

        return await infer(state, cfg, parse, size, (t0, arrived, arrived), state.metrics.app(cfg.name), gone)

    def _app(self, name: str, version: str) -> Any:
        if version:
            raise unversioned(name)
        return self.state.app_config(name)

    def _refusal(self, method: str, request: Any, context: Any) -> HTTPProblem | None:
        gw = self.state.gw
        if method in OPEN_METHODS or not (gw.api_keys or gw.app_keys):
            return None
        key = key_of({k.lower(): v for k, v in context.invocation_metadata() or () if isinstance(v, str)})
        if key_allowed(key, gw.api_keys):
            return None
        apps = key_apps(key, gw.app_keys)
        if apps is None:
            return HTTPProblem(401, "missing or invalid API key: send it as 'authorization: Bearer <key>' metadata")
        app = getattr(request, "model_name", None) or getattr(request, "name", None)
        if method in SERVER_METHODS or app in apps:
            return None
        return HTTPProblem(403, f"this API key is not allowed for app {app[:64]!r}")

    async def _counted(self, method: str, call: Callable[[Any, Any], Awaitable[Any]], request: Any,
                       context: Any) -> Any:
        """``call``'s reply once the caller's key is let in, counted under the method's route by
        the HTTP status it maps to; any refusal or failure raised as an ``HTTPProblem``."""
        status = 200
        try:
            refusal = self._refusal(method, request, context)
            if refusal is not None:
                raise refusal
            return await call(request, context)
        except HTTPProblem as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = 499
            raise
        except Exception:
            status = 500
            log.exception("gRPC %s failed", method)
            raise HTTPProblem(500, "the gateway failed on this request: see its log") from None
        finally:
            self.state.metrics.requests.inc(ROUTES[method], str(status))

    def _guarded(self, method: str, call: Callable[[Any, Any], Awaitable[Any]]
                 ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def guarded(request: Any, context: Any) -> Any:
            try:
                return await self._counted(method, call, request, context)
            except HTTPProblem as exc:
                trailer = tuple((k.lower(), v) for k, v in exc.headers.items())
                await context.abort(CODES.get(exc.status, grpc.StatusCode.INTERNAL), exc.detail, trailer)

        return guarded


async def start_grpc(state: GatewayState, gw: GatewaySettings, reuse_port: bool,
                     grace_s: float) -> tuple[grpc.aio.Server, int]:
    """The protocol's gRPC server on ``CLIPSTREAM_GATEWAY_GRPC_PORT`` (TLS as the HTTP routes'),
    started on the running loop; it and the port bound. As the gateway stops, its calls in
    flight get ``grace_s`` to be answered. A message over the body limit is refused with the
    setting to raise, up to ``RECEIVE_FACTOR`` times the limit; gRPC refuses larger ones itself
    before they are read."""
    service = InferenceService(state)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", RECEIVE_FACTOR * gw.max_body_bytes),
                                      ("grpc.so_reuseport", 1 if reuse_port else 0),
                                      ("grpc.server.max_pending_requests", PENDING_CALLS),
                                      ("grpc.server.max_pending_requests_hard_limit", 2 * PENDING_CALLS)])
    server.add_generic_rpc_handlers((service.handler(), _Unanswered(service)))
    state.draining.append(lambda: server.stop(grace_s))
    host = f"[{gw.host}]" if ":" in gw.host else gw.host
    address = f"{host}:{gw.grpc_port}"
    if gw.tls_cert is not None and gw.tls_key is not None:
        pair = (gw.tls_key.read_bytes(), gw.tls_cert.read_bytes())
        port = server.add_secure_port(address, grpc.ssl_server_credentials([pair]))
    else:
        port = server.add_insecure_port(address)
    await server.start()
    return server, port
