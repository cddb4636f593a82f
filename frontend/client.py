"""The Python side for applications: ``Client`` (REST, waits for the answer) and ``Producer``
(straight to Kafka, does not wait), plus ``ResponseReader`` for the answers producers get.

``Client.feedback`` takes the app in any of three ways, so the issue's short form
``client.feedback(query_id, label)`` works: (1) ``app=`` keyword; (2) the app of an earlier
``predict`` made by this client for that query id (remembered, bounded); (3) the client's
default app, ``Client(url, app="digits")``. Positionally, ``feedback(app, query_id, label)``
(three values) or, with ``label=``/``reward=`` given as keywords, ``feedback(app, query_id,
reward=1.0)``; two positional values without those keywords mean ``(query_id, label)``.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError, ConfigError, InfraError, InputError
from clipstream.settings import Settings, get_settings

__all__ = [
    "Client", "GatewayError", "GatewayInputError", "GatewayUnavailable", "NotFound", "Overloaded",
    "Producer", "ResponseReader", "TooLarge", "Unauthorized",
]


class GatewayError(ClipstreamError):
    """The gateway answered with an error status; ``reason`` is its one-line explanation."""

    def __init__(self, status: int | None, reason: str, retry_after: float | None = None):
        super().__init__(f"{status}: {reason}" if status else reason)
        self.status, self.reason, self.retry_after = status, reason, retry_after


class Unauthorized(GatewayError):
    """401: no API key, or one the gateway does not know."""


class NotFound(GatewayError):
    """404: no such app."""


class TooLarge(GatewayError):
    """413: the request body is over the gateway's limit."""


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


def _jsonable(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


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
        app: str | None = None,
        input: Any = _MISSING,
        context: str | None = None,
        slo_ms: float | None = None,
    ) -> dict[str, Any]:
        """The answer as the gateway's JSON (``output``, ``confidence``, ``default``, ...).

        ``predict("digits", x)``, or ``predict(input=x)`` with the client's default app.
        Raises a ``GatewayError`` subclass on 4xx/5xx (the reason is the gateway's).
        """
        if input is _MISSING:
            raise TypeError("predict() needs an input")
        app = self._app(app)
        body: dict[str, Any] = {"input": _jsonable(input)}
        if context is not None:
            body["context"] = context
        if slo_ms is not None:
            body["slo_ms"] = slo_ms
        answer = self._post(f"/v1/apps/{app}/predict", body)
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
        app = app or self._apps_of.get(query_id) or self.app
        if app is None:
            raise ConfigError("feedback needs an app: pass app=, or make the Client with app=")
        if label is None and reward is None:
            raise InputError("feedback needs a label or a reward")
        body: dict[str, Any] = {"query_id": query_id}
        if label is not None:
            body["label"] = _jsonable(label)
        if reward is not None:
            body["reward"] = float(reward)
        if context is not None:
            body["context"] = context
        return self._post(f"/v1/apps/{app}/feedback", body)

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

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = self._http.post(path, json=body)
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


DeliveryCallback = Callable[[str, Exception | None], None]


class Producer:
    """Publishes QueryEvents and Feedback straight to Kafka, for callers that do not wait.

    ``send_*`` only enqueue (librdkafka sends at once, linger 0); delivery is reported to the
    optional ``on_delivery(query_id, error_or_None)`` callback from within ``send_*``/``poll``/
    ``flush``, and failures are kept in ``failed``. Answers to queries sent without a reply topic
    go to the ``responses`` topic: read them with ``ResponseReader``. The registry is read
    (once, lazily) only when needed: for an app's SLO when ``slo_ms`` is not given, and to turn
    a nested list into the dtype and shape the app's model takes. A numpy array is sent as it
    is: give it the model's dtype and shape (the worker refuses anything else).
    """

    def __init__(self, bootstrap: str | None = None, settings: Settings | None = None) -> None:
        from confluent_kafka import Producer as KafkaProducer

        from topics.catalogue import Catalogue
        from topics.client import producer_config

        settings = settings or get_settings()
        if bootstrap:
            settings = settings.model_copy(update={"kafka_bootstrap": bootstrap})
        self.settings = settings
        cat = Catalogue.from_settings(settings)
        self.queries_topic, self.feedback_topic = cat.queries.name, cat.feedback.name
        self._producer = KafkaProducer(producer_config(settings))
        self._registry: Any = None
        self.failed: list[tuple[str, str]] = []

    def send_query(
        self,
        app: str,
        input: Any,
        context: str | None = None,
        slo_ms: float | None = None,
        query_id: str | None = None,
        reply_topic: str | None = None,
        reply_partition: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> str:
        """Publish one query; returns its query id (yours, or a fresh uuid4 hex)."""
        from schemas import encode, to_tensor

        query_id = query_id or uuid.uuid4().hex
        array = self._array(app, input)
        if slo_ms is None:
            slo_ms = self._app_config(app).slo_ms
        if slo_ms <= 0:
            raise InputError("slo_ms must be positive")
        created = now_us()
        event = {
            "query_id": query_id, "app": app, "context": context, "input": to_tensor(array),
            "created_us": created, "deadline_us": created + int(slo_ms * 1000),
            "reply_topic": reply_topic, "reply_partition": reply_partition,
            "trace": {"produced": created},
        }
        self._send(self.queries_topic, encode("QueryEvent", event), context or query_id,
                   query_id, on_delivery)
        return query_id

    def send_feedback(
        self,
        app: str,
        query_id: str,
        label: Any = None,
        reward: float | None = None,
        context: str | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Publish the true label of, or a reward in [0, 1] for, an earlier query."""
        from schemas import encode

        if label is None and reward is None:
            raise InputError("feedback needs a label or a reward")
        if reward is not None and not 0.0 <= float(reward) <= 1.0:
            raise InputError("reward must be in [0, 1]")
        record = {
            "query_id": query_id, "app": app, "context": context, "label": _jsonable(label),
            "reward": float(reward) if reward is not None else None, "created_us": now_us(),
        }
        self._send(self.feedback_topic, encode("Feedback", record), context or query_id,
                   query_id, on_delivery)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery reports; returns how many were served."""
        return self._producer.poll(timeout_s)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every record is delivered; InfraError if some are not (or failed)."""
        left = self._producer.flush(timeout_s)
        if left:
            raise InfraError(f"{left} records not delivered within {timeout_s:g}s")
        if self.failed:
            raise InfraError(f"{len(self.failed)} records failed, first: {self.failed[0]}")

    def close(self) -> None:
        self._producer.flush(10)
        if self._registry is not None:
            self._registry.stop()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, topic: str, value: bytes, key: str, query_id: str,
              on_delivery: DeliveryCallback | None) -> None:
        def report(err: Any, msg: Any) -> None:
            error = None if err is None else InfraError(str(err))
            if error is not None:
                self.failed.append((query_id, str(err)))
            if on_delivery is not None:
                on_delivery(query_id, error)

        while True:
            try:
                self._producer.produce(topic, value=value, key=key.encode(), on_delivery=report)
                break
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let librdkafka drain it, then retry
        self._producer.poll(0)

    def _app_config(self, app: str) -> Any:
        if self._registry is None:
            from frontend.registry import RegistryFollower

            self._registry = RegistryFollower(self.settings).start()
            self._registry.wait_ready(30.0)
        # a registry record written just before may reach the view a moment after wait_ready
        deadline = time.monotonic() + 2.0
        while (cfg := self._registry.view().apps.get(app)) is None:
            if time.monotonic() > deadline:
                raise ConfigError(f"unknown app {app!r} (not in the registry)")
            time.sleep(0.02)
        return cfg

    def _array(self, app: str, input: Any) -> np.ndarray:
        if isinstance(input, np.ndarray):
            return input
        from frontend.inputs import input_for

        cfg = self._app_config(app)
        spec = None
        if cfg.models:
            model = self._registry.view().models.get(cfg.models[0])
            spec = model.spec.input if model is not None and model.spec is not None else None
        return input_for(input, spec)


class ResponseReader:
    """Decoded ``Response`` records from the responses topic (or any reply topic).

    Reads every partition from where it ends now (or from the beginning), assigned directly,
    without a consumer group: each reader sees every response, and none is skipped between
    creating the reader and the first read.
    """

    def __init__(self, settings: Settings | None = None, bootstrap: str | None = None,
                 topic: str | None = None, from_beginning: bool = False) -> None:
        from confluent_kafka import Consumer, TopicPartition

        from frontend.gateway_kafka import watermarks
        from topics.catalogue import Catalogue
        from topics.client import consumer_config

        settings = settings or get_settings()
        if bootstrap:
            settings = settings.model_copy(update={"kafka_bootstrap": bootstrap})
        self.topic = topic or Catalogue.from_settings(settings).responses.name
        self._consumer = Consumer(consumer_config(
            settings, f"responses-{uuid.uuid4().hex}", **{"enable.auto.commit": False}))
        meta = self._consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
        if meta is None or meta.error is not None:
            self._consumer.close()
            raise InfraError(f"topic {self.topic} does not exist")
        assignment = []
        for p in sorted(meta.partitions):
            low, high = watermarks(self._consumer, TopicPartition(self.topic, p))
            assignment.append(TopicPartition(self.topic, p, low if from_beginning else high))
        self._consumer.assign(assignment)

    def poll(self, timeout_s: float = 1.0) -> dict[str, Any] | None:
        """The next Response, or None when none arrived within ``timeout_s``."""
        from schemas import decode_as

        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._consumer.poll(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return None
            if not msg.error():
                try:
                    return decode_as("Response", msg.value())
                except ClipstreamError:
                    continue  # not a Response (garbage on the topic): skip it, keep reading
            if time.monotonic() >= deadline:
                return None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Every response as it arrives (blocks; stop with ``close`` or by leaving the loop)."""
        while True:
            record = self.poll(1.0)
            if record is not None:
                yield record

    def collect(self, query_ids: set[str] | list[str], timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
        """The responses to ``query_ids`` (others are skipped), as many as arrive in time."""
        want = set(query_ids)
        got: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        while want - got.keys() and time.monotonic() < deadline:
            record = self.poll(max(0.0, deadline - time.monotonic()))
            if record is not None and record["query_id"] in want:
                got[record["query_id"]] = record
        return got

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> "ResponseReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
