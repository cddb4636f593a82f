"""Avro schemas of every record on every topic, their typed records, and the codec."""

from schemas.codec import Codec, decode, decode_as, decode_dict, default_codec, encode, encode_dict
from schemas.records import (
    App,
    Batch,
    BatchItem,
    BatchStats,
    DeadLetter,
    Feedback,
    Link,
    Model,
    ModelRequest,
    OutputKind,
    Prediction,
    Predictions,
    Record,
    Response,
    Route,
    Tensor,
    QueryEvent,
    route_of,
)
from schemas.tensor import DTYPES, from_tensor, to_tensor

__all__ = [
    "App", "Batch", "BatchItem", "BatchStats", "Codec", "DTYPES", "DeadLetter", "Feedback", "Link",
    "Model", "ModelRequest", "OutputKind", "Prediction", "Predictions", "QueryEvent", "Record",
    "Response", "Route", "Tensor", "decode", "decode_as", "decode_dict", "default_codec", "encode",
    "encode_dict", "from_tensor", "route_of", "to_tensor",
]
