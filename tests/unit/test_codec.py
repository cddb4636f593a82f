"""The Avro codec: every record round-trips; bad bytes raise DecodeError, never anything else."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from clipstream.errors import DecodeError
from schemas import DTYPES, App, Link, Tensor, decode, decode_as, decode_dict, default_codec, encode, encode_dict, from_tensor, to_tensor
from schemas.codec import MAGIC
from schemas.tensor import VARIABLE
from schemas.records import BY_NAME, RECORD_TYPES, from_avro
from tests.records import samples


def test_every_record_type_has_a_sample():
    assert set(samples()) == set(default_codec().names)


@pytest.mark.parametrize("name", sorted(samples()))
def test_round_trip(name):
    record = from_avro(BY_NAME[name], samples()[name])
    data = encode(record)
    assert data[:2] == MAGIC
    got = decode(data)
    assert type(got) is BY_NAME[name]
    assert got == record


@pytest.mark.parametrize("name", sorted(samples()))
def test_dicts_written_before_typed_records_still_decode(name):
    """The wire format is the schema's: bytes written from a plain dict decode as the typed
    record, and a typed record writes the same bytes."""
    plain = samples()[name]
    data = encode_dict(name, plain)
    assert decode_dict(data) == (name, plain)
    typed = decode_as(BY_NAME[name], data)
    assert encode(typed) == data


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.__name__)
def test_each_record_type_matches_its_schema(cls):
    """Field names and order of each dataclass are those of its .avsc file, and a default the
    dataclass gives is the schema's (a schema default before a required field has none in
    Python, where defaults come last)."""
    parsed = default_codec().schema(cls.__name__).parsed
    avro = [(f["name"], f.get("default", dataclasses.MISSING)) for f in parsed["fields"]]
    ours = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        ours.append((f.name, default))
    assert [n for n, _ in ours] == [n for n, _ in avro]
    for (name, default), (_, avro_default) in zip(ours, avro):
        if default is not dataclasses.MISSING:
            assert avro_default is not dataclasses.MISSING and default == avro_default, name
    assert cls.__dataclass_params__.frozen


def test_typed_tensor_round_trip():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    back = decode_as(Tensor, encode(Tensor.of(arr))).array()
    np.testing.assert_array_equal(back, arr)


def test_fingerprints_differ_per_schema():
    codec = default_codec()
    fps = {codec.schema(n).fingerprint for n in codec.names}
    assert len(fps) == len(codec.names)


def _crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO as the Avro specification gives it, written out here so the codec's
    framing is checked against the specification, not against fastavro."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_the_header_is_the_specifications_little_endian_fingerprint():
    """A reader in another language (Java's BinaryMessageDecoder) finds the fingerprint of the
    schema's canonical form in bytes 2..10, least significant byte first."""
    from fastavro.schema import to_parsing_canonical_form

    assert _crc64_avro(b'"null"') == 7195948357588979594  # the specification's own example
    codec = default_codec()
    for name in codec.names:
        schema = codec.schema(name)
        want = _crc64_avro(to_parsing_canonical_form(schema.parsed).encode())
        assert schema.header == MAGIC + want.to_bytes(8, "little"), name
        assert encode_dict(name, samples()[name])[:10] == schema.header


def test_records_of_the_earlier_byte_order_are_still_read():
    data = encode(Link(app="a", model="m"))
    legacy = data[:2] + data[2:10][::-1] + data[10:]  # how earlier versions wrote the fingerprint
    assert decode_as(Link, legacy) == decode_as(Link, data)


def test_records_an_earlier_schema_wrote_are_read_as_the_current_type(tmp_path):
    """A registry topic keeps the records of every earlier version for good: a Model written
    before its retired versions existed reads with them empty, and every earlier schema in
    ``schemas/earlier`` is one the codec reads."""
    import io
    from pathlib import Path

    from fastavro import schemaless_writer
    from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form

    import schemas

    earlier = sorted((Path(schemas.__file__).parent / "earlier").glob("clipstream.*.avsc"))
    assert earlier, "schemas/earlier holds the Model schema before retired versions"
    for path in earlier:
        writer = load_schema(str(path))
        name = writer["name"].rsplit(".", 1)[-1]
        plain = {k: v for k, v in samples()[name].items() if k in {f["name"] for f in writer["fields"]}}
        buf = io.BytesIO()
        buf.write(MAGIC + bytes.fromhex(fingerprint(to_parsing_canonical_form(writer), "CRC-64-AVRO")))
        schemaless_writer(buf, writer, plain)
        got = decode_as(BY_NAME[name], buf.getvalue())
        added = {f["name"]: f["default"] for f in default_codec().schema(name).parsed["fields"] if f["name"] not in plain}
        assert added and got == from_avro(BY_NAME[name], {**plain, **added}), path.name  # the new fields' defaults
        assert encode(got)[:10] == default_codec().schema(name).header  # written with the current one


def test_decode_as_rejects_another_type():
    data = encode(Link(app="a", model="m"))
    with pytest.raises(DecodeError, match="expected a App record, got a Link"):
        decode_as(App, data)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", b"garbage that is long enough", b"\xc3\x01" + b"\x00" * 3, "not bytes"],
)
def test_garbage_is_a_decode_error(data):
    with pytest.raises(DecodeError):
        decode(data)


def test_a_record_cut_short_after_its_marker_says_so():
    with pytest.raises(DecodeError, match="cut short: 5 bytes, and its header alone is 10"):
        decode(MAGIC + b"\x01\x02\x03")
    with pytest.raises(DecodeError, match="missing C3 01 marker"):
        decode(b"\x00\x01")


def test_unknown_fingerprint_is_quoted_as_the_schemas_topic_keys_a_fingerprint():
    with pytest.raises(DecodeError, match="unknown schema fingerprint 3930000000000000 "
                                          r"\(its bytes in the header, as the schemas topic keys each schema\): "
                                          r".*\(a query's Tensor\) defined inline \(docs/KAFKA_CLIENTS.md"):
        decode(MAGIC + struct.pack("<Q", 12345) + b"\x00")
    # a known schema's key on the topic is written the same way: one can be looked up by the other
    query = encode_dict("QueryEvent", samples()["QueryEvent"])
    assert query[2:10].hex() in default_codec().written()


def test_truncated_record():
    data = encode_dict("QueryEvent", samples()["QueryEvent"])
    for cut in (11, len(data) // 2, len(data) - 1):
        with pytest.raises(DecodeError):
            decode(data[:cut])


def test_trailing_bytes_are_refused():
    data = encode_dict("Link", samples()["Link"])
    with pytest.raises(DecodeError, match="trailing"):
        decode(data + b"\x00")


@given(st.binary(max_size=200))
def test_random_bytes_never_crash(data):
    try:
        decode(MAGIC + data)
    except DecodeError:
        pass


def _arrays():
    dtypes = st.sampled_from(sorted(DTYPES - VARIABLE)).map(np.dtype)
    shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
    return dtypes.flatmap(lambda dt: hnp.arrays(dt, shapes))


@settings(max_examples=200, deadline=None)
@given(_arrays())
def test_tensor_round_trip(arr):
    back = decode_as(Tensor, encode(Tensor.of(arr))).array()
    assert back.dtype == arr.dtype
    assert back.shape == arr.shape
    assert back.tobytes() == np.ascontiguousarray(arr).tobytes()  # NaNs compare by bits


def test_big_endian_and_non_contiguous_inputs():
    arr = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
    back = from_tensor(to_tensor(arr))
    np.testing.assert_array_equal(back, arr)
    assert back.dtype == np.dtype("int32")


def test_scalar_and_empty():
    assert from_tensor(to_tensor(np.float64(2.5))).shape == ()
    assert from_tensor(to_tensor(np.zeros((0, 3), np.int64))).shape == (0, 3)


@pytest.mark.parametrize(
    "record, reason",
    [
        ({"dtype": "float32", "shape": [2], "data": b"\x00" * 4}, "needs 8 bytes"),
        ({"dtype": "complex64", "shape": [1], "data": b"\x00" * 8}, "unknown tensor dtype"),
        ({"dtype": "int8", "shape": [-1], "data": b""}, "negative dimension"),
        ({"shape": [1]}, "not a tensor record"),
    ],
)
def test_bad_tensor_records(record, reason):
    with pytest.raises(DecodeError, match=reason):
        from_tensor(record)


def test_unsupported_dtype_is_refused_on_encode():
    with pytest.raises(DecodeError, match="only str or only bytes"):
        to_tensor(np.array(["a", 1], dtype=object))
    with pytest.raises(DecodeError, match="only str or only bytes"):
        to_tensor(np.array(["a", b"b"], dtype=object))
    with pytest.raises(DecodeError, match="complex"):
        to_tensor(np.zeros(2, np.complex64))


def _elements(draw_text: bool):
    element = st.text(max_size=12) if draw_text else st.binary(max_size=12)
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
    return shapes.flatmap(lambda shape: st.lists(element, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))
                          .map(lambda xs: _object_array(xs, shape)))


def _object_array(xs: list, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(xs), dtype=object)
    out[:] = xs
    return out.reshape(shape)


@settings(max_examples=150, deadline=None)
@given(st.booleans().flatmap(_elements))
def test_text_and_bytes_tensors_round_trip(arr):
    tensor = Tensor.of(arr)
    back = decode_as(Tensor, encode(tensor)).array()
    assert tensor.dtype == ("bytes" if any(isinstance(x, bytes) for x in arr.flat) else "string") or arr.size == 0
    assert back.dtype == object and back.shape == arr.shape
    assert back.tolist() == arr.tolist()  # every element, of its own type (str or bytes)
    assert len(tensor.data) == sum(4 + len(x.encode() if isinstance(x, str) else x) for x in arr.flat)


def test_text_travels_as_length_and_utf8_bytes():
    tensor = Tensor.of(np.array(["hé", ""], dtype=object))
    assert (tensor.dtype, tensor.shape) == ("string", [2])
    assert tensor.data == b"\x03\x00\x00\x00h\xc3\xa9" + b"\x00\x00\x00\x00"
    assert Tensor.of(np.array([b"a\x00b"])).data == b"\x03\x00\x00\x00a\x00b"  # numpy's S dtype is bytes


@pytest.mark.parametrize(
    "shape, data, reason",
    [
        ([10**12], b"", "needs at least"),  # refused before anything is allocated
        ([1], b"\x05\x00\x00\x00ab", "runs past the data"),
        ([2], b"\x03\x00\x00\x00abc\x01\x00", "ends inside element 1"),
        ([], b"\x01\x00\x00\x00ab", "after its last element"),
        ([1], b"\x01\x00\x00\x00\xff", "not UTF-8"),
    ],
)
def test_bad_text_tensors(shape, data, reason):
    with pytest.raises(DecodeError, match=reason):
        from_tensor({"dtype": "string", "shape": shape, "data": data})


def test_bytes_need_not_be_utf8():
    assert from_tensor({"dtype": "bytes", "shape": [], "data": b"\x01\x00\x00\x00\xff"}).item() == b"\xff"


def _newer(name: str, drop: str, add: dict) -> tuple[object, bytes]:
    """A record type's schema as a later version might write it (``drop`` left out, ``add``
    added), and a sample record written with it."""
    import io
    import json

    from fastavro import schemaless_writer
    from fastavro.schema import parse_schema, to_parsing_canonical_form

    from schemas.codec import Codec, schema_fingerprint

    canonical = json.loads(to_parsing_canonical_form(Codec().schema(name).parsed))
    canonical["fields"] = [f for f in canonical["fields"] if f["name"] != drop] + [add]
    newer = parse_schema(canonical, _write_hint=False)
    plain = {k: v for k, v in samples()[name].items() if k != drop}
    plain[add["name"]] = add["default"]
    buf = io.BytesIO()
    buf.write(MAGIC + schema_fingerprint(newer))
    schemaless_writer(buf, newer, plain)
    return json.loads(to_parsing_canonical_form(newer)), buf.getvalue()


def test_a_newer_versions_record_is_read_once_its_schema_is_learnt() -> None:
    from schemas.codec import Codec

    schema, data = _newer("QueryEvent", drop="context", add={"name": "priority", "type": "int", "default": 0})
    codec = Codec()
    with pytest.raises(DecodeError, match="unknown schema fingerprint"):
        codec.decode(data)
    asked: list[int] = []
    codec.resolver = lambda fp: (asked.append(fp), codec.learn(schema))
    ev = codec.decode(data)
    assert type(ev).__name__ == "QueryEvent" and ev.context is None  # left out: its default
    assert ev.query_id == samples()["QueryEvent"]["query_id"]
    codec.decode(data)
    assert len(asked) == 1  # learnt once
    assert codec.learn({"type": "record", "name": "clipstream.Unheard", "fields": []}) is None


def test_a_schema_lookup_reads_the_topic_at_most_once_in_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records with made-up fingerprints must not make a stage read the schemas topic for each."""
    from clipstream.settings import Settings
    from schemas.codec import Codec
    from topics import schema_topic

    schema, data = _newer("Feedback", drop="context", add={"name": "weight", "type": "double", "default": 1.0})
    codec = Codec()
    lookup = schema_topic.SchemaLookup(Settings(), codec)
    topic: list[object] = []
    monkeypatch.setattr(lookup, "_schemas", lambda: list(topic))
    codec.resolver = lookup
    with pytest.raises(DecodeError):
        codec.decode(data)  # not published yet
    topic.append(schema)
    with pytest.raises(DecodeError):
        codec.decode(data)  # read a moment ago: not again yet
    assert lookup.reads == 1
    monkeypatch.setattr(schema_topic, "READ_EVERY_S", 0.0)
    topic.insert(0, {"type": "record", "name": "clipstream.Feedback", "fields": [{"name": "x", "type": "nope"}]})
    assert type(codec.decode(data)).__name__ == "Feedback" and lookup.reads == 2  # a bad record there is skipped
