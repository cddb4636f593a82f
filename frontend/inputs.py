"""JSON input -> tensor, checked against a model's declared input (dtype and shape).

Pure (no I/O), so the gateway and the Producer refuse a bad input with a reason before it
costs a trip through Kafka, and the rules are unit-tested alone. The walk visits every list
(there are prod(shape[:-1]) of them) but checks the innermost lists' element types with one
``set(map(type, ...))`` each, so a 784-pixel image costs microseconds, not a Python loop per
element. ``type(x)`` (not ``isinstance``) is what keeps ``True`` out of a float tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from clipstream.errors import InputError
from registry.labels import INT64_MAX, INT64_MIN
from registry.spec import TensorSpec, not_finite
from schemas.tensor import VARIABLE, array_of

_BOOL: frozenset[type] = frozenset({bool})
_INT: frozenset[type] = frozenset({int})
_FLOAT: frozenset[type] = frozenset({int, float})
_TEXT: frozenset[type] = frozenset({str, bytes})  # bytes from a Python caller (JSON has only str)
_NESTED_OR_BOOL: frozenset[type] = frozenset({list, tuple, bool, np.bool_})


def _allowed(dtype: str) -> tuple[frozenset[type], str]:
    if dtype in VARIABLE:
        return _TEXT, "a string"
    kind = np.dtype(dtype).kind
    if kind == "b":
        return _BOOL, "a boolean"
    if kind in "iu":
        return _INT, "an integer"
    return _FLOAT, "a number"


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def parse_input(value: Any, spec: TensorSpec) -> np.ndarray:
    """One example as an array of ``spec.dtype`` and ``spec.shape``; InputError says why not.

    JSON integers are fine for float inputs; booleans, strings, nulls, ragged lists, wrong
    lengths and integers out of the dtype's range are not. Every reason names the shape the
    model expects. A ``string`` or ``bytes`` input takes JSON strings (``bytes`` as their UTF-8);
    one of one element (skl2onnx's ``[1]``) takes its string alone too, as its raw body is.
    """
    if spec.dtype in VARIABLE and isinstance(value, str | bytes) and spec.shape and math.prod(spec.shape) == 1:
        for _ in spec.shape:
            value = [value]
    allowed, what = _allowed(spec.dtype)
    expect = f"the model takes shape {list(spec.shape)}, dtype {spec.dtype}"
    _walk(value, spec.shape, 0, "input", allowed, what, expect)
    if spec.dtype in VARIABLE:
        return _elements(np.array(value, dtype=object), spec.dtype, expect)
    return _numbers(value, spec.dtype, expect)


def _numbers(values: Any, dtype: str, expect: str) -> np.ndarray:
    """Checked values (nested or flat) as an array of ``dtype``: one that does not fit it, or
    overflows to infinity, is an InputError."""
    try:
        with np.errstate(over="ignore"):  # overflow to inf is caught just below, with a reason
            arr = np.array(values, dtype=dtype)
    except (OverflowError, ValueError, TypeError) as exc:
        raise InputError(f"input values do not fit {dtype}: {exc} ({expect})") from None
    if not_finite(arr):
        raise InputError(f"input has values out of range for {dtype} ({expect})")
    return arr


def parse_rows(values: list[Any], spec: TensorSpec, rows: int, expect: str | None = None) -> np.ndarray:
    """``rows`` examples from their values flattened in row-major order (as the Open Inference
    Protocol sends a tensor), of shape ``(rows, *spec.shape)``; checked as ``parse_input``
    checks one example's values. InputError names the first bad value's index, and ``expect``
    (by default, the spec as the model's)."""
    allowed, what = _allowed(spec.dtype)
    expect = expect or f"the model takes shape {list(spec.shape)}, dtype {spec.dtype}"
    types = set(map(type, values))
    if not types <= allowed or (float in types and not all(map(math.isfinite, values))):
        i, bad = next((i, v) for i, v in enumerate(values)
                      if type(v) not in allowed or (type(v) is float and not math.isfinite(v)))
        problem = f"{_describe(bad)}, expected {what}" if type(bad) not in allowed else "not a finite number"
        raise InputError(f"data[{i}] is {problem} ({expect})")
    if spec.dtype in VARIABLE:
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return _elements(arr, spec.dtype, expect).reshape((rows, *spec.shape))
    return _numbers(values, spec.dtype, expect).reshape((rows, *spec.shape))


def _walk(
    value: Any,
    shape: tuple[int, ...],
    depth: int,
    where: str,
    allowed: frozenset[type],
    what: str,
    expect: str,
) -> None:
    if depth == len(shape):
        if type(value) not in allowed:
            raise InputError(f"{where} is {_describe(value)}, expected {what} ({expect})")
        if type(value) is float and not math.isfinite(value):
            raise InputError(f"{where} is not a finite number ({expect})")
        return
    n = shape[depth]
    if not isinstance(value, list):
        raise InputError(f"{where} is {_describe(value)}, expected a list of {n} ({expect})")
    if len(value) != n:
        batch = depth == 0 and bool(value) and all(isinstance(v, list) and len(v) == n for v in value)
        raise InputError(f"{where} has {len(value)} items, expected {n} ({expect})"
                         + ("; it looks like several examples: send one per call" if batch else ""))
    if depth == len(shape) - 1:
        types = set(map(type, value))
        if types <= allowed:
            if float in types and not all(map(math.isfinite, value)):
                raise InputError(f"{where} holds a value that is not a finite number ({expect})")
            return
        # something is off in this innermost list: find the first bad item for the reason
    for i, item in enumerate(value):
        _walk(item, shape, depth + 1, f"{where}[{i}]", allowed, what, expect)


def parse_untyped(value: Any) -> np.ndarray:
    """An input for an app with no model spec to check against: any rectangular numbers.

    Integers become int64 and anything with a fraction float32 (the common model dtype); the
    worker still checks the model's declared input when one appears later. An integer outside
    int64 is refused rather than wrapped or rounded, and a boolean in a list as a bare one is.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        raise InputError(f"input is {_describe(value)}, expected numbers (a number or nested lists)")
    try:
        arr = np.array(value)
    except ValueError as exc:
        raise InputError(f"input is not a rectangular nested list of numbers ({exc})") from None
    if arr.dtype.kind in "iufO":
        types: set[type] = set()
        where = _untyped_items(value, "input", types)
        if where is not None:
            raise InputError(f"{where} is a boolean, expected a number (a boolean is not a number here)")
        ints_only = bool(types) and all(issubclass(t, (int, np.integer)) for t in types)
        # numpy holds integers beyond int64 as uint64, float64 or objects; none is an int64 input
        if (ints_only and arr.dtype.kind in "fO") or (
                arr.dtype.kind == "u" and arr.size and arr.max() > INT64_MAX):
            raise InputError(f"input holds an integer outside the int64 range [{INT64_MIN}, {INT64_MAX}]")
    if arr.dtype.kind == "f":
        arr = arr.astype(np.float32)
    elif arr.dtype.kind in "iu":
        arr = arr.astype(np.int64)
    else:
        raise InputError(f"input must hold numbers only, got {arr.dtype.name} values")
    if not_finite(arr):
        raise InputError("input has values that are not finite numbers")
    return arr


def _untyped_items(value: Any, where: str, types: set[type]) -> str | None:
    """Adds the types of the numbers in nested lists to ``types``, one ``set(map(type, ...))``
    per innermost list, and says where the first boolean is (None if none): numpy would read
    ``[true, 1]`` as ``[1, 1]``, though a bare ``true`` is refused."""
    if not isinstance(value, (list, tuple)):
        types.add(type(value))
        return where if isinstance(value, (bool, np.bool_)) else None
    inner = set(map(type, value))
    if not inner & _NESTED_OR_BOOL:
        types |= inner
        return None
    for i, item in enumerate(value):
        found = _untyped_items(item, f"{where}[{i}]", types)
        if found is not None:
            return found
    return None


def array_for(arr: np.ndarray, spec: TensorSpec | None) -> np.ndarray:
    """A numpy input as the model takes it: of its shape, and cast to its dtype when no value
    changes kind (scikit-learn's float64 rows for a float32 model); InputError says why not. A
    list goes through ``input_for`` instead, which checks each value."""
    if spec is None:
        return arr
    expect = f"the model takes shape {list(spec.shape)}, dtype {spec.dtype}"
    if not_finite(arr):
        raise InputError(f"input has values that are not finite numbers ({expect})")
    if tuple(arr.shape) != tuple(spec.shape):
        raise InputError(f"input has shape {list(arr.shape)} ({expect}); send one example per query")
    if spec.dtype in VARIABLE:
        if arr.dtype.kind not in "OUS":
            raise InputError(f"input dtype {arr.dtype} is not text or bytes ({expect})")
        return _elements(np.asarray(arr, dtype=object), spec.dtype, expect)
    if arr.dtype == np.dtype(spec.dtype):
        return arr
    if not np.can_cast(arr.dtype, spec.dtype, casting="same_kind"):
        raise InputError(f"input dtype {arr.dtype} cannot be cast to {spec.dtype} ({expect})")
    with np.errstate(over="ignore"):
        out = arr.astype(spec.dtype)
    if not_finite(out) and not not_finite(arr):
        raise InputError(f"input has values out of range for {spec.dtype} ({expect})")
    return out


def input_of_bytes(raw: bytes, spec: TensorSpec | None) -> np.ndarray:
    """One example sent as its raw bytes (``application/octet-stream``): the model's dtype,
    little-endian, in C order, as a ``Tensor`` carries it. An image as JSON numbers takes about
    three times its size and milliseconds to parse; its bytes take neither. InputError says why
    not: no declared input to read them by, a size that is not one example, or values the
    dtype cannot hold (a float that is not finite, a bool that is neither 0 nor 1)."""
    if spec is None:
        raise InputError("a binary input is read by the model's declared input (dtype and shape), which the app's "
                         "model does not declare: send JSON")
    if spec.dtype in VARIABLE:
        return _one_element(raw, spec)
    dtype = np.dtype(spec.dtype).newbyteorder("<")
    expect = f"the model takes shape {list(spec.shape)}, dtype {spec.dtype}"
    size = dtype.itemsize * int(np.prod(spec.shape, dtype=np.int64))
    if len(raw) != size:
        raise InputError(f"a binary input of {len(raw)} bytes is not one example: {size} bytes, little-endian, "
                         f"C order ({expect})")
    return values_of_bytes(raw, spec.dtype, spec.shape, f" ({expect})")


def values_of_bytes(raw: bytes, dtype: str, shape: Sequence[int], expect: str = "") -> np.ndarray:
    """Numbers sent as their little-endian bytes in C order, as a ``Tensor`` carries them;
    InputError for values the dtype cannot hold (a float that is not finite, a bool that is
    neither 0 nor 1), DecodeError for a size that is not the shape's."""
    if dtype == "bool" and raw.translate(None, b"\x00\x01"):
        raise InputError(f"a binary bool input holds bytes other than 0 and 1{expect}")
    arr = array_of(dtype, shape, raw)
    if not_finite(arr):
        raise InputError(f"input has values that are not finite numbers{expect}")
    return arr


def _one_element(raw: bytes, spec: TensorSpec) -> np.ndarray:
    """A ``string`` or ``bytes`` input sent as its raw bytes: the body is its one element."""
    expect = f"the model takes shape {list(spec.shape)}, dtype {spec.dtype}"
    if math.prod(spec.shape) != 1:
        raise InputError(f"a binary body is one element, and the model takes {math.prod(spec.shape)} ({expect}): "
                         "send JSON, a list of strings")
    one = np.empty(1, dtype=object)
    one[0] = raw
    return _elements(one, spec.dtype, expect).reshape(spec.shape)


def _elements(arr: np.ndarray, dtype: str, expect: str) -> np.ndarray:
    """An object array of ``str`` (dtype ``string``) or ``bytes``: ``str`` goes to bytes as
    UTF-8, bytes to ``str`` only when they are UTF-8; anything else is refused."""
    out = np.empty(arr.shape, dtype=object)
    for i, x in enumerate(arr.flat):
        if isinstance(x, (bytes, np.bytes_)) and dtype == "string":
            try:
                x = bytes(x).decode()
            except UnicodeDecodeError:
                raise InputError(f"input element {i} is not UTF-8 text ({expect})") from None
        elif isinstance(x, (str, np.str_)):
            try:
                raw = str(x).encode()
            except UnicodeEncodeError:  # a lone surrogate: JSON's \udcff is no character
                raise InputError(f"input element {i} is not Unicode text: it holds a lone surrogate "
                                 f"({expect})") from None
            x = raw if dtype == "bytes" else str(x)
        elif isinstance(x, (bytes, np.bytes_)):
            x = bytes(x)
        else:
            raise InputError(f"input element {i} is {_describe(x)}, expected a string ({expect})")
        out.flat[i] = x
    return out


def input_for(value: Any, spec: TensorSpec | None) -> np.ndarray:
    """``parse_input`` when the app's model declares an input, else ``parse_untyped``."""
    return parse_input(value, spec) if spec is not None else parse_untyped(value)


def to_json(value: Any) -> Any:
    """The way back for callers: a numpy array or scalar as plain JSON (lists, numbers), so the
    Client and the Producer accept numpy inputs and labels; anything else is left as it is."""
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value
