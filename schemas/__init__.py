"""Avro schemas of every record on every topic, and the codec that reads and writes them."""

from schemas.codec import Codec, decode, decode_as, default_codec, encode
from schemas.tensor import DTYPES, from_tensor, to_tensor

__all__ = ["Codec", "DTYPES", "decode", "decode_as", "default_codec", "encode", "from_tensor", "to_tensor"]
