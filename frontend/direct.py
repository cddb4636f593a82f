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
from registry.outputs import answer_record, output_json, read_row, stored_answer
from registry.topic import AppConfig
from schemas import ModelRequest, Prediction, Response, Tensor
from schemas.reasons import MODELS_FAILED, MODELS_LATE, OK_STATUSES, refused_input


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
              context: str | None, deadline_us: int) -> tuple[Response, dict[str, Any]]:
    """The Response the selector's ``single`` policy would have made of ``pred``, and the record
    to store for the feedback join, as the selector stores it."""
    now = now_us()
    gave_nothing = [pred.model]  # what a feedback on a default teaches as wrong
    if pred.status in OK_STATUSES and pred.output is not None:
        try:
            value, scores = read_row(pred.output, kind, labels)
        except ClipstreamError as exc:
            reason = f"{MODELS_FAILED}{pred.model}: output not used: {exc}"
        else:
            record = answer_record(pred.query_id, cfg.name, value, scores, labels, 1.0, [pred.model], [],
                                   deadline_us, pred.trace, now)
            output = output_json(value, scores)
            return record, stored_answer(cfg.name, context, output, {pred.model: output}, confidence=1.0,
                                         versions={pred.model: pred.version})
    elif pred.error and (why := refused_input(pred.model, pred.error)) is not None:
        reason = f"every model refused the input: {why}"  # the caller's, as the selector says it
        gave_nothing = []  # the mistake was the caller's, not the model's
    else:  # an expired request was given up by its batcher: late, not broken
        reason = f"{MODELS_LATE if pred.status == 'expired' else MODELS_FAILED}{pred.model}: {pred.error or pred.status}"
    return (answer_record(pred.query_id, cfg.name, cfg.default_output, None, labels, 0.0, [], [pred.model],
                          deadline_us, pred.trace, now, reason),
            stored_answer(cfg.name, context, None, {}, missing=gave_nothing))
