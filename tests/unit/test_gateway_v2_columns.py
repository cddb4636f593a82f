"""Several inputs of an infer are the columns of one table, as MLServer's pandas content type
sends a DataFrame: each example is the model's vector of one value per column, in the order sent."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from frontend.gateway_http import HTTPProblem
from frontend.v2_grpc import parse_request
from frontend.v2_messages import parse_infer
from frontend.v2_proto import MESSAGES
from registry.spec import TensorSpec

VECTOR = TensorSpec("float32", (3,))
TABLE = {"age": [34, 22], "height": [1.62, 1.80], "score": [0.5, -1.0]}  # two rows, three columns
WANT = np.array([[34, 1.62, 0.5], [22, 1.80, -1.0]], dtype=np.float32)


def pandas_body(table: dict[str, list[Any]], shape_of: Any = lambda n: [n]) -> dict[str, Any]:
    """What MLServer's ``PandasCodec.encode_request`` sends: one input per column."""
    return {"parameters": {"content_type": "pd"},
            "inputs": [{"name": name, "shape": shape_of(len(values)),
                        "datatype": "INT64" if all(type(v) is int for v in values) else "FP64", "data": values}
                       for name, values in table.items()]}


def rows_of(body: dict[str, Any], spec: TensorSpec | None = VECTOR, header: bytes = b"") -> np.ndarray:
    raw = json.dumps(body).encode()
    _, examples, _, _, _ = parse_infer(raw + header, spec, 1 << 20, len(raw) if header else None)
    return np.stack([e.array() for e in examples])


@pytest.mark.parametrize("shape_of", [lambda n: [n], lambda n: [n, 1]])
def test_one_input_per_column_is_one_example_per_row(shape_of: Any) -> None:
    rows = rows_of(pandas_body(TABLE, shape_of))
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(rows, WANT)


def test_columns_sent_as_raw_bytes_after_the_json_header() -> None:
    body = pandas_body(TABLE)
    age, score = body["inputs"][0], body["inputs"][2]
    blob = np.array(TABLE["age"], "<i8").tobytes() + np.array(TABLE["score"], "<f8").tobytes()
    for tensor in (age, score):
        del tensor["data"]
    age["parameters"] = {"binary_data_size": 16}
    score["parameters"] = {"binary_data_size": 16}  # height stays in its JSON data
    np.testing.assert_array_equal(rows_of(body, header=blob), WANT)
    score["parameters"] = {"binary_data_size": 8}
    with pytest.raises(HTTPProblem, match=r"binary_data_size 16 \+ 8 is not the 32 bytes after the JSON header; "
                       r"input 2 \('score'\) of shape \[2\] and FP64 takes 16 bytes, not 8$"):
        rows_of(body, header=blob)
    many = {"inputs": [{"name": f"px{j}", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}
                       for j in range(64)]}
    many["inputs"][7]["parameters"]["binary_data_size"] = 4  # a table's 64 columns: the sizes are summed up
    with pytest.raises(HTTPProblem, match=r"^binary_data_size of 64 inputs, 508 in all, is not the 512 bytes after "
                                          r"the JSON header; input 7 \('px7'\) of shape \[2\] and FP32 takes 8 bytes, not 4$"):
        rows_of(many, header=bytes(512), spec=None)
    score["parameters"] = {"binary_data_size": -8}
    with pytest.raises(HTTPProblem, match=r"binary_data_size -8 of input 2 \('score'\) is not a number of bytes"):
        rows_of(body, header=blob)


def test_columns_without_an_apps_input_must_share_one_datatype() -> None:
    rows = rows_of(pandas_body({"a": [1.0, 2.0], "b": [3.0, 4.0]}, lambda n: [n, 1]), spec=None)
    np.testing.assert_array_equal(rows, [[1.0, 3.0], [2.0, 4.0]])
    with pytest.raises(HTTPProblem, match=r"input 1 \('b'\), a column of the table, has datatype int64, and input 0"):
        rows_of(pandas_body({"a": [1.0, 2.0], "b": [3, 4]}), spec=None)


@pytest.mark.parametrize(("table", "reason"), [
    ({"a": [1.0], "b": [2.0]}, "2 inputs are read as the columns of a table, and the model takes [3] per example, not [2]"),
    ({"a": [1.0, 2.0], "b": [3.0], "c": [4.0, 5.0]}, "input 1 ('b'), a column of the table, has 1 rows, and input 0 has 2"),
    ({"a": [1.0], "b": ["x"], "c": [2.0]}, "input 1 ('b'), a column of the table: data[0] is a string, expected a number"),
])
def test_a_table_the_model_cannot_take_is_a_400_naming_the_column(table: dict[str, list[Any]], reason: str) -> None:
    body = pandas_body(table)
    if "x" in table["b"]:
        body["inputs"][1]["datatype"] = "FP64"
    with pytest.raises(HTTPProblem) as err:
        rows_of(body)
    assert err.value.status == 400 and reason in err.value.detail, err.value.detail


def test_a_column_of_several_values_per_row_is_told_what_a_column_holds() -> None:
    body = pandas_body(TABLE, lambda n: [n, 2])
    body["inputs"][0]["data"] = [1, 2, 3, 4]
    with pytest.raises(HTTPProblem, match=r"input 0 \('age'\), a column of the table: input shape \[2, 2\] is not a "
                                          r"batch of the model's \[\]: expected \[n\] \(or \[n, 1\]\)"):
        rows_of(body)


def test_columns_over_grpc_raw_or_typed() -> None:
    raw = MESSAGES["ModelInferRequest"](model_name="t")
    for name, values in TABLE.items():
        raw.inputs.add(name=name, datatype="FP64", shape=[2, 1])
        raw.raw_input_contents.append(np.array(values, "<f8").tobytes())
    _, examples, _, _, _ = parse_request(raw, VECTOR, 1 << 20)
    np.testing.assert_array_equal(np.stack([e.array() for e in examples]), WANT)
    typed = MESSAGES["ModelInferRequest"](model_name="t")
    for name, values in TABLE.items():
        typed.inputs.add(name=name, datatype="FP64", shape=[2]).contents.fp64_contents.extend(values)
    _, examples, _, _, _ = parse_request(typed, VECTOR, 1 << 20)
    np.testing.assert_array_equal(np.stack([e.array() for e in examples]), WANT)
    del raw.raw_input_contents[-1]
    with pytest.raises(HTTPProblem, match="raw_input_contents holds 2 tensors, and there are 3 inputs"):
        parse_request(raw, VECTOR, 1 << 20)
