"""One query through the pipeline, from a checked input to the caller's answer: published to
the selector (or straight to a ``single`` app's model), awaited until its deadline, answered
with the app's default when nothing comes, and counted. Shared by the gateway's routes, each of
which reads its own body (``/v1`` predict, the Open Inference Protocol's infer)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from clipstream.clock import now_us
from clipstream.errors import InfraError
from frontend.direct import answer_of, direct_model, request_for
from frontend.gateway_kafka import DeliveryFailed, Overloaded
from frontend.gateway_models import PredictRequest, default_json, response_json
from frontend.state import GatewayState, Reply
from registry.topic import AppConfig
from schemas import Prediction, QueryEvent, Response, Tensor
from schemas.reasons import MODELS_FAILED, MODELS_LATE


@dataclass(frozen=True)
class NotLoaded:
    """No answer came in time, and a model of the app has no replica that said it has it loaded:
    the caller's default says why, and the wait is not the pipeline's load."""

    reason: str


@dataclass(frozen=True)
class Asked:
    """When a query came and what it asks: the wait is counted from ``created``."""

    cfg: AppConfig
    req: PredictRequest
    t0: float  # perf_counter at arrival
    arrived: int  # wall clock, µs
    created: int  # when the server began reading the request, µs: the caller's wait counts from it
    sent: int | None = None  # when a batch's example went, its SLO running from then (else ``created``)

    @property
    def slo_ms(self) -> float:
        return float(self.req.slo_ms) if self.req.slo_ms is not None else float(self.cfg.slo_ms)

    @property
    def start(self) -> int:
        return self.sent if self.sent is not None else self.created

    @property
    def deadline(self) -> int:
        return self.start + int(self.slo_ms * 1000)


async def ask(state: GatewayState, asked: Asked, query_id: str, tensor: Tensor) -> Reply | NotLoaded | None:
    """Publish the query and wait for its reply until the deadline (and the reply margin);
    None when nothing came in time, ``NotLoaded`` when a model of the app is why."""
    assert state.bus is not None
    model = direct_model(asked.cfg, state.gw.direct)
    if model is not None and state.bus.request_topic(model) is None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, state.bus.ensure_request_topic, model)
        except InfraError as exc:
            raise state.overloaded(f"the topic of model {model!r} is not there: {exc}") from None
    fut = _publish(state, asked, model, query_id, tensor)
    wait_s = max(0.0, (asked.deadline - now_us()) / 1e6) + state.gw.reply_margin_ms / 1000.0
    try:
        return await asyncio.wait_for(fut, wait_s)
    except TimeoutError:
        pass
    finally:
        state.bus.forget(query_id)
    why = await state.not_loaded(asked.cfg.models, wait=False)
    return NotLoaded(why) if why is not None else None


def answered(state: GatewayState, asked: Asked, query_id: str, reply: Reply | NotLoaded | None, waited_ms: float,
             inflight: int, counts: tuple[Any, ...]) -> dict[str, Any]:
    """The caller's JSON for a reply (or none), observed by admission control and counted."""
    cfg = asked.cfg
    record = _answer_straight(state, cfg, reply, asked) if isinstance(reply, Prediction) else \
        reply if isinstance(reply, Response) else None
    if asked.sent is not None:  # a batch's example: its own query, timed from when it went (after its slot)
        latency_ms, waited_ms = (now_us() - asked.sent) / 1000.0, 0.0
    else:
        latency_ms = (time.perf_counter() - asked.t0) * 1000.0 + (asked.arrived - asked.created) / 1000.0
    if isinstance(reply, NotLoaded):
        answer = default_json(query_id, cfg.default_output, cfg.models, latency_ms,
                              f"no answer reached the gateway by the deadline: {reply.reason}")
    elif record is None:
        answer = default_json(query_id, cfg.default_output, cfg.models, latency_ms)
    else:
        answer = response_json(record, latency_ms, cfg.default_output)
    admitted = asked.sent if asked.sent is not None else asked.created + int(waited_ms * 1000)
    if not isinstance(reply, NotLoaded):  # a model not loaded is no sign of load: admission learns nothing
        state.observe(cfg.name, answer, reply is None, admitted, inflight, asked.slo_ms, waited_ms)
    _count(state, cfg.name, answer, record, reply, latency_ms, counts)
    if answer["default"] and (model := direct_model(cfg, state.gw.direct)) is not None:
        _count_model(state, cfg.name, model, record, reply)
    return answer


def _publish(state: GatewayState, asked: Asked, model: str | None, query_id: str,
             tensor: Tensor) -> asyncio.Future[Reply]:
    """Send the query to the selector, or straight to a ``single`` app's model, and return the
    future its reply resolves; the bus's refusals become the caller's 503."""
    bus, cfg, req = state.bus, asked.cfg, asked.req
    assert bus is not None
    try:
        if model is None:
            return bus.publish_query(QueryEvent(
                query_id=query_id, app=cfg.name, context=req.context, input=tensor,
                created_us=asked.start, deadline_us=asked.deadline, reply_topic=bus.reply_topic, reply_partition=0,
                trace={"produced": asked.start}), (req.context or query_id).encode())
        return bus.publish_request(request_for(
            query_id, cfg, model, tensor, asked.start, asked.deadline, bus.reply_topic))
    except Overloaded as exc:
        raise state.overloaded(str(exc)) from None
    except DeliveryFailed as exc:
        raise state.overloaded(f"Kafka refused the query: {exc}") from None


def _decided_by(reply: Reply | NotLoaded | None, record: Response | None) -> str:
    """Who decided on a default: a metric label from a small set, never the free-text reason."""
    if isinstance(reply, NotLoaded):
        return "not_loaded"
    if record is None:
        return "gateway_timeout"
    return "model" if isinstance(reply, Prediction) else "selector"


def _count(state: GatewayState, app: str, answer: dict[str, Any], record: Response | None,
           reply: Reply | NotLoaded | None, latency_ms: float, counts: tuple[Any, ...]) -> None:
    """Count one answered query in the gateway's and the app's metrics, defaults by who
    decided on them."""
    if answer["default"]:
        state.metrics.defaults.inc(_decided_by(reply, record))
    if not answer["default"]:
        state.remember_answer(answer["query_id"], app)
    state.metrics.latency.observe(latency_ms / 1000.0, "default" if answer["default"] else "ok")
    counts[2 if answer["default"] else 1].inc()
    counts[4].observe(latency_ms / 1000.0)


def _count_model(state: GatewayState, app: str, model: str, record: Response | None,
                 reply: Reply | NotLoaded | None) -> None:
    """A default of a query sent straight to ``model``, counted against the model as the
    selector counts a straggler or a failure; one the caller's input caused is not the model's."""
    if isinstance(reply, NotLoaded):
        return
    reason = (record.default_reason or "") if record is not None else ""
    if record is None or reason.startswith(MODELS_LATE):
        state.metrics.stragglers.inc(app, model)
    elif reason.startswith(MODELS_FAILED):
        state.metrics.failed.inc(app, model)


def _answer_straight(state: GatewayState, cfg: AppConfig, pred: Prediction, asked: Asked) -> Response:
    """The Response to a query its one model answered straight; stored for feedback as the
    selector would store it (docs/design/0083)."""
    record, stored = answer_of(pred, cfg, *state.outputs(cfg), asked.req.context, asked.deadline)
    state.metrics.stages.observe(record.trace)
    if state.saver is not None:
        state.saver.put(pred.query_id, stored)
    return record
