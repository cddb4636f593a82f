"""clipstream: the Clipper prediction-serving design as a pipeline on Apache Kafka."""

from __future__ import annotations

from clipstream.errors import (
    ClipstreamError,
    ConfigError,
    DecodeError,
    InfraError,
    InputError,
    ModelError,
)
from clipstream.settings import Settings, get_settings

__all__ = [
    "ClipstreamError",
    "ConfigError",
    "DecodeError",
    "InfraError",
    "InputError",
    "ModelError",
    "Settings",
    "get_settings",
]


def __getattr__(name: str) -> object:
    # the client side is imported lazily: a worker process never needs httpx
    if name in ("Client", "Producer"):
        from frontend import client

        return getattr(client, name)
    raise AttributeError(name)
