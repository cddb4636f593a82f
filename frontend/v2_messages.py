"""Open Inference Protocol messages (KServe's V2) read and written for an app: an infer
request's one input tensor into one tensor per example, checked as a ``/v1`` predict's input is,
and the examples' answers into output tensors. Pure (no I/O) so that every rule is tested
without a gateway; ``frontend.v2`` serves it (docs/design/0113)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from clipstream.errors import DecodeError, InputError
from frontend.gateway_http import HTTPProblem, parse_json
from frontend.gateway_models import PredictRequest, validation_reason
from frontend.inputs import parse_rows, values_of_bytes
from frontend.v2_binary import binary_asked
from registry.spec import TensorSpec, not_finite
from registry.topic import AppConfig
from schemas import Tensor
from schemas.tensor import array_of
from topics.sizes import input_limit, too_large_input

# the protocol's datatypes for clipstream's dtypes; string and bytes are both its BYTES
DATATYPES: dict[str, str] = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64", "string": "BYTES", "bytes": "BYTES",
}
_DTYPE_OF = {v: k for k, v in DATATYPES.items() if k != "bytes"}
OUTPUTS = ("output", "scores", "confidence", "default", "default_reason", "query_id")
# MLServer's sklearn runtime names its outputs after the method: asked by those names, the app's
# answer and scores are sent under them (docs/design/0118)
ALIASES = {"predict": "output", "predict_proba": "scores"}
# what to do about a batch over the body limit, whatever way it came
BATCH_LIMIT = "CLIPSTREAM_GATEWAY_MAX_BODY_BYTES; send the batch as several requests"


class ErrorV2(BaseModel):
    error: str


class TensorIn(BaseModel):
    name: str = "input"
    shape: list[int] = Field(description="The batch first, then the model's input shape.")
    datatype: str = Field(description="BOOL, UINT8-64, INT8-64, FP16/32/64, or BYTES (strings).")
    data: list[Any] = Field(description="The values in row-major order, flat or nested.")


class InferRequest(BaseModel):
    """For the OpenAPI schema: the body is read by hand (size cap, one check for every path)."""

    id: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="`context` and `slo_ms`, as a predict's.")
    inputs: list[TensorIn] = Field(description="One tensor: an app's models take one input.")
    outputs: list[dict[str, str]] | None = Field(None, description=f"Names among {', '.join(OUTPUTS)}; all when "
                                                 "left out.")


# what an infer asks: its context and SLO, one tensor per example, its id, the outputs it wants,
# and those it wants as binary data (``frontend.v2_binary``)
Parsed = tuple[PredictRequest, list[Tensor], str | None, list[str], frozenset[str]]


def parse_infer(raw: bytes, spec: TensorSpec | None, max_record_bytes: int, header_length: int | None = None
                ) -> Parsed:
    """An infer body -> what it asks (``Parsed``). ``header_length``: the binary data extension's
    JSON length (``Inference-Header-Content-Length``), the inputs' raw bytes after it, as Triton's
    clients send by default. Several inputs are the columns of a table (``columns``).
    HTTPProblem 400 says why not, or 413 for an example no record could carry."""
    if header_length is not None and not 0 < header_length <= len(raw):
        raise bad(f"Inference-Header-Content-Length {header_length} is not within the body's {len(raw)} bytes")
    body = parse_json(raw[:header_length] if header_length is not None else raw)
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object with `inputs`")
    tensors = body.get("inputs")
    if not isinstance(tensors, list) or not tensors or not all(isinstance(t, dict) for t in tensors):
        raise bad(INPUTS)
    blobs = _binary(tensors, raw[header_length or len(raw):])

    def read(i: int, spec: TensorSpec | None) -> np.ndarray:
        shape, spec = checked_input(sent := tensors[i].get("shape"), tensors[i].get("datatype"), spec)
        if blobs[i] is not None:
            return read_rows(shape, tensors[i]["datatype"], spec, blob=blobs[i])
        return read_rows(shape, tensors[i]["datatype"], spec, values=_flat(tensors[i].get("data"), sent))

    rows = read(0, spec) if len(tensors) == 1 else columns([t.get("name") for t in tensors], spec, read)
    rid = body.get("id")
    if rid is not None and not isinstance(rid, str):
        raise bad("`id` must be a string")
    return predict_request(_parameters(body.get("parameters"))), examples(rows, max_record_bytes), rid, \
        wanted(body.get("outputs")), binary_asked(body)


INPUTS = ("`inputs` must hold one tensor, with the batch as its first dimension (an app's models take one input), "
          "or one tensor per column of a table, as MLServer's pandas content type sends")


def columns(names: list[Any], spec: TensorSpec | None, read: Callable[[int, TensorSpec | None], np.ndarray]
            ) -> np.ndarray:
    """Several inputs as the columns of one table, in the order sent, as MLServer's pandas
    content type sends a DataFrame: each example is the model's vector of one value per input.
    ``read(i, spec)`` reads input i as a batch of ``spec`` (one value per example)."""
    count = len(names)
    if spec is not None and spec.shape != (count,):
        raise bad(f"{count} inputs are read as the columns of a table, and the model takes {list(spec.shape)} per "
                  f"example, not [{count}]: send one tensor with the batch first")
    cols: list[np.ndarray] = []
    for i, name in enumerate(names):
        where = f"input {i} ({str(name)[:64]!r}), a column of the table"
        try:
            col = read(i, None if spec is None else TensorSpec(spec.dtype, ()))
        except HTTPProblem as exc:
            raise bad(f"{where}: {exc.detail}") from None
        if spec is None and col.ndim > 1:  # [n, 1], with no app's input to say so: one value per row
            if col[0].size != 1:
                raise bad(f"{where}, holds {col[0].size} values per row, not one")
            col = col.reshape(len(col))
        if cols and (len(col) != len(cols[0]) or col.dtype != cols[0].dtype):
            what = f"{len(col)} rows, and input 0 has {len(cols[0])}" if len(col) != len(cols[0]) else \
                f"datatype {col.dtype}, and input 0 has {cols[0].dtype} (the app declares no input to convert to)"
            raise bad(f"{where}, has {what}")
        cols.append(col)
    return np.stack(cols, axis=1)


def checked_input(shape: Any, datatype: Any, spec: TensorSpec | None) -> tuple[list[int], TensorSpec]:
    """The input tensor's shape and datatype checked against the model's (``spec``; the tensor's
    own when the app declares none): the batch of the model's shape, and the model's spec. A
    shape that differs from the model's by dimensions of 1 only (MLServer sends one string per
    example as ``[n, 1]``) is the model's."""
    if not (isinstance(shape, list) and shape and all(type(d) is int and d >= 0 for d in shape)):
        raise bad(f"input shape {shape!r} must be a list of non-negative integers, the batch first")
    if shape[0] < 1:
        raise bad(f"input shape {shape}: the batch (its first dimension) must hold at least one example")
    if datatype not in _DTYPE_OF:
        raise bad(f"input datatype {datatype!r} is not one of {', '.join(sorted(_DTYPE_OF))}")
    spec = spec or TensorSpec(_DTYPE_OF[datatype], tuple(shape[1:]))
    if tuple(shape[1:]) != spec.shape and [d for d in shape[1:] if d != 1] == [d for d in spec.shape if d != 1]:
        shape = [shape[0], *spec.shape]
    _fits(shape, datatype, spec)
    return shape, spec


def read_rows(shape: list[int], datatype: str, spec: TensorSpec, *, values: list[Any] | None = None,
              blob: bytes | None = None) -> np.ndarray:
    """The examples, as the model's dtype, from the values in row-major order or from raw bytes:
    numbers little-endian in row-major order, BYTES as each element's uint32 length and bytes
    (the layout a ``Tensor`` carries). A 400 says why they are no input for the model."""
    try:
        if blob is not None:
            return array_of(spec.dtype, shape, blob) if datatype == "BYTES" else \
                _as_model(values_of_bytes(blob, _DTYPE_OF[datatype], shape), spec)
        values = values or []
        if len(values) != math.prod(shape):
            raise bad(f"input data holds {len(values)} values, and shape {shape} needs {math.prod(shape)}")
        # the values must fit the datatype sent (a UINT8 of 300 is no UINT8), then the model's
        sent = spec if datatype == "BYTES" else TensorSpec(_DTYPE_OF[datatype], spec.shape)
        return _as_model(parse_rows(values, sent, shape[0], f"sent as {datatype} for the model's {spec.dtype} "
                                                            f"{list(spec.shape)}"), spec)
    except (InputError, DecodeError) as exc:
        raise bad(str(exc)) from None


def predict_request(params: dict[str, Any]) -> PredictRequest:
    """The request's ``context`` and ``slo_ms``, checked as a predict's are; its other
    parameters (a Triton client's ``binary_data_output``, say) are not clipstream's."""
    try:
        return PredictRequest.model_validate({"input": None, **{k: params[k] for k in ("context", "slo_ms")
                                                                  if k in params}})
    except ValidationError as exc:
        raise bad(f"parameters: {validation_reason(exc)}") from None


def examples(rows: np.ndarray, max_record_bytes: int) -> list[Tensor]:
    """One tensor per example; a 413 for an example no record could carry."""
    tensors = [Tensor.of(rows[i:i + 1].reshape(rows.shape[1:])) for i in range(len(rows))]  # one string too
    biggest = max(len(t.data) for t in tensors)
    if biggest > input_limit(max_record_bytes):
        raise HTTPProblem(413, too_large_input(biggest, max_record_bytes))
    return tensors


def _as_model(arr: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Values of the datatype sent, as the model's dtype (of the same kind: ``_fits``); one that
    the model's dtype cannot hold (an FP64 beyond FP32's range) is refused."""
    if arr.dtype.kind == "O" or arr.dtype == np.dtype(spec.dtype):
        return arr
    with np.errstate(over="ignore"):
        out = arr.astype(spec.dtype)
    if not_finite(out):
        raise InputError(f"input has values out of range for the model's {spec.dtype}")
    if out.dtype.kind in "iu" and not np.array_equal(out, arr):
        raise InputError(f"input has values out of range for the model's {spec.dtype}")
    return out


def app_outputs(kind: str, labels: tuple[Any, ...] | None) -> list[str]:
    """The output tensors an app answers with: ``scores`` only where it answers class scores."""
    return [name for name in OUTPUTS if name != "scores" or (kind == "class_scores" and labels)]


def check_outputs(cfg: AppConfig, kind: str, labels: tuple[Any, ...] | None, wanted: list[str]) -> None:
    """A 400 for an output asked for that the app has none of (scores of an app of values),
    before any of the request's examples is asked."""
    have = app_outputs(kind, labels)
    missing = [name for name in wanted if ALIASES.get(name, name) not in have]
    if missing:
        raise bad(f"app {cfg.name} has no output {missing[0]!r}: its outputs are {', '.join(have)}")


def infer_response(cfg: AppConfig, kind: str, labels: tuple[Any, ...] | None, answers: list[dict[str, Any]],
                   request_id: str | None, wanted: list[str]) -> dict[str, Any]:
    """The answers as the protocol's output tensors, one row per example, in their order. A
    default's scores are zeros: ``default`` says which rows those are."""
    n = len(answers)
    outs = [a["output"] for a in answers if a["output"] is not None]
    datatype = output_datatype(kind, labels, cfg.default_output, outs)
    zero = {"BOOL": False, "BYTES": ""}.get(datatype, 0)  # a default's row when the app has no default
    outs = [zero if a["output"] is None else a["output"] for a in answers]
    tensors: dict[str, dict[str, Any]] = {
        "output": {"shape": [n], "datatype": datatype, "data": outs if datatype != "BYTES" else [str(o) for o in outs]},
        "confidence": {"shape": [n], "datatype": "FP64", "data": [float(a["confidence"]) for a in answers]},
        "default": {"shape": [n], "datatype": "BOOL", "data": [bool(a["default"]) for a in answers]},
        "default_reason": {"shape": [n], "datatype": "BYTES", "data": [a.get("default_reason") or "" for a in answers]},
        "query_id": {"shape": [n], "datatype": "BYTES", "data": [a["query_id"] for a in answers]},
    }
    if kind == "class_scores" and labels:
        width = len(labels)
        rows = [a["scores"] if a.get("scores") and len(a["scores"]) == width else [0.0] * width for a in answers]
        tensors["scores"] = {"shape": [n, width], "datatype": "FP32", "data": [x for row in rows for x in row]}
    names = wanted or app_outputs(kind, labels)
    out: dict[str, Any] = {"model_name": cfg.name,
                           "outputs": [{"name": name, **tensors[ALIASES.get(name, name)]} for name in names]}
    if request_id is not None:
        out["id"] = request_id
    return out


def decoded(raw: bytes, encoding: str | None, limit: int) -> bytes:
    """A body sent compressed (``Content-Encoding: gzip`` or ``deflate``, as Triton's clients
    may), inflated up to the body limit: a small body that inflates past it is a 413."""
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return raw
    how = encoding.strip().lower()
    if how not in ("gzip", "deflate"):
        raise HTTPProblem(415, f"Content-Encoding {encoding[:32]!r} is not taken: send gzip, deflate or none")
    inflate = zlib.decompressobj(wbits=31 if how == "gzip" else 15)
    try:
        out = inflate.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise bad(f"the body is not {how} data: {exc}") from None
    if len(out) > limit:
        raise HTTPProblem(413, f"body inflates past the limit of {limit} bytes ({BATCH_LIMIT})")
    return out


def _binary(tensors: list[dict[str, Any]], blob: bytes) -> list[bytes | None]:
    """Each input's raw bytes under the binary data extension, cut from ``blob`` (what follows the
    JSON header) in the order of the inputs, by their ``binary_data_size``; None for an input
    whose values are in its ``data``."""
    sizes = [t["parameters"].get("binary_data_size") if isinstance(t.get("parameters"), dict) else None
             for t in tensors]
    given = [n for n in sizes if n is not None]
    if not given:
        return [None] * len(tensors)
    wrong = next((i for i, n in enumerate(sizes) if n is not None and (type(n) is not int or n < 0)), None)
    if wrong is not None:
        name = str(tensors[wrong].get("name"))[:64]
        raise bad(f"binary_data_size {repr(sizes[wrong])[:32]} of input {wrong} ({name!r}) is not a number of bytes")
    if sum(given) != len(blob):
        told = " + ".join(map(str, given)) if len(given) <= 8 else f"of {len(given)} inputs, {sum(given)} in all,"
        raise bad(f"binary_data_size {told} is not the {len(blob)} bytes after the JSON header" + _misfit(tensors, sizes))
    out: list[bytes | None] = []
    at = 0
    for n in sizes:
        out.append(None if n is None else blob[at:at + n])
        at += n or 0
    return out


def _misfit(tensors: list[dict[str, Any]], sizes: list[Any]) -> str:
    """Where sizes do not add up: the first input whose size is not what its shape and
    datatype take ('' when every one fits, or none can be told: BYTES, or a shape not yet checked)."""
    for i, (t, n) in enumerate(zip(tensors, sizes)):
        shape, datatype = t.get("shape"), t.get("datatype")
        if n is None or datatype not in _DTYPE_OF or datatype == "BYTES" or not isinstance(shape, list) \
                or not all(type(d) is int and d >= 0 for d in shape):
            continue
        takes = math.prod(shape) * np.dtype(_DTYPE_OF[datatype]).itemsize
        if n != takes:
            name = str(t.get("name"))[:64]
            return f"; input {i} ({name!r}) of shape {shape} and {datatype} takes {takes} bytes, not {n}"
    return ""


def bad(reason: str) -> HTTPProblem:
    return HTTPProblem(400, reason)


def _fits(shape: list[int], datatype: str, spec: TensorSpec) -> None:
    """The tensor's shape is a batch of the model's, of a datatype whose values it takes: the
    model's own, or a number of the same kind (JSON numbers have no width)."""
    if tuple(shape[1:]) != spec.shape:
        also = " (or [n, 1])" if not spec.shape else ""  # one value per example: MLServer sends [n, 1]
        raise bad(f"input shape {shape} is not a batch of the model's {list(spec.shape)}: expected "
                  f"{['n', *spec.shape]}{also}".replace("'n'", "n"))
    given, takes = _DTYPE_OF[datatype], spec.dtype
    if datatype == "BYTES" or takes in ("string", "bytes"):
        ok = datatype == DATATYPES[takes]
    else:
        ok = (given == "bool") == (takes == "bool") and bool(np.can_cast(given, takes, casting="same_kind"))
    if not ok:
        raise bad(f"input datatype {datatype} does not fit the model's {DATATYPES[takes]} ({takes})")


def _flat(data: Any, shape: list[int]) -> list[Any]:
    """A tensor's values in row-major order, sent flat, or nested as its shape is (a nested
    list of other lengths is refused, not silently re-split into rows)."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(x, list) for x in data):
        return data
    out: list[Any] = []

    def walk(value: Any, depth: int, where: str) -> None:
        if depth == len(shape):
            if isinstance(value, list):
                raise bad(f"{where} is a list, nested deeper than shape {shape}")
            out.append(value)
            return
        if not isinstance(value, list) or len(value) != shape[depth]:
            got = f"a list of {len(value)}" if isinstance(value, list) else "not a list"
            raise bad(f"{where} is {got}, and shape {shape} needs a list of {shape[depth]} there (or send data flat)")
        for i, x in enumerate(value):
            walk(x, depth + 1, f"{where}[{i}]")

    walk(data, 0, "data")
    return out


def _parameters(params: Any) -> dict[str, Any]:
    """The request's ``context`` and ``slo_ms``, from its parameters (others are left alone:
    clients add their own, such as ``content_type``)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise bad("`parameters` must be an object")
    return {k: params[k] for k in ("context", "slo_ms") if k in params}


def wanted(outputs: Any) -> list[str]:
    """The outputs asked for by name (all when none are named)."""
    if outputs is None:
        return []
    names = [o.get("name") if isinstance(o, dict) else None for o in outputs] if isinstance(outputs, list) else [None]
    unknown = [n for n in names if n not in OUTPUTS and n not in ALIASES]
    if unknown:
        raise bad(f"unknown output {unknown[0]!r}: an app answers {', '.join(OUTPUTS)} (and, by MLServer's names, "
                  f"{' and '.join(f'{a} ({o})' for a, o in ALIASES.items())})")
    one = [ALIASES.get(n, n) for n in names]  # type: ignore[arg-type]
    for i, name in enumerate(names):  # each output once, as Triton asks too
        first = one.index(one[i])
        if first != i:
            prior = names[first]
            raise bad(f"output {name!r} is asked for twice: ask for each once" if prior == name else
                      f"outputs {prior!r} and {name!r} are one output, by MLServer's name and the app's: ask for one")
    for o in outputs:
        if isinstance(o.get("parameters"), dict) and o["parameters"].get("classification"):
            raise bad(f"output {o['name']!r}: classification (class_count) is not offered; ask for `scores`, each "
                      "label's score, and `output`, the answer")
    return names  # type: ignore[return-value]


def output_datatype(kind: str | None, labels: tuple[Any, ...] | None, default: Any, outs: list[Any] = ()) -> str:
    """The one datatype every answer of the app fits (its labels or values, and its default):
    BOOL, INT64, FP64, or BYTES (written as text). Without labels, the answers decide."""
    # no default (null) is no value: a default's row then carries a zero, as its scores do
    values = [*(labels or outs), *([] if default is None else [default]), *([0.0] if kind == "regression" else [])]
    types = {type(v) for v in values}
    if types <= {bool}:
        return "BOOL"
    if types <= {int}:
        return "INT64"
    if types <= {int, float}:
        return "FP64"
    return "BYTES"
