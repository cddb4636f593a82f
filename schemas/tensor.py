"""Tensors on the wire: dtype name + shape + raw little-endian bytes, no per-element encoding.

Text and byte strings (``string``, ``bytes``: a model gets Python ``str`` or ``bytes`` in an
object array) have no fixed width, so each element travels as its length (uint32,
little-endian) and then its bytes, in C order: the layout of Triton's and KServe's BYTES
tensors, in the same ``Tensor`` record.
"""

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
        "string",
        "bytes",
    }
)
# the dtypes whose elements are of any length: UTF-8 text (``str``) and opaque bytes
VARIABLE: frozenset[str] = frozenset({"string", "bytes"})
_LENGTH = 4  # bytes of each element's length prefix


def dtype_name(array: np.ndarray) -> str:
    """The wire dtype of an array: numpy's name, or ``string``/``bytes`` for an array of
    ``str``/``bytes`` (an object array holding only one of the two, or numpy's ``U``/``S``);
    DecodeError for an object array holding anything else."""
    kind = array.dtype.kind
    if kind == "U":
        return "string"
    if kind == "S":
        return "bytes"
    if kind != "O":
        return array.dtype.name
    types = set(map(type, array.flat))
    if types <= {str}:
        return "string"
    if types <= {bytes}:
        return "bytes"
    found = ", ".join(sorted(t.__name__ for t in types - {str, bytes})) or "both str and bytes"
    raise DecodeError(f"an object array travels only when it holds only str or only bytes, not {found}")


def packed(array: Any) -> bytes:
    """Each element's length and bytes, in C order (str as UTF-8): the BYTES layout, which the
    Open Inference Protocol's raw contents use too."""
    parts: list[bytes] = []
    for x in np.asarray(array, dtype=object).flat:
        raw = x.encode() if isinstance(x, str) else bytes(x)
        parts.append(len(raw).to_bytes(_LENGTH, "little"))
        parts.append(raw)
    return b"".join(parts)


def _unpacked(name: str, shape: tuple[int, ...], data: bytes) -> np.ndarray:
    """The object array of a variable-length tensor's bytes; DecodeError on any mismatch."""
    count = math.prod(shape)
    if count * _LENGTH > len(data):
        raise DecodeError(f"tensor of dtype {name} and shape {list(shape)} needs at least {count * _LENGTH} "
                          f"bytes, got {len(data)}")
    out = np.empty(count, dtype=object)
    at, view = 0, memoryview(data)
    for i in range(count):
        if at + _LENGTH > len(data):
            raise DecodeError(f"tensor of dtype {name} ends inside element {i}'s length")
        n = int.from_bytes(view[at:at + _LENGTH], "little")
        at += _LENGTH
        if at + n > len(data):
            raise DecodeError(f"tensor of dtype {name}: element {i} of {n} bytes runs past the data")
        raw = bytes(view[at:at + n])
        at += n
        if name == "string":
            try:
                out[i] = raw.decode()
            except UnicodeDecodeError as exc:
                raise DecodeError(f"tensor of dtype string: element {i} is not UTF-8 ({exc.reason})") from None
        else:
            out[i] = raw
    if at != len(data):
        raise DecodeError(f"tensor of dtype {name} and shape {list(shape)} has {len(data) - at} bytes "
                          "after its last element")
    return out.reshape(shape)


def tensor_fields(array: Any) -> tuple[str, list[int], bytes]:
    """(dtype, shape, little-endian bytes) of an array (anything numpy can turn into one)."""
    arr = np.asarray(array)
    if arr.dtype.kind in "OUS":
        return dtype_name(arr), list(arr.shape), packed(arr)
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
    if name in VARIABLE:
        return _unpacked(name, shape, data)
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
