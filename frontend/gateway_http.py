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
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from fastapi import FastAPI
from starlette.requests import ClientDisconnect, Request

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError
from frontend.dashboard import PAGE_PATHS
from frontend.metrics import GatewayMetrics

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

# paths a caller may reach without a key: a liveness probe must not need a secret
# (and the dashboard's page and scripts, which carry no data: its data route needs the key)
OPEN_PATHS: frozenset[str] = frozenset({"/healthz"}) | PAGE_PATHS
# paths besides its apps' routes that a per-app key may reach
APP_KEY_PATHS: frozenset[str] = frozenset({"/readyz", "/openapi.json", "/docs"})
# a body over the limit is still read (and dropped) up to this many bytes, so the caller, who
# is busy sending it, reads a 413 instead of a connection reset; beyond it the connection goes
DRAIN_BYTES = 64 << 20

# scope key: when the server began parsing the request (epoch us), set by ``stamped_protocol``
RECEIVED_US = "clipstream.received_us"
# scope key: the app a predict request names, set by ``GatewayAPI`` for ``PredictEndpoint``
PREDICT_APP = "clipstream.predict_app"


def stamped_protocol(max_head_bytes: int = 32 * 1024, head_timeout_s: float = 10.0) -> type | None:
    """uvicorn's httptools protocol, stamping each request's scope when its parsing begins.

    Under load a request can wait in the event loop for milliseconds between its bytes
    arriving and its handler starting; the caller's clock runs all along, so the deadline
    (and the wait for the reply) counts from the stamp, not from the handler. None when
    httptools is missing: the handler's own start is used then (and uvicorn's h11 protocol
    answers a request it cannot parse in plain text).

    A request the parser refuses (``Content-Length: abc``, no HTTP at all) never reaches the
    app; uvicorn answers it 400 in plain text, and this protocol in the gateway's JSON
    (``parse_error_response``), still closing the connection. So does a request whose line and
    headers pass ``max_head_bytes`` (431), or take longer than ``head_timeout_s`` from their
    first byte (408): a client that never ends its headers would otherwise hold memory, or a
    connection, for as long as it likes, before any route or API key is looked at.
    """
    try:
        from httptools import HttpParserCallbackError, HttpParserInvalidURLError
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class StampedHttpToolsProtocol(HttpToolsProtocol):
        head_bytes = 0  # received while a head is read (its body too, in its last read); -1 between heads
        head_size = 0  # of the head being read, as the parser hands it over
        head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._time_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._untime_head()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.head_bytes >= 0:
                if self.head_bytes == 0:
                    self._time_head()
                self.head_bytes += len(data)
            super().data_received(data)
            # judged once the parser has read the chunk: a head it completed is within bounds
            # whatever body bytes came with it (-1 then)
            if self.head_bytes > max_head_bytes and not self.transport.is_closing():
                self._refuse(431, "Request Header Fields Too Large",
                             f"the request line and headers are over {max_head_bytes} bytes")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[RECEIVED_US] = now_us()  # type: ignore[literal-required]
            self.head_size = 0

        # a head that arrives whole in one read is measured as the parser hands it over
        def on_url(self, url: bytes) -> None:
            self._measure(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._measure(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _measure(self, size: int) -> None:
            self.head_size += size
            if self.head_size > max_head_bytes:
                raise _HeadTooLarge  # the parser stops; ``send_400_response`` answers 431

        def on_headers_complete(self) -> None:
            self.head_bytes = -1
            self._untime_head()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self.head_bytes = 0  # what comes next is the next request's head

        def _time_head(self) -> None:
            self._untime_head()
            self.head_timer = self.loop.call_later(head_timeout_s, self._head_too_slow)

        def _untime_head(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_too_slow(self) -> None:
            self.head_timer = None
            if self.head_bytes >= 0 and not self.transport.is_closing():
                self._refuse(408, "Request Timeout", f"the request line and headers did not arrive within "
                                                     f"{head_timeout_s:g} s")

        def _refuse(self, status: int, phrase: str, detail: str) -> None:
            self._untime_head()
            self.head_bytes = -1
            self.transport.write(error_response(status, phrase, detail, self.server_state.default_headers))
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            # uvicorn calls this while it handles the parser's error, which names the fault
            error = sys.exception()
            if isinstance(error, HttpParserCallbackError) and isinstance(error.__context__, _HeadTooLarge):
                self._refuse(431, "Request Header Fields Too Large",
                             f"the request line and headers are over {max_head_bytes} bytes")
                return
            reason = str(error or "")
            if isinstance(error, HttpParserCallbackError):  # a callback of uvicorn's refused what it read
                reason = "the URL is not valid" if isinstance(error.__context__, HttpParserInvalidURLError) else ""
            self.transport.write(parse_error_response(reason, self.server_state.default_headers))
            self.transport.close()

    return StampedHttpToolsProtocol


class _HeadTooLarge(ClipstreamError):
    """Raised in a parser callback to stop reading a request whose head is over the limit."""


# the parser's reasons that a caller may not read at once, said plainly
_PARSE_REASONS = {"Invalid character in Content-Length": "Content-Length must be a whole number of bytes"}


def parse_error_response(reason: str, default_headers: Iterable[tuple[bytes, bytes]] = ()) -> bytes:
    """The raw 400 for a request the HTTP parser refused, for ``reason`` (the parser's words;
    empty when it gave none)."""
    reason = reason.strip()
    detail = "the request is not valid HTTP/1.1" + (f": {_PARSE_REASONS.get(reason, reason)}" if reason else "")
    return error_response(400, "Bad Request", detail, default_headers)


def error_response(status: int, phrase: str, detail: str, default_headers: Iterable[tuple[bytes, bytes]] = ()) -> bytes:
    """A raw answer to a request no route saw: the gateway's JSON ``{"detail": ...}`` and
    ``connection: close``, after the server's own headers (date, server)."""
    body = json.dumps({"detail": detail}, separators=(",", ":")).encode()
    head = [f"HTTP/1.1 {status} {phrase}".encode(), *(name + b": " + value for name, value in default_headers),
            b"content-type: application/json", b"content-length: " + str(len(body)).encode(),
            b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


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
    """The app a ``/v1/apps/{app}/...`` path names, else None."""
    parts = path.split("/")
    if len(parts) >= 5 and parts[:3] == ["", "v1", "apps"] and parts[3]:
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


def route_label(path: str) -> str:
    """A bounded label for metrics: never the app name, which a caller chooses."""
    if path.startswith("/v1/apps/"):
        if path.endswith("/predict"):
            return "predict"
        if path.endswith("/feedback"):
            return "feedback"
    if path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
        return path.lstrip("/")
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
                    await _send_json(counting_send, status_code, {"detail": detail},
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


class PredictEndpoint:
    """``POST /v1/apps/{app}/predict`` as a plain ASGI app, which ``GatewayAPI`` runs ahead of
    FastAPI with the app's name in the scope (``PREDICT_APP``).

    The predict route is the gateway's hot path, and under load its event loop is where callers
    queue, so FastAPI's per-request machinery (its telemetry check, dependency solving, the
    router, exception-wrapping middlewares, Request and Response objects) is kept off it
    (docs/design/0008). Here the handler gets the app name and a Starlette ``Request`` and
    returns the answer's JSON, or raises ``HTTPProblem``; FastAPI keeps every other route, and
    the predict route stays declared there so the OpenAPI schema still lists it.
    """

    def __init__(self, handler: Callable[[str, Request], Awaitable[dict[str, Any]]]) -> None:
        self.handler = handler

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            answer = await self.handler(scope[PREDICT_APP], Request(scope, receive))
        except HTTPProblem as exc:
            await _send_json(send, exc.status, {"detail": exc.detail}, exc.headers)
            return
        await _send_json(send, 200, answer, {})


class GatewayAPI(FastAPI):
    """FastAPI, with ``POST /v1/apps/{app}/predict`` served by ``predict_path`` before FastAPI's
    own stack (see ``PredictEndpoint`` for why)."""

    predict_path: Callable[[dict[str, Any], Any, Any], Awaitable[None]] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        name = predict_app(scope) if self.predict_path is not None and scope["type"] == "http" else None
        if name is not None:
            scope[PREDICT_APP] = name  # parsed once, here
            await self.predict_path(scope, receive, send)  # type: ignore[misc]
            return
        await super().__call__(scope, receive, send)


def predict_app(scope: Mapping[str, Any]) -> str | None:
    """The app named by a ``POST /v1/apps/{app}/predict`` (one non-empty path segment), else None."""
    if scope.get("method") != "POST":
        return None
    parts = scope.get("path", "").split("/")
    if len(parts) == 5 and parts[:3] == ["", "v1", "apps"] and parts[3] and parts[4] == "predict":
        return parts[3]
    return None


async def _send_json(send: Any, status: int, body: dict[str, Any], headers: Mapping[str, str]) -> None:
    # as Starlette's JSONResponse renders it: compact, UTF-8, no NaN (that is not JSON)
    data = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, refusing (413) anything over ``limit`` bytes, declared or actual
    (chunked bodies too), and (408) a body not all received within ``timeout_s`` seconds.

    A body over the limit is read to its end and dropped (up to ``DRAIN_BYTES``, within the
    same deadline) before the 413 goes out: a server that closes on unread bytes resets the
    connection, and the caller, still sending, never reads the answer."""
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
        raise HTTPProblem(413, f"body of {size} bytes is over the limit of {limit} bytes", {"connection": "close"})
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
        raise HTTPProblem(413, f"{what} is over the limit of {limit} bytes", {"connection": "close"})
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
