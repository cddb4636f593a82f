"""The REST side for applications: ``Client`` waits for the answer over HTTP (the Kafka side,
``Producer`` and ``ResponseReader``, is ``frontend.producer``).

``Client.feedback`` takes the app in any of three ways, so the short form
``client.feedback(query_id, label)`` works: (1) ``app=`` keyword; (2) the app of an earlier
``predict`` made by this client for that query id (remembered, bounded); (3) the client's
default app, ``Client(url, app="digits")``. Positionally, ``feedback(app, query_id, label)``
(three values) or, with ``label=``/``reward=`` given as keywords, ``feedback(app, query_id,
reward=1.0)``; two positional values without those keywords mean ``(query_id, label)``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import httpx
import numpy as np

from clipstream.errors import ClipstreamError, ConfigError, InfraError, InputError
from frontend.inputs import to_json

__all__ = [
    "Client", "GatewayError", "GatewayInputError", "GatewayUnavailable", "NotFound", "Overloaded",
    "TooLarge", "Unauthorized",
]


class GatewayError(ClipstreamError):
    """The gateway answered with an error status; ``reason`` is its one-line explanation."""

    def __init__(self, status: int | None, reason: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {reason}" if status else reason)
        self.status, self.reason, self.retry_after = status, reason, retry_after


class Unauthorized(GatewayError):
    """401: no API key, or one the gateway does not know."""


class NotFound(GatewayError):
    """404: no such app."""


class TooLarge(GatewayError):
    """413: the request body is over the gateway's limit."""


def _json(body: dict[str, Any]) -> bytes:
    """The body as JSON, or InputError for what JSON cannot carry (a NaN, say), as the gateway
    would refuse it, rather than the encoder's own ValueError."""
    try:
        return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        raise InputError("input has values that are not finite numbers (NaN or infinity): JSON cannot carry "
                         "them, and no model takes them") from None
    except TypeError as exc:
        raise InputError(f"input cannot be sent as JSON: {exc}") from None


class GatewayInputError(GatewayError, InputError):
    """422: the input (or the body) does not match what the app's model takes."""


class Overloaded(GatewayError):
    """503: the gateway is at its limit; ``retry_after`` says when to try again (seconds)."""


class GatewayUnavailable(GatewayError, InfraError):
    """No HTTP answer at all (connection refused, timeout)."""


_BY_STATUS: dict[int, type[GatewayError]] = {
    401: Unauthorized, 404: NotFound, 413: TooLarge, 422: GatewayInputError, 503: Overloaded,
}


_MISSING: Any = object()


def _raw(input: Any) -> bytes:
    """A binary predict's body: bytes as they are, text as UTF-8, an array of numbers as its
    little-endian bytes in C order. An array of text or bytes goes as its one element; one of
    several has no binary form (its elements' lengths would be lost)."""
    if isinstance(input, np.ndarray) and input.dtype.kind in "OUS":
        if input.size != 1:
            raise InputError(f"binary=True sends one string or bytes element, not an array of {input.size}: send "
                             "the array as JSON (binary=False)")
        input = input.reshape(()).item()
    if isinstance(input, (bytes, bytearray, memoryview)):
        return bytes(input)
    if isinstance(input, str):
        return input.encode()
    if not isinstance(input, np.ndarray | np.generic):  # a list has no dtype: its bytes would be guessed
        raise InputError("binary=True sends a numpy array's own bytes: pass an array of the model's dtype "
                         "(GET /v1/apps/{app} names it), or send the list as JSON (binary=False)")
    array = np.ascontiguousarray(input)
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


# the connection failed before an answer came: refused (no gateway on the port: one restarts)
# or dropped (the gateway died with the request). A predict is sent again, once: another
# gateway member, or the restarted one, answers it, and its caller still sees one answer.
# A feedback is not: it may have been applied (docs/design/0023)
RETRYABLE: tuple[type[httpx.HTTPError], ...] = (
    httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
)
PREDICT_RETRIES = 1


async def post_predict(http: httpx.AsyncClient, path: str, body: dict[str, Any],
                       retries: int = PREDICT_RETRIES) -> httpx.Response:
    """POST a predict with ``http``, sent again up to ``retries`` times on a ``RETRYABLE``
    failure (for asyncio callers; ``Client.predict`` does the same)."""
    for attempt in range(retries + 1):
        try:
            return await http.post(path, json=body)
        except RETRYABLE:
            if attempt == retries:
                raise
    raise AssertionError("unreachable")


class Client:
    """A synchronous REST client of the gateway (one connection pool, keep-alive)."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        api_key: str | None = None,
        timeout: float = 10.0,
        app: str | None = None,
        remember: int = 10_000,
        http: httpx.Client | None = None,
    ) -> None:
        """``http``: an httpx client to use instead of a new one (tests, custom transports)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.app = app
        if http is not None:
            http.headers.update(headers)
            self._http = http
        else:
            self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self._apps_of: OrderedDict[str, str] = OrderedDict()
        self._remember = remember

    def predict(
        self,
        app: Any = None,
        input: Any = _MISSING,
        context: str | None = None,
        slo_ms: float | None = None,
        binary: bool = False,
    ) -> dict[str, Any]:
        """The answer as the gateway's JSON (``output``, ``confidence``, ``default``, ...).

        ``predict("digits", x)``, or ``predict(x)`` (``predict(input=x)``) with the client's
        default app: with one, a lone argument is the input, as an input is always needed.
        ``binary``: send a numpy ``input`` as its raw bytes, which must then be of the model's
        dtype (``GET /v1/apps/{app}`` says which); an image goes at its own size, not three
        times it as JSON numbers. A ``str`` input goes as its UTF-8, for a model of one ``string``
        or ``bytes`` element (a document, an encoded image); a ``bytes`` input always goes so.
        Raises a ``GatewayError`` subclass on 4xx/5xx (the reason is the gateway's).
        """
        if input is _MISSING and app is not None and self.app:
            app, input = None, app
        if input is _MISSING:
            raise TypeError("predict() needs an input: predict(APP, INPUT), or predict(INPUT) with Client(url, app=APP)")
        app = self._app(app)
        fields: dict[str, Any] = {k: v for k, v in (("context", context), ("slo_ms", slo_ms)) if v is not None}
        if binary or isinstance(input, (bytes, bytearray, memoryview)):  # JSON has no bytes: their raw body
            send: dict[str, Any] = {"content": _raw(input), "params": fields,
                                    "headers": {"content-type": "application/octet-stream"}}
        else:
            send = {"content": _json({"input": to_json(input), **fields}), "headers": {"content-type": "application/json"}}
        answer = self._post(f"/v1/apps/{app}/predict", send, retries=PREDICT_RETRIES)
        self._apps_of[answer["query_id"]] = app
        while len(self._apps_of) > self._remember:
            self._apps_of.popitem(last=False)
        return answer

    def feedback(
        self,
        *args: Any,
        label: Any = None,
        reward: float | None = None,
        app: str | None = None,
        context: str | None = None,
    ) -> dict[str, Any]:
        """Send the true label of (or a reward for) an earlier query; see the module doc for forms."""
        if len(args) == 3:
            app, query_id, label = args
        elif len(args) == 2 and (label is not None or reward is not None):
            app, query_id = args
        elif len(args) == 2:
            query_id, label = args
        elif len(args) == 1:
            (query_id,) = args
        else:
            raise TypeError("feedback([app,] query_id, [label], label=..., reward=..., app=...)")
        query_id = _query_id_text(query_id)
        app = app or self._apps_of.get(query_id) or self.app
        if app is None:
            raise ConfigError("feedback needs an app: pass app=, or make the Client with app=")
        if label is None and reward is None:
            raise InputError("feedback needs a label or a reward")
        body: dict[str, Any] = {"query_id": query_id}
        if label is not None:
            body["label"] = to_json(label)
        if reward is not None:
            body["reward"] = float(reward)
        if context is not None:
            body["context"] = context
        return self._post(f"/v1/apps/{app}/feedback", {"json": body})

    def ready(self) -> bool:
        """Whether the gateway says it is connected and loaded (``/readyz``)."""
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def _app(self, app: str | None) -> str:
        app = app or self.app
        if not app:
            raise ConfigError("no app given and the Client has no default app")
        return app

    def _post(self, path: str, send: dict[str, Any], retries: int = 0) -> dict[str, Any]:
        """POST ``send`` (httpx's ``json=``, or ``content=`` with its ``params`` and ``headers``)."""
        for attempt in range(retries + 1):
            try:
                resp = self._http.post(path, **send)
                break
            except RETRYABLE as exc:
                if attempt == retries:
                    raise GatewayUnavailable(None, f"gateway at {self._http.base_url} unreachable: {exc}") from exc
            except httpx.HTTPError as exc:
                raise GatewayUnavailable(None, f"gateway at {self._http.base_url} unreachable: {exc}") from exc
        if resp.status_code < 400:
            return resp.json()
        try:
            reason = resp.json().get("detail", resp.text)
        except ValueError:
            reason = resp.text
        retry = resp.headers.get("retry-after")
        cls = _BY_STATUS.get(resp.status_code, GatewayError)
        raise cls(resp.status_code, str(reason), float(retry) if retry else None)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _query_id_text(query_id: Any) -> str:
    """A query id as text: tritonclient reads a BYTES output as bytes (``as_numpy("query_id")``)."""
    if isinstance(query_id, (bytes, bytearray, np.bytes_)):
        try:
            return bytes(query_id).decode()
        except UnicodeDecodeError:
            raise InputError(f"query_id {bytes(query_id)[:64]!r} is not UTF-8 text: pass the id an answer gave") from None
    if isinstance(query_id, str):
        return str(query_id)  # numpy's str_ too
    raise InputError(f"query_id must be the text an answer gave; got {type(query_id).__name__} {query_id!r:.64}")
