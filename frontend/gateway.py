"""The REST gateway: sync callers in, QueryEvents out, the selector's Response (or the default) back.

A caller's request becomes a ``QueryEvent`` whose reply target is this instance's own reply
topic; the handler then awaits a future that the reply thread resolves by query id. The wait is
bounded by the deadline plus ``reply_margin_ms``: the selector answers AT the deadline with what
has arrived (Clipper's straggler cutoff), so the margin only covers the hop back; if nothing
comes, the caller gets the app's ``default_output`` with ``default: true`` and the late reply is
counted and dropped. A ``single`` app's query skips the selector: it goes to its model as a
``ModelRequest`` and the model's prediction is the answer (``frontend.direct``, docs/design/0083).
Nothing on the event loop blocks: produce only enqueues, and every librdkafka call that waits
runs in a thread (see ``frontend.gateway_kafka``).

``create_app`` takes the registry and the bus as arguments so the HTTP layer (keys, limits,
validation, mapping) is tested with fakes and no broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError, InfraError
from clipstream.loaded import key_of as loaded_key
from clipstream.redisclient import RedisGuard, async_client, sync_client
from clipstream.saver import GATHER_S, PredictionSaver
from clipstream.settings import Settings, get_settings
from frontend import v2
from frontend.ask import Asked, answered, ask
from frontend.dashboard import mount_dashboard
from frontend.feedback import feedback as feedback_route
from frontend.feedback import stored_app
from frontend.gateway_http import (
    FastEndpoint,
    GatewayAPI,
    GuardMiddleware,
    HTTPProblem,
    error_key,
    problem_body,
    read_body,
)
from frontend.http_protocol import RECEIVED_US
from frontend.reach import CHECK_TIMEOUT_S
from frontend.direct import direct_model
from frontend.gateway_kafka import KafkaBus
from frontend.gateway_models import (
    Accepted,
    AppMetadata,
    ErrorBody,
    FeedbackRequest,
    PredictRequest,
    PredictResponse,
)
from frontend.metadata import app_metadata
from frontend.predict_body import BINARY, OFFLOAD_BYTES, parse_binary, parse_predict
from frontend.settings import GatewaySettings, get_gateway_settings
from frontend.state import Bus, GatewayState, Registry
from registry.topic import AppConfig, RegistryFollower

log = logging.getLogger(__name__)



def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ErrorBody} for c in codes}


def _body_doc(model: type, binary: bool = False) -> dict[str, Any]:
    # the body is read by hand (size cap, strict parsing), so declare its schema for OpenAPI
    content: dict[str, Any] = {"application/json": {"schema": model.model_json_schema()}}
    if not binary:
        return {"requestBody": {"required": True, "content": content}}
    content[BINARY] = {"schema": {"type": "string", "format": "binary"}}  # one example's raw bytes
    query = [{"name": name, "in": "query", "required": False, "schema": schema,
              "description": f"With a raw-bytes body: the JSON body's `{name}`."}
             for name, schema in (("context", {"type": "string", "minLength": 1, "maxLength": 256}),
                                  ("slo_ms", {"type": "number", "exclusiveMinimum": 0, "maximum": 60000}))]
    return {"requestBody": {"required": True, "content": content}, "parameters": query}


def create_app(
    gw: GatewaySettings | None = None,
    settings: Settings | None = None,
    *,
    registry: Registry | None = None,
    bus: Bus | None = None,
    redis_ping: Callable[[], Awaitable[bool]] | None = None,
) -> FastAPI:
    """The gateway application. Without ``registry``/``bus`` it connects to Kafka and Redis at
    startup (blocking work in threads); with them it uses what it was given."""
    state = GatewayState(gw or get_gateway_settings(), settings or get_settings())
    state.registry, state.bus, state.redis_ping = registry, bus, redis_ping
    app = GatewayAPI(
        title="clipstream gateway",
        version="1",
        description="Clipper-style prediction serving: predict within an SLO, send feedback.",
        lifespan=_lifespan(state),
    )
    app.state.gateway = state
    _add_guards(app, state)
    _add_api_routes(app, state)
    _add_ops_routes(app, state)
    v2.add_routes(app, state)
    mount_dashboard(app, state.metrics, lambda: _slos(state), lambda: _direct_apps(state))
    return app


def _lifespan(state: GatewayState) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The app's startup and shutdown: connect what was not injected and watch the loop's lag,
    undoing both in reverse order when the server stops."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            try:
                await _connect(state, stack)
            except Exception as exc:  # kept for ``clipstream gateway``, which prints it as one line
                app.state.startup_error = startup_failure(exc)
                raise
            for watch in (state.watch_loop_lag(), state.watch_saturation(), _watch_kafka(state)):
                stack.callback(asyncio.create_task(watch).cancel)
            yield
            for drain in state.draining:
                await drain()

    return lifespan


async def _watch_kafka(state: GatewayState) -> None:
    """Feed ``state.reach`` a metadata round trip a second, off the event loop."""
    bus = state.bus
    if bus is None:
        return
    loop = asyncio.get_running_loop()
    await state.reach.watch(lambda: loop.run_in_executor(None, bus.kafka_ok, CHECK_TIMEOUT_S))


def startup_failure(exc: Exception) -> str:
    """One line for a gateway that could not connect at startup, naming the cause and what to do:
    an operator reads this instead of uvicorn's tracebacks."""
    if isinstance(exc, ClipstreamError):  # our own messages already say what to do
        return f"the gateway could not start: {exc}"
    return (f"the gateway could not start: {type(exc).__name__}: {exc}; check Kafka and Redis with "
            "`clipstream infra status` and the CLIPSTREAM_KAFKA_BOOTSTRAP / CLIPSTREAM_REDIS_URL settings")


def _add_guards(app: GatewayAPI, state: GatewayState) -> None:
    """API keys and request metrics on every route, including the predict fast path that
    ``GatewayAPI`` serves before the router; problems become JSON ``detail`` bodies."""
    app.add_middleware(GuardMiddleware, keys=state.gw.api_keys, metrics=state.metrics, app_keys=state.gw.app_keys)
    # keys and metrics apply to the fast routes as to every other route
    endpoints = {"predict": FastEndpoint(lambda name, request: _predict(state, name, request)),
                 "feedback": FastEndpoint(lambda name, request: feedback_route(state, name, request), 202),
                 "v2-infer": FastEndpoint(lambda name, request: v2.infer_http(state, name, request))}
    app.fast_paths = {route: GuardMiddleware(endpoint, keys=state.gw.api_keys, metrics=state.metrics,
                                             app_keys=state.gw.app_keys) for route, endpoint in endpoints.items()}

    @app.exception_handler(HTTPProblem)
    async def _problem(request: Request, exc: HTTPProblem) -> JSONResponse:
        status, body = problem_body(request.url.path, exc)
        return JSONResponse(body, status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # the router's own 404 and 405, in the body the path's clients read
        return JSONResponse({error_key(request.url.path): exc.detail}, exc.status_code, headers=exc.headers)


def _add_api_routes(app: GatewayAPI, state: GatewayState) -> None:
    """The callers' routes, predict and feedback, declared with their bodies and errors so the
    OpenAPI schema documents them."""

    @app.post(
        "/v1/apps/{app}/predict",
        response_model=PredictResponse,
        responses=_errors(400, 401, 403, 404, 408, 413, 422, 503),
        openapi_extra=_body_doc(PredictRequest, binary=True),
        summary="Predict within the SLO (the app's default output when nothing answers in time)",
    )
    async def predict(app: str, request: Request) -> JSONResponse:
        # declared for the OpenAPI schema: GatewayAPI serves these requests before the router
        return JSONResponse(await _predict(state, app, request))

    @app.get("/v1/apps/{app}", response_model=AppMetadata, responses=_errors(401, 403, 404),
             summary="What the app takes and answers: its input's dtype and shape, its output and models")
    async def metadata(app: str) -> dict[str, Any]:
        return app_metadata(state, app)

    @app.post(
        "/v1/apps/{app}/feedback",
        status_code=202,
        response_model=Accepted,
        responses=_errors(400, 401, 403, 404, 408, 413, 422, 503),
        openapi_extra=_body_doc(FeedbackRequest),
        summary="The true label of, or a reward for, an earlier query",
    )
    async def feedback(app: str, request: Request) -> JSONResponse:
        # declared for the OpenAPI schema: GatewayAPI serves these requests before the router
        return JSONResponse(await feedback_route(state, app, request), 202)


def _add_ops_routes(app: GatewayAPI, state: GatewayState) -> None:
    """The operators' routes: liveness, readiness and Prometheus metrics, apart from the
    callers' API so each group reads on its own."""

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Connected to Kafka with the registry loaded; whether Redis answers",
             responses={503: {"description": "not ready; `checks` says what fails"}})
    async def readyz() -> JSONResponse:
        checks = await _readiness(state)
        # Redis is a cache (docs/design/0016): without it queries are still answered, so a
        # load balancer must not take this gateway out; `checks` still says it is away
        ok = checks["registry"] and checks["kafka"]
        return JSONResponse({"ready": ok, "checks": checks}, 200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")


def _direct_apps(state: GatewayState) -> list[str]:
    """The apps whose queries go to their one model straight (docs/design/0083)."""
    apps = state.registry.view().apps.values() if state.registry else ()
    return [cfg.name for cfg in apps if direct_model(cfg, state.gw.direct) is not None]


def _slos(state: GatewayState) -> dict[str, float]:
    """Each app's SLO for the dashboard, read from the registry at each refresh so that apps
    added later appear (none before the registry is connected)."""
    return {name: cfg.slo_ms for name, cfg in (state.registry.view().apps.items() if state.registry else ())}


async def _predict(state: GatewayState, app_name: str, request: Request) -> dict[str, Any]:
    t0 = time.perf_counter()
    arrived = now_us()
    # the caller's wait began when the server started reading the request, not at this line
    created = min(arrived, request.scope.get(RECEIVED_US, arrived))
    cfg = state.app_config(app_name)
    counts = state.metrics.app(cfg.name)  # (queries, prediction, default, refused, latency)
    counts[0].inc()
    try:
        return await _predict_known(state, cfg, request, t0, arrived, created, counts)
    except HTTPProblem as exc:
        if exc.status == 503:
            counts[3].inc()
        raise


async def _predict_known(state: GatewayState, cfg: AppConfig, request: Request, t0: float, arrived: int,
                         created: int, counts: tuple[Any, ...]) -> dict[str, Any]:
    if (lost := state.kafka_problem()) is not None:
        raise state.overloaded(lost)
    # the body first, within its deadline: a caller trickling it holds no admission slot
    state.reading += 1
    try:
        raw = await read_body(request, state.gw.max_body_bytes, state.gw.body_timeout_s)
    finally:
        state.reading -= 1
    if state.late_for(cfg.slo_ms):
        raise state.overloaded(f"gateway overloaded (event loop {state.loop_lag_ms:.0f} ms late)")
    inflight, waited_ms = await state.admit(cfg.name, cfg.slo_ms)  # the slot is held from parsing to the answer
    query_id = uuid.uuid4().hex
    try:
        spec, limit = state.input_spec(cfg), state.settings.max_record_bytes
        if request.headers.get("content-type", "").startswith(BINARY):
            req, tensor = parse_binary(raw, request.query_params, spec, limit)
        elif len(raw) > OFFLOAD_BYTES:
            # an image-sized input costs milliseconds of parsing: keep the loop answering others
            req, tensor = await asyncio.get_running_loop().run_in_executor(None, parse_predict, raw, spec, limit)
        else:
            req, tensor = parse_predict(raw, spec, limit)
        asked = Asked(cfg, req, t0, arrived, created)
        reply = await ask(state, asked, query_id, tensor)
    finally:
        state.release()
    return answered(state, asked, query_id, reply, waited_ms, inflight, counts)


async def _readiness(state: GatewayState) -> dict[str, bool]:
    loop = asyncio.get_running_loop()
    registry_ok = False
    if state.registry is not None:
        try:
            state.registry.wait_ready(0)
            registry_ok = True
        except InfraError:
            registry_ok = False
    kafka_ok = False
    if state.bus is not None:
        kafka_ok = await loop.run_in_executor(None, state.bus.kafka_ok, 2.0)
    redis_ok = False
    if state.redis_ping is not None:
        try:
            redis_ok = bool(await asyncio.wait_for(state.redis_ping(), 2.0))
        except Exception:  # any failure to PING is "not ready", whatever the client raised
            redis_ok = False
    return {"registry": registry_ok, "kafka": kafka_ok, "redis": redis_ok}


async def _connect(state: GatewayState, stack: contextlib.AsyncExitStack) -> None:
    """Start whatever was not injected: registry follower, Kafka bus, Redis client."""
    loop = asyncio.get_running_loop()
    if state.registry is None:
        follower = RegistryFollower(state.settings)
        await loop.run_in_executor(None, follower.start)
        stack.callback(follower.stop)
        await loop.run_in_executor(None, follower.wait_ready, 30.0)
        state.registry = follower
    if state.bus is None:
        bus = KafkaBus(state.settings, state.gw.instance)
        await loop.run_in_executor(None, bus.start, loop)
        # a random instance id is never reused: its reply topic goes when the process does
        stack.callback(bus.close, "instance" not in state.gw.model_fields_set)
        state.bus = bus
    if state.redis_ping is None:
        client = async_client(state.settings)  # bounded waits (CLIPSTREAM_REDIS_TIMEOUT_MS), as every stage's
        stack.push_async_callback(client.aclose)
        state.redis_ping = client.ping
        if state.stored is None:
            state.stored = lambda qid: stored_app(client, qid)  # whose query it was, for feedback
        if state.loaded is None:
            state.loaded = lambda model: client.hgetall(loaded_key(state.settings.topic_prefix, model))
        if state.saver is None and state.gw.direct:
            state.saver = await loop.run_in_executor(None, _saver, state.settings)
            stack.callback(state.saver.close)
    assert state.bus is not None
    state.bus.on_late = state.metrics.late_replies
    state.bus.on_delivery_error = state.metrics.delivery_errors.inc


def _saver(settings: Settings) -> PredictionSaver:
    """The writer of answers made from a model's prediction straight, with the selector's TTL
    and gathering (blocking: it connects)."""
    client = sync_client(settings)
    guard = RedisGuard(client.ping, name="gateway")
    return PredictionSaver(client, settings.stored_predictions_ttl_s, guard, gather_s=GATHER_S).start()
