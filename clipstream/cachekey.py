"""The prediction cache's key: ``Predict(model, version, x)`` named in Redis (Clipper section 4.2).

The batcher looks keys up and the worker fills them, so both stages build them here. The key
names the model, its version (a new version must never be answered from the old one's
entries) and a hash of the input exactly as it travels: dtype, shape and raw bytes, because
the same bytes mean different inputs as ``float32[4]`` and ``int8[16]``.
"""

from __future__ import annotations

import hashlib

from schemas import Tensor

KEY_PREFIX = "cs:cache:"
NO_VERSION = "-"


def input_digest(tensor: Tensor) -> str:
    """sha1 hex of ``dtype|shape|raw bytes`` of a Tensor record."""
    shape = ",".join(str(int(d)) for d in tensor.shape)
    h = hashlib.sha1()
    h.update(f"{tensor.dtype}|{shape}|".encode())
    h.update(tensor.data)
    return h.hexdigest()


def key_of(model: str, version: str | None, digest: str) -> str:
    """``cs:cache:<model>:<version>:<digest>``; version None is written ``-``."""
    return f"{KEY_PREFIX}{model}:{version or NO_VERSION}:{digest}"


def cache_key(model: str, version: str | None, tensor: Tensor) -> str:
    """The key of ``model`` at ``version`` for the input ``tensor``."""
    return key_of(model, version, input_digest(tensor))
