"""A predict request's body read into the request and its input array: JSON, or one example's
raw bytes (``application/octet-stream``, with ``context`` and ``slo_ms`` in the query string),
each checked the same way; ``HTTPProblem`` 422 says why not, or 413 for an input no record
could carry. Apart from the gateway's routes so both bodies share one set of checks."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from clipstream.errors import InputError
from frontend.gateway_http import HTTPProblem, parse_json
from frontend.gateway_models import PredictRequest, validation_reason
from frontend.inputs import input_for, input_of_bytes
from registry.spec import TensorSpec
from schemas import Tensor
from topics.sizes import input_limit, too_large_input

BINARY = "application/octet-stream"  # a predict body that is one example's raw bytes
# request bodies larger than this are parsed in a worker thread, not on the event loop
OFFLOAD_BYTES = 64 * 1024


def parse_predict(raw: bytes, spec: TensorSpec | None, max_record_bytes: int) -> tuple[PredictRequest, Tensor]:
    """Body bytes -> validated request and input tensor; HTTPProblem(422) with the reason, or
    413 for an input no record could carry (its binary form, which JSON numbers may outgrow)."""
    return _checked(parse_json(raw), lambda req: input_for(req.input, spec), max_record_bytes)


def parse_binary(raw: bytes, params: Mapping[str, str], spec: TensorSpec | None,
                 max_record_bytes: int) -> tuple[PredictRequest, Tensor]:
    """An ``application/octet-stream`` body: one example's raw bytes (``inputs.input_of_bytes``),
    with ``context`` and ``slo_ms`` in the query string, checked as the JSON body's are."""
    unknown = sorted(set(params) - {"context", "slo_ms"})
    if unknown:  # a misspelt slo_ms would otherwise be dropped without a word
        near = difflib.get_close_matches(unknown[0], ("context", "slo_ms"), n=1, cutoff=0.5)
        raise HTTPProblem(422, f"?{unknown[0]}=: not a parameter of a raw-bytes predict"
                               f"{f' (did you mean {near[0]!r}?)' if near else ''}; it takes context and slo_ms")
    fields: dict[str, Any] = {"input": None, **{k: params[k] for k in ("context", "slo_ms") if k in params}}
    if "slo_ms" in fields:
        try:
            fields["slo_ms"] = float(fields["slo_ms"])
        except ValueError:
            fields["slo_ms"] = math.nan
        if not math.isfinite(fields["slo_ms"]):
            raise HTTPProblem(422, f"slo_ms: {params['slo_ms']!r} is not a number of milliseconds") from None
    return _checked(fields, lambda req: input_of_bytes(raw, spec), max_record_bytes)


def _checked(body: Any, read: Callable[[PredictRequest], Any], max_record_bytes: int
             ) -> tuple[PredictRequest, Tensor]:
    try:
        req = PredictRequest.model_validate(body)
    except ValidationError as exc:
        raise HTTPProblem(422, validation_reason(exc, tuple(PredictRequest.model_fields))) from None
    try:
        tensor = Tensor.of(read(req))  # encoded once: its size is checked, then it is sent
    except InputError as exc:
        raise HTTPProblem(422, str(exc)) from None
    if len(tensor.data) > input_limit(max_record_bytes):
        raise HTTPProblem(413, too_large_input(len(tensor.data), max_record_bytes))
    return req, tensor
