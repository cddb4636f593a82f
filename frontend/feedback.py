"""The feedback route's work: check the label against the app's outputs, publish the
``Feedback`` record, and say whether the query's stored predictions are there to join with.
Feedback for a query answered for another app is refused (409) where the stored predictions
tell their app: a key allowed one app must not teach another (the learner refuses it too).

The context is never the caller's: the learner takes the one stored with the query
(docs/design/0031), so a caller cannot create policy state for contexts of its choosing.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from fastapi import Request
from pydantic import ValidationError

from clipstream.clock import now_us
from clipstream.errors import InputError
from clipstream.redisclient import stored_predictions_key
from frontend.gateway_http import HTTPProblem, parse_json, read_body
from frontend.gateway_kafka import DeliveryFailed, Overloaded
from frontend.gateway_models import FeedbackRequest, validation_reason
from frontend.state import GatewayState
from registry.labels import label_problem
from schemas import Feedback


# a feedback over the body limit: it carries no input, so the predict route's advice does not fit
FEEDBACK_HINT = " (CLIPSTREAM_GATEWAY_MAX_BODY_BYTES; a feedback is a query id and a label or a reward)"


async def feedback(state: GatewayState, app_name: str, request: Request) -> dict[str, Any]:
    cfg = state.app_config(app_name)
    body = parse_json(await read_body(request, state.gw.max_body_bytes, state.gw.body_timeout_s, hint=FEEDBACK_HINT))
    try:
        req = FeedbackRequest.model_validate(body)
    except ValidationError as exc:
        raise HTTPProblem(422, validation_reason(exc, tuple(FeedbackRequest.model_fields))) from None
    if req.label is None and req.reward is None:
        raise HTTPProblem(422, "feedback needs a `label` or a `reward` (in [0, 1])")
    problem = label_problem(req.label, *state.outputs(cfg))
    if problem is not None:
        raise HTTPProblem(422, problem)
    if (lost := state.kafka_problem()) is not None:
        raise state.overloaded(lost)
    # the context is the one the query was answered in (the learner reads it from the stored
    # predictions); a caller's ``context`` here is ignored (docs/design/0031)
    record = Feedback(
        query_id=req.query_id,
        app=cfg.name,
        context=None,
        label=req.label,
        reward=float(req.reward) if req.reward is not None else None,
        created_us=now_us(),
    )
    # a query this gateway just answered has its predictions on their way to the store
    known = state.answered_app(req.query_id) or await stored(state, req.query_id)
    if isinstance(known, str) and known != cfg.name:  # the learner would refuse it too
        # the other app is not named: a key limited to this app must learn nothing of the others
        raise HTTPProblem(409, f"query {req.query_id!r} was answered for another app, not {cfg.name!r}: "
                               "its feedback goes to that app's feedback route")
    try:
        await state.bus.publish_feedback(record, req.query_id.encode(), state.gw.feedback_ack_timeout_s)
    except InputError as exc:  # a label Avro cannot hold, though the checks above let it by
        raise HTTPProblem(422, str(exc)) from None
    except Overloaded as exc:
        raise state.overloaded(str(exc)) from None
    except DeliveryFailed as exc:
        raise state.overloaded(f"feedback not stored: {exc}") from None
    answer: dict[str, Any] = {"accepted": True, "query_id": req.query_id}
    if known is False:
        answer["applied"] = False
        answer["reason"] = UNKNOWN_QUERY
    return answer


# the 202 answer's reason when the query's stored predictions are not (or no longer) there
UNKNOWN_QUERY = ("no stored predictions for this query id (unknown, expired, or not answered yet): it is "
                 "applied if they appear within a few seconds, else dead-lettered")


async def stored(state: GatewayState, query_id: str) -> bool | str | None:
    """Whether the selector holds the query's predictions: False, True, or the app they were
    answered for when ``state.stored`` can tell (``stored_app``); None: Redis cannot say now."""
    if state.stored is None:
        return None
    try:
        return await asyncio.wait_for(state.stored(query_id), 0.5)
    except Exception:  # Redis slow or away: the feedback still goes to Kafka, unjudged
        return None


# the stored record's first bytes: ``registry.outputs.stored_answer`` puts the app first, and
# an app's name is far shorter, so one short read tells the app whatever the predictions weigh
STORED_HEAD_BYTES = 512
_APP_FIRST = re.compile(rb'\{\s*"app"\s*:\s*')  # with any JSON spacing its writers use


async def stored_app(client: Any, query_id: str) -> bool | str:
    """For ``GatewayState.stored``: False when the query's predictions are not stored, else the
    app they were answered for (True when their record does not say, or says past its head)."""
    head = await client.getrange(stored_predictions_key(query_id), 0, STORED_HEAD_BYTES - 1)
    if isinstance(head, str):  # a client that decodes its replies
        head = head.encode()
    if not head:
        return False
    first = _APP_FIRST.match(head)
    if first is None:
        return True
    try:
        app, _ = json.JSONDecoder().raw_decode(head[first.end():].decode("utf-8", "replace"))
    except ValueError:
        return True
    return app if isinstance(app, str) and app else True
