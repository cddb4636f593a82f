"""JSON input -> tensor against a model's declared input: what passes, and the 422 reasons."""

from __future__ import annotations

import numpy as np
import pytest

from clipstream.errors import InputError
from frontend.inputs import array_for, input_for, input_of_bytes, parse_input, parse_untyped
from registry.spec import TensorSpec

GRID = TensorSpec("float32", (2, 3))


def test_nested_ints_become_the_float_dtype_and_shape():
    arr = parse_input([[1, 2, 3], [4, 5.5, 6]], GRID)
    assert arr.dtype == np.float32 and arr.shape == (2, 3)
    assert arr.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.5, 6.0]]


def test_scalar_input_for_a_scalar_model():
    spec = TensorSpec("float64", ())
    assert parse_input(3, spec).shape == ()
    assert float(parse_input(2.5, spec)) == 2.5
    with pytest.raises(InputError, match=r"expected a number .*shape \[\]"):
        parse_input([2.5], spec)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([[1, 2, 3], [4, 5]], r"input\[1\] has 2 items, expected 3"),
        ([[1, 2, 3]], r"input has 1 items, expected 2"),
        ([[1, 2, 3], [4, 5, True]], r"input\[1\]\[2\] is a boolean, expected a number"),
        ([[1, 2, 3], [4, 5, "6"]], r"input\[1\]\[2\] is a string"),
        ([[1, 2, 3], [4, 5, None]], r"input\[1\]\[2\] is null"),
        ([[1, 2, 3], [4, 5, [6]]], r"input\[1\]\[2\] is a list of 1, expected a number"),
        ([1, 2], r"input\[0\] is an integer, expected a list of 3"),
        ("abc", r"input is a string, expected a list of 2"),
        ({"a": 1}, r"input is a dict"),
        ([[1e300, 2, 3], [4, 5, 6]], r"out of range for float32"),
    ],
)
def test_bad_inputs_are_refused_with_a_reason_naming_the_shape(value, reason):
    with pytest.raises(InputError, match=reason) as info:
        parse_input(value, GRID)
    assert "shape [2, 3], dtype float32" in str(info.value)


def test_integer_inputs_refuse_fractions_and_out_of_range_values():
    spec = TensorSpec("uint8", (3,))
    assert parse_input([0, 128, 255], spec).dtype == np.uint8
    with pytest.raises(InputError, match="expected an integer"):
        parse_input([0, 1.5, 2], spec)
    with pytest.raises(InputError, match="do not fit uint8"):
        parse_input([0, 300, 2], spec)
    with pytest.raises(InputError, match="do not fit uint8"):
        parse_input([0, -1, 2], spec)


def test_bool_inputs_take_only_booleans():
    spec = TensorSpec("bool", (2,))
    assert parse_input([True, False], spec).dtype == np.bool_
    with pytest.raises(InputError, match="expected a boolean"):
        parse_input([1, 0], spec)


def test_empty_dimension_and_nan_literals():
    assert parse_input([], TensorSpec("float32", (0,))).shape == (0,)
    with pytest.raises(InputError, match="not a finite number"):
        parse_input([float("nan"), 1.0], TensorSpec("float32", (2,)))


def test_untyped_inputs_without_a_model_spec():
    assert parse_untyped([[1, 2], [3, 4]]).dtype == np.int64
    assert parse_untyped([0.5, 1]).dtype == np.float32
    assert input_for(7, None).shape == ()
    for bad in ([[1, 2], [3]], ["a", "b"], True, None):
        with pytest.raises(InputError):
            parse_untyped(bad)
    assert input_for([[1, 2, 3], [4, 5, 6]], GRID).dtype == np.float32


@pytest.mark.parametrize("value", [2**63, [2**63], [[1, 2], [3, 2**63]], [2**63, -1], [2**64], [-(2**63) - 1],
                                   [10**400], [np.uint64(2**63)]])
def test_untyped_integers_outside_int64_are_refused_not_wrapped(value):
    # numpy reads these as uint64 (which int64 would wrap to negatives), float64 or objects
    with pytest.raises(InputError, match="outside the int64 range"):
        parse_untyped(value)


def test_untyped_integers_at_the_int64_bounds_pass_unchanged():
    arr = parse_untyped([2**63 - 1, -(2**63)])
    assert arr.dtype == np.int64 and arr.tolist() == [2**63 - 1, -(2**63)]
    assert parse_untyped([np.int64(3), 4]).tolist() == [3, 4]
    assert parse_untyped([[0.5, 2**63]]).dtype == np.float32  # a number list with a fraction is floats


@pytest.mark.parametrize(("value", "where"), [([True, 1], r"input\[0\]"), ([[1, 2], [3, False]], r"input\[1\]\[1\]"),
                                              ([1.5, True], r"input\[1\]"), ([np.True_, 2], r"input\[0\]")])
def test_untyped_booleans_inside_lists_are_refused_as_a_bare_one_is(value, where):
    with pytest.raises(InputError, match=where + " is a boolean, expected a number"):
        parse_untyped(value)
    with pytest.raises(InputError, match="a boolean, expected numbers"):
        parse_untyped(True)


def test_several_examples_in_one_call_are_told_to_go_one_per_call() -> None:
    from clipstream.errors import InputError
    from frontend.inputs import parse_input
    from registry.spec import TensorSpec

    with pytest.raises(InputError, match=r"input has 2 items, expected 4 .*; it looks like several examples: "
                                         "send one per call"):
        parse_input([[1, 2, 3, 4], [5, 6, 7, 8]], TensorSpec("float32", (4,)))
    with pytest.raises(InputError) as short:
        parse_input([1, 2, 3], TensorSpec("float32", (4,)))
    assert "several examples" not in str(short.value)


TEXT = TensorSpec("string", ())
BLOB = TensorSpec("bytes", ())


def test_text_inputs_take_json_strings_and_bytes_inputs_their_utf8():
    assert parse_input("héllo", TEXT).item() == "héllo"
    assert parse_input("héllo", BLOB).item() == "héllo".encode()
    pair = parse_input(["a", ""], TensorSpec("string", (2,)))
    assert pair.dtype == object and pair.tolist() == ["a", ""]
    with pytest.raises(InputError, match=r"input is an integer, expected a string .*dtype string"):
        parse_input(3, TEXT)
    with pytest.raises(InputError, match=r"input\[1\] is null, expected a string"):
        parse_input(["a", None], TensorSpec("string", (2,)))


def test_a_raw_body_is_one_text_or_bytes_element():
    assert input_of_bytes("é".encode(), TEXT).item() == "é"
    assert input_of_bytes(b"\xff\x00", BLOB).item() == b"\xff\x00"  # bytes need not be text
    with pytest.raises(InputError, match="not UTF-8 text"):
        input_of_bytes(b"\xff", TEXT)
    with pytest.raises(InputError, match="a binary body is one element.*send JSON"):
        input_of_bytes(b"a", TensorSpec("string", (2,)))


def test_numpy_text_goes_to_the_models_kind_of_string():
    assert array_for(np.array(b"caf\xc3\xa9"), TEXT).item() == "café"
    assert array_for(np.array(["a", "b"]), TensorSpec("bytes", (2,))).tolist() == [b"a", b"b"]
    with pytest.raises(InputError, match="input dtype float64 is not text or bytes"):
        array_for(np.array(1.0), TEXT)
    with pytest.raises(InputError, match="input element 1 is an integer, expected a string"):
        array_for(np.array(["a", 1], dtype=object), TensorSpec("string", (2,)))


def test_python_bytes_go_to_a_bytes_model_as_they_are_and_to_a_text_model_as_utf8():
    assert parse_input(b"\x89PNG\x00", BLOB).item() == b"\x89PNG\x00"
    assert parse_input("é".encode(), TEXT).item() == "é"
    with pytest.raises(InputError, match="input element 0 is not UTF-8 text"):
        parse_input(b"\xff", TEXT)


def test_a_lone_surrogate_is_the_callers_error_not_the_gateways():
    for spec in (TEXT, BLOB):
        with pytest.raises(InputError, match="input element 0 is not Unicode text: it holds a lone surrogate"):
            parse_input("\udcff", spec)


def test_a_raw_body_fills_a_text_input_of_one_element_whatever_its_rank():
    one = input_of_bytes(b"hello", TensorSpec("string", (1,)))  # skl2onnx's text input: [None, 1]
    assert one.shape == (1,) and one.tolist() == ["hello"]
    with pytest.raises(InputError, match=r"a binary body is one element, and the model takes 2 "):
        input_of_bytes(b"a", TensorSpec("string", (2,)))


def test_a_string_alone_fills_a_text_input_of_one_element_as_its_raw_body_does():
    one = parse_input("hello", TensorSpec("string", (1,)))  # skl2onnx's text input: [None, 1]
    assert one.shape == (1,) and one.tolist() == ["hello"]
    assert parse_input(b"\x89P", TensorSpec("bytes", (1, 1))).tolist() == [[b"\x89P"]]
    assert parse_input(["hello"], TensorSpec("string", (1,))).tolist() == ["hello"]
    with pytest.raises(InputError, match=r"input is a string, expected a list of 2"):
        parse_input("hello", TensorSpec("string", (2,)))  # two elements: a string alone is not both
