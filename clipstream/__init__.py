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


# the application side is imported lazily: a worker process never needs httpx or the registry
_LAZY = {
    "Client": "frontend.client",
    "Producer": "frontend.producer",
    "ResponseReader": "frontend.producer",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
