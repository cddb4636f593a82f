"""``label_problem``: which feedback labels fit an app's outputs, and the reasons for the rest."""

from __future__ import annotations

import pytest

from registry.labels import label_problem
from schemas import Feedback, decode_as, encode


@pytest.mark.parametrize("kind", ["label", "regression", "class_scores"])
@pytest.mark.parametrize("label", [10**400, 2**63, -(2**63) - 1], ids=["10**400", "2**63", "-2**63-1"])
def test_integer_labels_outside_int64_are_refused_with_the_range(kind, label):
    problem = label_problem(label, kind, ("cat", str(label)))
    assert problem is not None and "int64 range" in problem and f"{label.bit_length()} bits" in problem
    assert len(problem) < 200  # the reason names the size, not a 400-digit value


@pytest.mark.parametrize(("kind", "label"), [(kind, label) for kind in ("label", "regression")
                                              for label in (2**63 - 1, -(2**63), 7, 7.5)] + [("label", True)])
def test_labels_within_int64_pass_and_encode_as_they_are(kind, label):
    assert label_problem(label, kind, None) is None
    record = Feedback("q", "a", None, label, None, 1)
    back = decode_as(Feedback, encode(record)).label
    assert back == label and type(back) is type(label)  # 2**63 - 1 stays an int, not a rounded float


@pytest.mark.parametrize("label", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_float_labels_are_refused_for_every_kind(label):
    for kind in ("label", "regression", "class_scores"):
        problem = label_problem(label, kind, None)
        assert problem is not None and "finite number" in problem, kind


def test_regression_still_refuses_booleans_and_text():
    for bad in (True, "seven"):
        assert "regression value" in (label_problem(bad, "regression", None) or "")


def test_a_boolean_is_not_the_class_one_nor_zero():
    """``True == 1`` in Python: a ``true`` sent for digits' class 1 would teach the policy with it
    (and, applied once per query, shut out the right label sent after)."""
    for labels in ((0, 1, 2), ("0", "1", "2")):
        for bad in (True, False):
            problem = label_problem(bad, "class_scores", labels)
            assert problem is not None and "not one of the app's labels" in problem
    assert label_problem(1, "class_scores", (0, 1, 2)) is None
    assert label_problem(True, "class_scores", (False, True)) is None
    assert label_problem(True, "class_scores", ("True", "False")) is None
