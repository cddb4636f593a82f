"""Tensors on the wire: dtype name + shape + raw little-endian bytes, no per-element encoding."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from clipstream.errors import DecodeError

# dtype names accepted on the wire; anything else is refused rather than guessed
DTYPES: frozenset[str] = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    }
)


def to_tensor(array: Any) -> dict[str, Any]:
    """The Tensor record of an array (anything numpy can turn into one)."""
    arr = np.asarray(array)
    name = arr.dtype.name
    if name not in DTYPES:
        raise DecodeError(f"dtype {name!r} cannot travel as a tensor; use one of {sorted(DTYPES)}")
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not _little_endian()):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return {"dtype": name, "shape": list(arr.shape), "data": np.ascontiguousarray(arr).tobytes()}


def from_tensor(record: dict[str, Any]) -> np.ndarray:
    """The array of a Tensor record; a mismatch of dtype, shape and byte count is a DecodeError."""
    try:
        name = record["dtype"]
        shape = tuple(int(d) for d in record["shape"])
        data = record["data"]
    except (KeyError, TypeError, ValueError) as exc:
        raise DecodeError(f"not a tensor record: {exc}") from exc
    if name not in DTYPES:
        raise DecodeError(f"unknown tensor dtype {name!r}")
    if any(d < 0 for d in shape):
        raise DecodeError(f"negative dimension in tensor shape {shape}")
    dtype = np.dtype(name).newbyteorder("<")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise DecodeError(
            f"tensor of dtype {name} and shape {list(shape)} needs {expected} bytes, got {len(data)}"
        )
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    return arr.astype(arr.dtype.newbyteorder("=")) if not _little_endian() else arr


def _little_endian() -> bool:
    return np.little_endian
