"""Avro codec for every record, with Avro single-object encoding.

Each encoded record starts with the two marker bytes ``C3 01`` and the 8-byte little-endian
CRC-64-AVRO fingerprint of its schema's parsing canonical form, so any reader can tell which
schema wrote it. Schemas are parsed once, at import; decoding uses the parsed schema.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, load_schema, parse_schema, to_parsing_canonical_form

from clipstream.errors import DecodeError
from schemas.records import BY_NAME, RECORD_TYPES, R, Record, from_avro, to_avro

SCHEMA_DIR = Path(__file__).parent
MAGIC = b"\xc3\x01"
HEADER_LEN = len(MAGIC) + 8

# short name -> file; every record type of clipstream
RECORD_NAMES: tuple[str, ...] = tuple(cls.__name__ for cls in RECORD_TYPES)


@dataclass(frozen=True)
class RecordSchema:
    name: str
    parsed: Any  # the schema records are read as (and written with, for the current one)
    fingerprint: int
    header: bytes
    writer: Any = None  # another version's schema that wrote the record; None: ``parsed``


def schema_fingerprint(schema: Any) -> bytes:
    """The 8 bytes a record of ``schema`` (parsed) carries after ``MAGIC``: the CRC-64-AVRO of
    its parsing canonical form, little-endian (fastavro gives them as hex, in that order)."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


class Codec:
    """Encodes and decodes clipstream records by short name (``"QueryEvent"``, ...).

    ``resolver``, when set, is called with a fingerprint no schema of this codec has; it may
    ``learn`` the schema that wrote it (a newer clipstream's), and the record is read again."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR, names: tuple[str, ...] = RECORD_NAMES) -> None:
        self._by_name: dict[str, RecordSchema] = {}
        self._by_fingerprint: dict[int, RecordSchema] = {}
        self.resolver: Callable[[int], None] | None = None
        for name in names:
            parsed = load_schema(str(schema_dir / f"clipstream.{name}.avsc"))
            wire = schema_fingerprint(parsed)
            schema = RecordSchema(name, parsed, int.from_bytes(wire, "little"), MAGIC + wire)
            self._by_name[name] = schema
            self._by_fingerprint[schema.fingerprint] = schema
        for path in sorted((schema_dir / "earlier").glob("clipstream.*.avsc")):
            # a record type's earlier schema: what it wrote is read as the current type, the
            # fields added since taking their defaults (Avro's schema resolution)
            self.learn(load_schema(str(path)))
        for schema in list(self._by_fingerprint.values()):
            # records of earlier clipstream versions carry the 8 bytes reversed (a registry topic
            # keeps them for good): still read, never written
            self._by_fingerprint.setdefault(int.from_bytes(schema.header[2:], "big"), schema)

    def learn(self, writer: Any) -> int | None:
        """Read records written with ``writer`` (a parsed schema of another clipstream version)
        as the current record type of its name, by Avro's schema resolution: fields added since
        take their defaults, fields it has and this version lacks are skipped. Returns its
        fingerprint; None when no record type of this version has its name."""
        current = self._by_name.get(str(writer.get("name", "")).rsplit(".", 1)[-1]) if isinstance(writer, dict) else None
        if current is None:
            return None
        writer = parse_schema(writer, _write_hint=False)  # parsed once, not at every read
        wire = schema_fingerprint(writer)
        fp = int.from_bytes(wire, "little")
        if fp not in self._by_fingerprint:
            self._by_fingerprint[fp] = RecordSchema(current.name, current.parsed, fp, MAGIC + wire, writer)
        return fp

    def written(self) -> dict[str, str]:
        """Fingerprint (16 hex digits, as the header carries them) -> parsing canonical form, of
        every schema this version writes with: what ``topics.schema_topic`` publishes."""
        return {s.header[2:].hex(): to_parsing_canonical_form(s.parsed) for s in self._by_name.values()}

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def schema(self, name: str) -> RecordSchema:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no record type {name!r}; known: {sorted(self._by_name)}") from None

    def encode(self, record: Record) -> bytes:
        """The bytes of a typed record (``schemas.records``)."""
        return self.encode_dict(type(record).__name__, to_avro(record))

    def encode_dict(self, name: str, fields: Mapping[str, Any]) -> bytes:
        """The bytes of a record of type ``name`` given as the plain dict fastavro writes (tools,
        and the proof that the typed records keep the wire format)."""
        schema = self.schema(name)
        buf = io.BytesIO()
        buf.write(schema.header)
        schemaless_writer(buf, schema.parsed, fields)
        return buf.getvalue()

    def decode(self, data: bytes) -> Record:
        """The typed record these bytes hold, whatever its type; anything else is a DecodeError."""
        schema = self._schema_of(data)
        return from_avro(BY_NAME[schema.name], self._read(schema, data))

    def decode_as(self, kind: type[R], data: bytes) -> R:
        """Decode a record that must be of type ``kind`` (a class of ``schemas.records``)."""
        schema = self._schema_of(data)
        if schema.name != kind.__name__:
            raise DecodeError(f"expected a {kind.__name__} record, got a {schema.name}")
        return from_avro(kind, self._read(schema, data))

    def decode_dict(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """The record type's short name and the plain dict fastavro reads (tools, taps)."""
        schema = self._schema_of(data)
        return schema.name, self._read(schema, data)

    def _schema_of(self, data: bytes) -> RecordSchema:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DecodeError(f"expected bytes, got {type(data).__name__}")
        if bytes(data[:2]) != MAGIC:
            raise DecodeError("not an Avro single-object record (missing C3 01 marker)")
        if len(data) < HEADER_LEN:
            raise DecodeError(f"an Avro single-object record cut short: {len(data)} bytes, and its header alone is "
                              f"{HEADER_LEN} (C3 01 and the schema's 8-byte fingerprint)")
        fp = struct.unpack_from("<Q", data, 2)[0]
        schema = self._by_fingerprint.get(fp)
        if schema is None and self.resolver is not None:
            self.resolver(fp)
            schema = self._by_fingerprint.get(fp)
        if schema is None:
            raise DecodeError(f"unknown schema fingerprint {bytes(data[2:HEADER_LEN]).hex()} (its bytes in the "
                              "header, as the schemas topic keys each schema): write the fingerprint of a clipstream "
                              "schema's canonical form, with each named type it uses (a query's Tensor) defined "
                              "inline (docs/KAFKA_CLIENTS.md lists each record's first 10 bytes)")
        return schema

    @staticmethod
    def _read(schema: RecordSchema, data: bytes) -> dict[str, Any]:
        buf = io.BytesIO(data)
        buf.seek(HEADER_LEN)
        try:
            record = schemaless_reader(buf, schema.writer or schema.parsed, schema.parsed if schema.writer else None)
        except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError, ...
            raise DecodeError(f"{schema.name} record does not decode: {type(exc).__name__}: {exc}") from exc
        if buf.tell() != len(data):
            raise DecodeError(f"{schema.name} record has {len(data) - buf.tell()} trailing bytes")
        return record  # type: ignore[return-value]


_default: Codec | None = None


def default_codec() -> Codec:
    global _default
    if _default is None:
        _default = Codec()
    return _default


def encode(record: Record) -> bytes:
    return default_codec().encode(record)


def encode_dict(name: str, fields: Mapping[str, Any]) -> bytes:
    return default_codec().encode_dict(name, fields)


def decode(data: bytes) -> Record:
    return default_codec().decode(data)


def decode_as(kind: type[R], data: bytes) -> R:
    return default_codec().decode_as(kind, data)


def decode_dict(data: bytes) -> tuple[str, dict[str, Any]]:
    return default_codec().decode_dict(data)
