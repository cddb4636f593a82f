"""Tensors on the wire: dtype name + shape + raw little-endian bytes, no per-element encoding."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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


def tensor_fields(array: Any) -> tuple[str, list[int], bytes]:
    """(dtype, shape, little-endian bytes) of an array (anything numpy can turn into one)."""
    arr = np.asarray(array)
    name = arr.dtype.name
    if name not in DTYPES:
        raise DecodeError(f"dtype {name!r} cannot travel as a tensor; use one of {sorted(DTYPES)}")
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and not _little_endian()):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return name, list(arr.shape), np.ascontiguousarray(arr).tobytes()


def to_tensor(array: Any) -> dict[str, Any]:
    """The Tensor record of an array, as the plain dict the codec writes."""
    name, shape, data = tensor_fields(array)
    return {"dtype": name, "shape": shape, "data": data}


def from_tensor(record: Any) -> np.ndarray:
    """The array of a Tensor record (a ``schemas.records.Tensor`` or its dict)."""
    try:
        if isinstance(record, Mapping):
            return array_of(record["dtype"], record["shape"], record["data"])
        return array_of(record.dtype, record.shape, record.data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise DecodeError(f"not a tensor record: {exc}") from exc


def array_of(name: str, shape: Sequence[int], data: bytes) -> np.ndarray:
    """The array of a tensor's fields, without copying; a mismatch of dtype, shape and byte
    count is a DecodeError."""
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"not a tensor shape: {exc}") from exc
    if name not in DTYPES:
        raise DecodeError(f"unknown tensor dtype {name!r}: use one of {sorted(DTYPES)}")
    if any(d < 0 for d in shape):
        raise DecodeError(f"negative dimension in tensor shape {shape}")
    dtype = np.dtype(name).newbyteorder("<")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise DecodeError(
            f"tensor of dtype {name} and shape {list(shape)} needs {expected} bytes, got {len(data)}"
        )
    try:
        arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as exc:  # e.g. more dimensions than numpy allows
        raise DecodeError(f"tensor of shape {list(shape)} cannot be built: {exc}") from exc
    return arr.astype(arr.dtype.newbyteorder("=")) if not _little_endian() else arr


def _little_endian() -> bool:
    return np.little_endian
