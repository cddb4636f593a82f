"""The gateway's JSON shapes: request bodies, answers, and the Response record -> JSON mapping.

Pure (no I/O): the mapping from the selector's ``Response`` to what a caller sees is the
REST contract, so it is unit-tested alone. Request bodies are validated with pydantic in strict
mode (no ``"5"`` -> 5, no ``true`` -> 1), because a silent coercion would feed a model
something its caller did not send.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic import ValidationError

from schemas import Response

Label = StrictBool | StrictInt | StrictFloat | StrictStr

# the longest SLO a caller may ask for: a slot in max_inflight is held that long
MAX_SLO_MS = 60_000.0
MAX_CONTEXT_CHARS = 256  # a context names a policy state in Redis: a key, not a document


class PredictRequest(BaseModel):
    """``{"input": [...], "context": "user-42", "slo_ms": 50}``; only ``input`` is required. Any
    other field is refused: a misspelt ``slo_ms`` would otherwise be dropped without a word."""

    model_config = ConfigDict(extra="forbid")

    input: Any = Field(description="One example: a number or nested lists matching the model's input shape "
                       "(strings, for a model of dtype string or bytes).")
    context: StrictStr | None = Field(None, min_length=1, max_length=MAX_CONTEXT_CHARS,
                                      description="User or session key: its own policy state.")
    slo_ms: StrictFloat | StrictInt | None = Field(None, gt=0, le=MAX_SLO_MS,
                                                   description="Latency objective; the app's when absent.")


class FeedbackRequest(BaseModel):
    """``{"query_id": "...", "label": <as output>}`` or ``{"query_id": "...", "reward": 0.7}``. Any
    other field is refused, so a misspelt ``label`` is named rather than taken for a missing one."""

    model_config = ConfigDict(extra="forbid")

    query_id: StrictStr = Field(min_length=1, max_length=256)
    label: Label | None = None
    reward: StrictFloat | StrictInt | None = Field(None, ge=0, le=1)
    context: StrictStr | None = Field(None, min_length=1, max_length=MAX_CONTEXT_CHARS,
                                      description="Ignored: feedback teaches the context the query was answered in.")


class ModelsAnswered(BaseModel):
    answered: list[str]
    missing: list[str]


class PredictResponse(BaseModel):
    """What ``POST /v1/apps/{app}/predict`` answers (documented in the OpenAPI schema)."""

    query_id: str
    output: Label | None = Field(description="The combined label, or the value for regression, or the app's default.")
    scores: list[float] | None = Field(description="Combined class scores, aligned with `labels`.")
    labels: list[str] | None = Field(None, description="The labels of `scores`, as strings.")
    confidence: float = Field(ge=0, le=1)
    default: bool
    default_reason: str | None = None
    models: ModelsAnswered
    latency_ms: float


class Accepted(BaseModel):
    accepted: bool = True
    query_id: str
    applied: bool | None = Field(None, description="false: the query's stored predictions are not there "
                                 "(unknown, expired or not answered yet); `reason` says what happens to it")
    reason: str | None = None


class TensorDoc(BaseModel):
    dtype: str = Field(description="A numpy dtype name, or string (UTF-8 text) or bytes.")
    shape: list[int] = Field(description="One example's shape: a predict's `input` is one example.")


class OutputDoc(BaseModel):
    kind: str = Field(description="class_scores, label or regression")
    labels: list[str] | None = Field(None, description="The classes `scores` are aligned with, as strings.")


class ModelDoc(BaseModel):
    name: str
    version: str


class AppMetadata(BaseModel):
    """What ``GET /v1/apps/{app}`` answers: what to send and what comes back."""

    name: str
    policy: str
    slo_ms: float = Field(description="The deadline a query without its own `slo_ms` is answered by.")
    default_output: Label | None = Field(description="The answer when no model answers in time.")
    input: TensorDoc | None = Field(description="What `input` must be (null: the app has no model yet).")
    output: OutputDoc
    models: list[ModelDoc]


class ErrorBody(BaseModel):
    detail: str


def validation_reason(exc: ValidationError, known: tuple[str, ...] = ()) -> str:
    """One line from pydantic's errors: ``slo_ms: Input should be greater than 0``; a field
    not among ``known`` is named with the nearest known one."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ())) or "body"
        if err.get("type") == "extra_forbidden" and known:
            near = difflib.get_close_matches(loc, known, n=1, cutoff=0.5)
            parts.append(f"{loc}: not a field of this body{f' (did you mean {near[0]!r}?)' if near else ''}; "
                         f"it holds {', '.join(known)}")
        else:
            parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _unit(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    if not math.isfinite(v):
        return 0.0
    return min(1.0, max(0.0, v))


def response_json(record: Response, latency_ms: float, default_output: Any = None) -> dict[str, Any]:
    """The caller's JSON for a selector ``Response`` record.

    Confidence is clamped into [0, 1] and non-finite numbers become null, because JSON has no
    NaN and a caller must always be able to parse the answer. A default answer without an
    output takes the app's ``default_output``.
    """
    is_default = bool(record.is_default)
    output = record.output
    if is_default and output is None:
        output = default_output
    scores, labels = record.scores, record.labels
    return {
        "query_id": record.query_id,
        "output": _finite(output),
        "scores": [_finite(float(s)) for s in scores] if scores is not None else None,
        "labels": list(labels) if labels is not None else None,
        "confidence": _unit(record.confidence),
        "default": is_default,
        "default_reason": record.default_reason,
        "models": {
            "answered": list(record.answered or []),
            "missing": list(record.missing or []),
        },
        "latency_ms": round(latency_ms, 3),
    }


def default_json(
    query_id: str, default_output: Any, models: tuple[str, ...] | list[str], latency_ms: float,
    reason: str = "no answer reached the gateway by the deadline",
) -> dict[str, Any]:
    """The answer when no Response came in time: the app's default, every model missing; the
    reason says it is the gateway's own wait that ended."""
    return {
        "query_id": query_id,
        "output": _finite(default_output),
        "scores": None,
        "labels": None,
        "confidence": 0.0,
        "default": True,
        "default_reason": reason,
        "models": {"answered": [], "missing": list(models)},
        "latency_ms": round(latency_ms, 3),
    }
