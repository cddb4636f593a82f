"""A worker's start tries its model on an input shaped as its model.yaml says, so that a model
declared wrongly fails its start with a reason, not its first real batch (docs/design/0103)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clipstream.testing.models import make_python_model
from registry.spec import load_spec
from workers.backends import load_model
from workers.group import warm


def test_a_model_that_fails_on_zeros_of_its_declared_input_says_to_check_input(tmp_path: Path) -> None:
    """Declared with one value more than it takes, and no example: the start fails with a
    ModelError naming the input it was tried on, which the worker says as its reason, not with
    the model's own traceback."""
    from clipstream.errors import ModelError

    class FourValues:
        def __init__(self, path, config):  # noqa: ANN001
            pass

        def predict_batch(self, rows):  # noqa: ANN001
            if rows.shape[1] != 4:
                raise ValueError(f"X has {rows.shape[1]} features, but the scaler is expecting 4")
            return rows.sum(axis=1)

    folder = make_python_model(tmp_path, "four", FourValues, kind="regression", dtype="float32", shape=(5,))
    with pytest.raises(ModelError, match=r"fails on one input of zeros shaped as its model.yaml's `input:` \(float32 "
                                         r"\[5\]\): ValueError: X has 5 features, .* Check that `input:`"):
        warm(load_model(load_spec(folder)))
