"""A prediction's tensor as an Output, the app's output kind, and the Response record."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from registry.spec import OutputSpec
from schemas import Response, Tensor, decode_as, encode
from selector.join import Asked
from selector.outputs import AppOutputs, app_outputs, response_record, to_output
from selector.types import Output


def test_to_output_reads_scores_labels_and_values() -> None:
    out = to_output(Tensor.of(np.array([0.2, 0.8], dtype=np.float32)), "class_scores", ("cat", "dog"))
    assert out.value == "dog" and out.scores == pytest.approx((0.2, 0.8))
    assert to_output(Tensor.of(np.array(3, dtype=np.int64)), "label", None) == Output(3)
    assert to_output(Tensor.of(np.array(2.5)), "regression", None) == Output(2.5)


def test_app_outputs_prefers_regression_then_class_scores() -> None:
    def model(kind: str, labels: tuple | None) -> SimpleNamespace:
        return SimpleNamespace(spec=SimpleNamespace(output=OutputSpec(kind, labels)))

    view = SimpleNamespace(models={"a": model("label", (0, 1)), "b": model("class_scores", (0, 1, 2))})
    assert app_outputs(view, ("a", "b")) == AppOutputs("class_scores", (0, 1, 2))
    assert app_outputs(view, ("a",)) == AppOutputs("label", (0, 1))
    assert app_outputs(view, ("zzz",)) == AppOutputs("label", None)


def test_response_record_encodes_answers_and_defaults() -> None:
    asked = Asked(app="a", deadline_us=10, trace={"produced": 1})
    rec = response_record("q", asked, Output(np.int64(1), (0.4, 0.6)), 2 / 3, ["m1", "m2"], ["m3"], (0, 1), 9)
    assert rec.query_id == "q" and rec.app == "a" and rec.deadline_us == 10
    assert rec.output == 1 and rec.labels == ["0", "1"] and rec.missing == ["m3"]
    assert rec.trace == {"produced": 1, "joined": 9} and not rec.is_default
    assert asked.trace == {"produced": 1}  # the join's trace is not stamped by the answer
    assert decode_as(Response, encode(rec)) == rec
    dflt = response_record("q", asked, None, 0.5, [], ["m1"], None, 9, default="none", default_reason="late")
    assert dflt.is_default and dflt.output == "none" and dflt.confidence == 0.0
    assert decode_as(Response, encode(dflt)) == dflt


def test_a_model_listing_the_apps_labels_in_another_order_has_its_scores_put_in_the_apps_order() -> None:
    """Both say virginica; the second lists it first. Read by column, the ensemble would add the
    second model's virginica score to setosa's column and answer another class."""
    app = ("setosa", "versicolor", "virginica")
    first = to_output(Tensor.of(np.array([0.1, 0.2, 0.7], np.float32)), "class_scores", app, app)
    second = to_output(Tensor.of(np.array([0.8, 0.15, 0.05], np.float32)), "class_scores", app,
                       ("virginica", "setosa", "versicolor"))
    assert first.value == second.value == "virginica"
    assert second.scores == pytest.approx((0.15, 0.05, 0.8))  # setosa, versicolor, virginica
    combined = np.add(first.scores, second.scores)
    assert app[int(combined.argmax())] == "virginica"
    ints = to_output(Tensor.of(np.array([0.1, 0.9], np.float32)), "class_scores", ("0", "1"), (1, 0))
    assert ints.value == 0 and ints.scores == pytest.approx((0.9, 0.1))  # labels compared as text


def test_a_model_with_other_labels_than_the_apps_cannot_be_combined() -> None:
    from clipstream.errors import DecodeError

    with pytest.raises(DecodeError, match=r"its labels \[0, 1, 2\] are not the app's \['setosa'"):
        to_output(Tensor.of(np.array([0.1, 0.2, 0.7], np.float32)), "class_scores",
                  ("setosa", "versicolor", "virginica"), (0, 1, 2))
