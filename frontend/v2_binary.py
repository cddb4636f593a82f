"""The binary data extension's outputs: an infer answer's tensors as raw bytes after its JSON.

Triton's HTTP clients ask for them (``binary_data_output`` on the request, ``binary_data`` on
each output; tritonclient's ``InferRequestedOutput`` asks by default), and read a BYTES
output so sent as ``bytes``, where JSON data would read as ``str``. An output asked for this
way leaves its ``data`` out of the JSON and names its ``binary_data_size``; its bytes follow
the JSON in the outputs' order: little-endian numbers, one byte per BOOL, and each BYTES
element as its length (uint32) then its UTF-8 bytes.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

ALL = "*"  # every output, as ``binary_data_output`` asks
# a numeric datatype's bytes, little-endian
_NUMPY = {"BOOL": "?", "INT64": "<i8", "FP64": "<f8", "FP32": "<f4"}


def binary_asked(body: dict[str, Any]) -> frozenset[str]:
    """The outputs an infer body asks for as binary data: by name, ``ALL``, or none."""
    params = body.get("parameters")
    every = isinstance(params, dict) and params.get("binary_data_output") is True
    outputs = body.get("outputs")
    if not isinstance(outputs, list) or not outputs:
        return frozenset({ALL}) if every else frozenset()
    chosen = set()
    for o in outputs:
        own = o.get("parameters") if isinstance(o, dict) else None
        flag = own.get("binary_data", every) if isinstance(own, dict) else every
        if flag is True:
            chosen.add(o.get("name"))
    return frozenset(chosen)


def with_binary(answer: dict[str, Any], binary: frozenset[str]) -> tuple[bytes, bytes] | None:
    """(the JSON header, the bytes after it) with the outputs in ``binary`` moved out of the
    JSON; None when none is, and the answer goes as JSON alone."""
    blobs: list[bytes] = []
    for tensor in answer["outputs"]:
        if ALL not in binary and tensor["name"] not in binary:
            continue
        blob = _raw(tensor["datatype"], tensor.pop("data"))
        tensor["parameters"] = {**tensor.get("parameters", {}), "binary_data_size": len(blob)}
        blobs.append(blob)
    if not blobs:
        return None
    header = json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    return header, b"".join(blobs)


def _raw(datatype: str, data: list[Any]) -> bytes:
    if datatype == "BYTES":
        out = bytearray()
        for value in data:
            text = value if isinstance(value, bytes) else str(value).encode()
            out += len(text).to_bytes(4, "little") + text
        return bytes(out)
    return np.asarray(data, dtype=_NUMPY[datatype]).tobytes()
