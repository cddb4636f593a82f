"""The small error hierarchy every stage raises.

One base class lets a stage catch "anything clipstream considers a bad input or a bad
configuration" without swallowing programming errors (TypeError, KeyError, ...).
"""

from __future__ import annotations


class ClipstreamError(Exception):
    """Base of every error clipstream raises on purpose."""


class ConfigError(ClipstreamError):
    """A setting, app file, model.yaml or registry entry is wrong; the message says which."""


class DecodeError(ClipstreamError):
    """Bytes that are not a record we know: garbage, truncated, or an unknown schema."""


class InputError(ClipstreamError):
    """An input tensor that does not match what the model declares (dtype, shape)."""


class InfraError(ClipstreamError):
    """The local Kafka or Redis could not be installed, started or reached."""


class ModelError(ClipstreamError):
    """A model failed to load or to predict."""


def one_line(text: object, limit: int = 500) -> str:
    """An error's text on one line: a runtime's multi-line message (ONNX Runtime's, a traceback's
    tail) would otherwise show only its last line where one line is read (`up`'s restart line)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
