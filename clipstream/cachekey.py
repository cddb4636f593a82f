"""The prediction cache's key: ``Predict(model, version, x)`` named in Redis (Clipper section 4.2).

The batcher looks keys up and the worker fills them, so both stages build them here. The key
names the model, its version (a new version must never be answered from the old one's
entries) and a hash of the input exactly as it travels: dtype, shape and raw bytes, because
the same bytes mean different inputs as ``float32[4]`` and ``int8[16]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Protocol

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


class CacheKeys(Protocol):
    """The two calls of a Redis client that ``forget_model`` needs."""

    def scan_iter(self, match: str, count: int) -> Iterator[bytes | str]: ...

    def unlink(self, *names: bytes | str) -> int: ...


def forget_model(client: CacheKeys, model: str, chunk: int = 500) -> int:
    """Delete every cached prediction of ``model``, of all its versions; the number deleted.

    A removed model's version history goes with it, so a model deployed again under the same
    name may reuse a version number, and must not be answered from the old entries."""
    deleted = 0
    keys: list[bytes | str] = []
    for key in client.scan_iter(match=f"{KEY_PREFIX}{model}:*", count=chunk):
        keys.append(key)
        if len(keys) >= chunk:
            deleted += client.unlink(*keys)
            keys = []
    if keys:
        deleted += client.unlink(*keys)
    return deleted
