"""The Avro codec: every record round-trips; bad bytes raise DecodeError, never anything else."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from clipstream.errors import DecodeError
from schemas import DTYPES, decode, decode_as, default_codec, encode, from_tensor, to_tensor
from schemas.codec import MAGIC
from tests.records import samples


def test_every_record_type_has_a_sample():
    assert set(samples()) == set(default_codec().names)


@pytest.mark.parametrize("name", sorted(samples()))
def test_round_trip(name):
    record = samples()[name]
    data = encode(name, record)
    assert data[:2] == MAGIC
    got_name, got = decode(data)
    assert got_name == name
    assert got == record


def test_fingerprints_differ_per_schema():
    codec = default_codec()
    fps = {codec.schema(n).fingerprint for n in codec.names}
    assert len(fps) == len(codec.names)


def test_decode_as_rejects_another_type():
    data = encode("Link", samples()["Link"])
    with pytest.raises(DecodeError, match="expected a App record, got a Link"):
        decode_as("App", data)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", b"garbage that is long enough", b"\xc3\x01" + b"\x00" * 3, "not bytes"],
)
def test_garbage_is_a_decode_error(data):
    with pytest.raises(DecodeError):
        decode(data)


def test_unknown_fingerprint():
    with pytest.raises(DecodeError, match="unknown schema fingerprint"):
        decode(MAGIC + struct.pack("<Q", 12345) + b"\x00")


def test_truncated_record():
    data = encode("QueryEvent", samples()["QueryEvent"])
    for cut in (11, len(data) // 2, len(data) - 1):
        with pytest.raises(DecodeError):
            decode(data[:cut])


def test_trailing_bytes_are_refused():
    data = encode("Link", samples()["Link"])
    with pytest.raises(DecodeError, match="trailing"):
        decode(data + b"\x00")


@given(st.binary(max_size=200))
def test_random_bytes_never_crash(data):
    try:
        decode(MAGIC + data)
    except DecodeError:
        pass


def _arrays():
    dtypes = st.sampled_from(sorted(DTYPES)).map(np.dtype)
    shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
    return dtypes.flatmap(lambda dt: hnp.arrays(dt, shapes))


@settings(max_examples=200, deadline=None)
@given(_arrays())
def test_tensor_round_trip(arr):
    back = from_tensor(decode_as("Tensor", encode("Tensor", to_tensor(arr))))
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
    with pytest.raises(DecodeError):
        to_tensor(np.array(["a"], dtype=object))
