"""A one-model app's query asked of its model straight (docs/design/0083).

A ``single`` app's selector asks the app's one model and hands its answer back as it came, so
through the gateway its two Kafka hops (the query to the selector, the answer back) carry
nothing a stage needs. The gateway sends such a query as a ``ModelRequest`` that names its own
reply topic; the worker (or the batcher, for a cache hit) sends the prediction there, and the
gateway answers from it and stores it for the feedback join as the selector would have. The
deadline is the gateway's own wait, which every REST query already has.
"""

from __future__ import annotations

from typing import Any

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError
from registry.outputs import plain, read_row, wire_value
from registry.topic import AppConfig
from schemas import ModelRequest, Prediction, Response, Tensor
from schemas.reasons import OK_STATUSES

def direct_model(cfg: AppConfig, enabled: bool) -> str | None:
    """The model a REST query of ``cfg`` is sent to straight, or None: through the selector."""
    if not enabled or cfg.policy != "single" or not cfg.models:
        return None
    return cfg.models[0]


def request_for(query_id: str, cfg: AppConfig, model: str, tensor: Tensor, created_us: int, deadline_us: int,
                reply_topic: str) -> ModelRequest:
    """The request that stands for the query: its prediction comes back to ``reply_topic``."""
    return ModelRequest(query_id=query_id, app=cfg.name, model=model, input=tensor, deadline_us=deadline_us,
                        selector_partition=0, trace={"produced": created_us}, reply_topic=reply_topic,
                        reply_partition=0)


def answer_of(pred: Prediction, cfg: AppConfig, kind: str, labels: tuple[Any, ...] | None,
              context: str | None, deadline_us: int) -> tuple[Response, dict[str, Any] | None]:
    """The Response the selector's ``single`` policy would have made of ``pred``, and the record
    to store for the feedback join (None for a default, as the selector stores none)."""
    now = now_us()
    reason: str | None = None
    value: Any = None
    scores: tuple[float, ...] | None = None
    if pred.status in OK_STATUSES and pred.output is not None:
        try:
            value, scores = read_row(pred.output, kind, labels)
        except ClipstreamError as exc:
            reason = f"every model failed: {pred.model}: undecodable output: {exc}"
    else:
        reason = f"every model failed: {pred.model}: {pred.error or pred.status}"
    trace = dict(pred.trace)
    trace["joined"] = now
    answered = [] if reason else [pred.model]
    record = Response(
        query_id=pred.query_id, app=cfg.name, output=None if reason else wire_value(value),
        scores=list(scores) if scores is not None else None,
        labels=[str(lab) for lab in labels] if scores is not None and labels else None,
        confidence=0.0 if reason else 1.0, is_default=reason is not None, default_reason=reason,
        answered=answered, missing=[] if answered else [pred.model], created_us=now, deadline_us=deadline_us,
        trace=trace)
    if reason:
        return record, None
    output = {"value": plain(value), "scores": list(scores) if scores is not None else None}
    return record, {"app": cfg.name, "context": context, "answer": output, "predictions": {pred.model: output}}
