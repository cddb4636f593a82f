"""HTTP plumbing of the gateway that knows nothing of Kafka: API keys, body limit, metrics.

A pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which costs a task and a stream
per request) checks the API key before any route runs and counts every answer by route and
status. The body is read with a cap, so a client cannot make the gateway buffer more than
``max_body_bytes`` whatever its Content-Length says, and with a deadline, so a client that
trickles its body is answered 408 instead of holding a connection and a task for ever
(docs/design/0030-http-hardening.md).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.requests import ClientDisconnect, Request

from clipstream.errors import ClipstreamError
from frontend.dashboard import PAGE_PATHS
from frontend.metrics import GatewayMetrics

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

# paths a caller may reach without a key: a liveness probe must not need a secret
# (and the dashboard's page and scripts, which carry no data: its data route needs the key)
OPEN_PATHS: frozenset[str] = frozenset({"/healthz", "/v2/health/live"}) | PAGE_PATHS
# paths besides its apps' routes that a per-app key may reach
APP_KEY_PATHS: frozenset[str] = frozenset({"/readyz", "/openapi.json", "/docs", "/redoc", "/v2", "/v2/health/ready"})
# a body over the limit is still read (and dropped) up to this many bytes, so the caller, who
# is busy sending it, reads a 413 instead of a connection reset; beyond it the connection goes
DRAIN_BYTES = 64 << 20

# scope key: the app a fast route's request names, set by ``GatewayAPI`` for ``FastEndpoint``
FAST_APP = "clipstream.fast_app"
# the routes served ahead of FastAPI (``POST /<first>/<second>/{app}/<last>``): their names
FAST_ROUTES: dict[tuple[str, str, str], str] = {("v1", "apps", "predict"): "predict",
                                                ("v1", "apps", "feedback"): "feedback",
                                                ("v2", "models", "infer"): "v2-infer"}


class HTTPProblem(ClipstreamError):
    """An answer other than 200: status, one-line reason, extra headers."""

    def __init__(self, status: int, detail: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, dict(headers or {})


def key_of(headers: Mapping[str, str]) -> str | None:
    """The API key a request carries: ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def key_allowed(key: str | None, keys: Iterable[str]) -> bool:
    """Constant-time comparison against every configured key."""
    if key is None:
        return False
    ok = False
    for k in keys:
        ok |= hmac.compare_digest(key.encode(), k.encode())
    return ok


def app_of_path(path: str) -> str | None:
    """The app a ``/v1/apps/{app}[/...]`` path names, or an Open Inference Protocol
    ``/v2/models/{app}[/...]`` path (its model is an app), else None."""
    parts = path.split("/")
    if len(parts) >= 4 and parts[:3] in (["", "v1", "apps"], ["", "v2", "models"]) and parts[3]:
        return parts[3]
    return None


def key_apps(key: str | None, app_keys: Mapping[str, Iterable[str]]) -> frozenset[str] | None:
    """The apps a per-app ``key`` may use (constant-time over every configured key); None when
    it is not one of them."""
    if key is None:
        return None
    found: frozenset[str] | None = None
    for k, apps in app_keys.items():
        if hmac.compare_digest(key.encode(), k.encode()):
            found = frozenset(apps)
    return found


def error_key(path: str) -> str:
    """The error body's key: the Open Inference Protocol's clients read ``error``, ours ``detail``."""
    return "error" if path == "/v2" or path.startswith("/v2/") else "detail"


def route_label(path: str) -> str:
    """A bounded label for metrics: never the app name, which a caller chooses."""
    if path.startswith("/v1/apps/"):
        if path.endswith("/predict"):
            return "predict"
        if path.endswith("/feedback"):
            return "feedback"
        if path.count("/") == 3:
            return "metadata"
    if path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
        return path.lstrip("/")
    if path.startswith("/v2/models/"):
        return "v2-infer" if path.endswith("/infer") else "v2-model"
    if path == "/v2" or path.startswith("/v2/health/"):
        return "v2-server"
    return "other"


class GuardMiddleware:
    """API keys (401; 403 for a per-app key outside its apps) and per-route status counts,
    around every request. ``keys`` reach every route; ``app_keys`` maps a key to the apps whose
    routes it reaches (plus ``APP_KEY_PATHS``)."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], metrics: GatewayMetrics,
                 app_keys: Mapping[str, Iterable[str]] | None = None) -> None:
        self.app, self.keys, self.metrics = app, keys, metrics
        self.app_keys = dict(app_keys or {})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = route_label(path)
        status = {"code": 500}

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if (self.keys or self.app_keys) and path not in OPEN_PATHS:
                refusal = self._refusal(scope, path)
                if refusal is not None:
                    status_code, detail = refusal
                    await _send_json(counting_send, status_code, {error_key(path): detail},
                                     {"www-authenticate": 'Bearer realm="clipstream"'} if status_code == 401 else {})
                    return
            await self.app(scope, receive, counting_send)
        finally:
            self.metrics.requests.inc(route, str(status["code"]))


    def _refusal(self, scope: dict[str, Any], path: str) -> tuple[int, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        key = key_of(headers)
        if key_allowed(key, self.keys):
            return None
        apps = key_apps(key, self.app_keys)
        if apps is None:
            return 401, "missing or invalid API key"
        app = app_of_path(path)
        if (app is not None and app in apps) or (app is None and path in APP_KEY_PATHS):
            return None
        return 403, f"this API key is not allowed {'for app ' + repr(app) if app else 'on ' + path}"


def problem_body(path: str, exc: HTTPProblem) -> tuple[int, dict[str, str]]:
    """A refusal's status and JSON body as the path's callers read it: ``{"detail": ...}`` on
    ``/v1``, ``{"error": ...}`` on the Open Inference Protocol's paths, whose bad request is a
    400 where ``/v1`` says 422."""
    key = error_key(path)
    return (400 if key == "error" and exc.status == 422 else exc.status), {key: exc.detail}


class FastEndpoint:
    """A fast route (``FAST_ROUTES``: ``/v1`` predict and feedback, ``/v2`` infer) as a plain
    ASGI app, which ``GatewayAPI`` runs ahead of FastAPI with the app's name in the scope
    (``FAST_APP``).

    These are the gateway's hot paths, and under load its event loop is where callers queue, so
    FastAPI's per-request machinery (its telemetry check, dependency solving, the router,
    exception-wrapping middlewares, Request and Response objects) is kept off them
    (docs/design/0008). Here the handler gets the app name and a Starlette ``Request`` and
    returns the answer's JSON (sent with ``status``), or its bytes (``RawAnswer``), or raises
    ``HTTPProblem``; FastAPI keeps every other route, and the fast routes stay declared there so
    the OpenAPI schema still lists them.
    """

    def __init__(self, handler: Callable[[str, Request], Awaitable[dict[str, Any] | RawAnswer]],
                 status: int = 200) -> None:
        self.handler, self.status = handler, status

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            answer = await self.handler(scope[FAST_APP], Request(scope, receive))
        except HTTPProblem as exc:
            status, body = problem_body(scope.get("path", ""), exc)
            await _send_json(send, status, body, exc.headers)
            return
        if isinstance(answer, RawAnswer):
            raw = [(k.encode(), v.encode()) for k, v in answer.headers.items()]
            await send({"type": "http.response.start", "status": self.status,
                        "headers": [*raw, (b"content-length", str(len(answer.body)).encode())]})
            await send({"type": "http.response.body", "body": answer.body})
            return
        await _send_json(send, self.status, answer, {})


@dataclass(frozen=True, slots=True)
class RawAnswer:
    """An answer sent as these bytes with these headers, not as JSON (V2's binary outputs)."""

    body: bytes
    headers: dict[str, str]


class GatewayAPI(FastAPI):
    """FastAPI, with the ``FAST_ROUTES`` served by ``fast_paths`` (by route name) before
    FastAPI's own stack (see ``FastEndpoint`` for why)."""

    fast_paths: dict[str, ASGIApp] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        hit = fast_route(scope) if self.fast_paths and scope["type"] == "http" else None
        endpoint = self.fast_paths.get(hit[0]) if hit is not None else None
        if endpoint is not None:
            scope[FAST_APP] = hit[1]  # type: ignore[index]  # parsed once, here
            await endpoint(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def fast_route(scope: Mapping[str, Any]) -> tuple[str, str] | None:
    """The fast route (``FAST_ROUTES``) a request is for and the app it names (one non-empty
    path segment), else None."""
    if scope.get("method") != "POST":
        return None
    parts = scope.get("path", "").split("/")
    if len(parts) != 5 or parts[0] or not parts[3]:
        return None
    route = FAST_ROUTES.get((parts[1], parts[2], parts[4]))
    return None if route is None else (route, parts[3])


async def _send_json(send: Any, status: int, body: dict[str, Any], headers: Mapping[str, str]) -> None:
    # as Starlette's JSONResponse renders it: compact, UTF-8, no NaN (that is not JSON)
    data = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


# what a caller or an operator can do about a body over the limit
BODY_LIMIT_HINT = (" (CLIPSTREAM_GATEWAY_MAX_BODY_BYTES; a large input goes at its own size as raw bytes, "
                   "Content-Type: application/octet-stream, and one over the limit even so needs the operator to "
                   "raise it)")
RAW_BODY_LIMIT_HINT = (" (CLIPSTREAM_GATEWAY_MAX_BODY_BYTES: the gateway's operator raises it, and "
                       "CLIPSTREAM_MAX_RECORD_BYTES with it, for raw inputs this large)")


async def read_body(request: Request, limit: int, timeout_s: float | None = None, *, hint: str = BODY_LIMIT_HINT,
                    inflates: bool = False) -> bytes:
    """The request body, refusing (413) anything over ``limit`` bytes, declared or actual
    (chunked bodies too), and (408) a body not all received within ``timeout_s`` seconds;
    (415) a compressed one unless the route ``inflates`` it. ``hint``: what to do about a 413.

    A body over the limit is read to its end and dropped (up to ``DRAIN_BYTES``, within the
    same deadline) before the 413 goes out: a server that closes on unread bytes resets the
    connection, and the caller, still sending, never reads the answer."""
    if hint is BODY_LIMIT_HINT and request.headers.get("content-type", "").startswith("application/octet-stream"):
        hint = RAW_BODY_LIMIT_HINT  # already raw bytes: only the limit can change
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity") and not inflates:
        raise HTTPProblem(415, f"Content-Encoding {encoding[:32]!r} is not taken here: send the body uncompressed")
    declared = request.headers.get("content-length")
    size: int | None = None
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise HTTPProblem(400, "Content-Length is not a number") from None
    loop = asyncio.get_running_loop()
    due = None if timeout_s is None else loop.time() + timeout_s
    chunks: list[bytes] = []
    total = 0
    over = size is not None and size > limit
    if over and size is not None and size > DRAIN_BYTES:  # too much to read through: say so and close
        raise HTTPProblem(413, f"body of {size} bytes is over the limit of {limit} bytes{hint}",
                          {"connection": "close"})
    try:
        async with asyncio.timeout_at(due):
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    over = True
                if over:
                    if total > DRAIN_BYTES:
                        break
                    continue
                chunks.append(chunk)
    except ClientDisconnect:  # gone before its body ended (or its body was no HTTP): no one reads an answer
        raise HTTPProblem(400, "the request ended before its body did", {"connection": "close"}) from None
    except TimeoutError:
        if not over:
            raise HTTPProblem(408, f"request body not received within {timeout_s:g} s",
                              {"connection": "close"}) from None
    if over:
        what = f"body of {size} bytes" if size is not None else "body"
        raise HTTPProblem(413, f"{what} is over the limit of {limit} bytes{hint}", {"connection": "close"})
    return b"".join(chunks)


def parse_json(body: bytes) -> Any:
    """JSON without NaN/Infinity (not JSON, and no model wants them): 422 with the reason."""
    if not body:
        raise HTTPProblem(422, "empty body: expected a JSON object")
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise HTTPProblem(422, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise HTTPProblem(422, "malformed JSON: nested too deeply") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
