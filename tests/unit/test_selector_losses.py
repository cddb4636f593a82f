"""Losses in [0, 1]: 0/1 labels, clipped regression, 1 - reward."""

from __future__ import annotations

import numpy as np
import pytest

from selector.losses import label_loss, model_loss, regression_loss, reward_loss
from selector.types import Feedback, Output


def test_label_loss_is_zero_one_and_tolerates_numpy_and_text() -> None:
    assert label_loss("cat", Output("cat")) == 0.0
    assert label_loss("cat", Output("dog")) == 1.0
    assert label_loss(3, Output(np.int64(3))) == 0.0
    assert label_loss("3", Output(np.array(3))) == 0.0


def test_a_boolean_label_agrees_only_with_a_boolean_answer_as_the_gateway_checks_it() -> None:
    assert label_loss(True, Output(1)) == 1.0 and label_loss(False, Output(np.int64(0))) == 1.0
    assert label_loss(True, Output(np.bool_(True))) == 0.0 and label_loss("True", Output(True)) == 0.0


def test_regression_loss_is_scaled_and_clipped() -> None:
    assert regression_loss(2.0, Output(2.5), scale=2.0) == pytest.approx(0.25)
    assert regression_loss(2.0, Output(100.0), scale=2.0) == 1.0
    assert regression_loss(2.0, Output("garbage")) == 1.0
    assert regression_loss(2.0, Output(float("nan"))) == 1.0


def test_reward_loss_and_model_loss_dispatch() -> None:
    assert reward_loss(0.8) == pytest.approx(0.2)
    assert reward_loss(7) == 0.0 and reward_loss(-1) == 1.0
    assert model_loss(Output(1.0), Feedback("q", label=1.5), "regression", scale=1.0) == pytest.approx(0.5)
    assert model_loss(Output("a"), Feedback("q", label="b"), "label") == 1.0
    assert model_loss(Output("a"), Feedback("q", reward=0.25, answer=Output("a")), "label") == 0.75
    assert model_loss(Output("b"), Feedback("q", reward=0.25, answer=Output("a")), "label") is None
    assert model_loss(Output("b"), Feedback("q"), "label") is None
