"""Exp3 learns from feedback that comes late with the probability its model was chosen with.

Feedback reaches the learner a fraction of a second after the answer, dozens of queries later
under load. Had Exp3 divided a loss by the probability today's weights give, the losses of a
leader that has just lost the lead would be divided by its new, small probability, sinking it
below models that are worse still, which then take the lead in turn.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from schemas import Feedback as FeedbackRecord
from schemas import encode
from selector.learn import Learner
from selector.policies import Exp3
from selector.types import Feedback, Output, Query
from tests.fakes import FakeMsg

MODELS = ["good", "medium", "bad"]
Q = Query("q1", "app")
N, BREAK, SETTLE = 6_000, 2_000, 500


def _answers(seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Labels and each model's answers: ``good`` errs 5% of the time until it breaks and errs
    always; ``medium`` errs 49%, ``bad`` 93.5%."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, N)
    err = np.tile([0.05, 0.49, 0.935], (N, 1))
    err[BREAK:, 0] = 1.0
    wrong = rng.random(err.shape) < err
    yhat = np.where(wrong, (y[:, None] + rng.integers(1, 10, err.shape)) % 10, y[:, None])
    return y, yhat


def _share_not_medium(lag: int, carry_confidence: bool) -> float:
    """Once ``good`` has broken and Exp3 had time to move: the share of answers from a model
    worse than ``medium``, with feedback ``lag`` queries late."""
    y, yhat = _answers()
    policy = Exp3()
    state = policy.init(MODELS)
    late: deque[tuple[Query, dict[str, Output], float, int]] = deque()
    worse = 0
    for t in range(N):
        query = Query(f"q{t}", "app")
        preds = {m: Output(int(yhat[t, MODELS.index(m)])) for m in policy.select(state, query)}
        _, confidence = policy.combine(state, query, preds)
        worse += t >= BREAK + SETTLE and "medium" not in preds
        late.append((query, preds, confidence, int(y[t])))
        while len(late) > lag:
            q, p, c, label = late.popleft()
            fb = Feedback(q.query_id, label=label, confidence=c if carry_confidence else None)
            state = policy.observe(state, q, fb, p)
    return worse / (N - BREAK - SETTLE)


def test_late_feedback_with_the_chosen_probability_learns_as_fast_as_feedback_at_once() -> None:
    at_once = _share_not_medium(0, True)
    late = _share_not_medium(60, True)
    late_today = _share_not_medium(60, False)
    assert at_once < 0.1
    assert late < at_once + 0.03
    assert late_today > 3 * late  # the scenario tells the two apart


def test_exp3_divides_by_the_answers_confidence_when_it_is_a_probability_exp3_gives() -> None:
    p = Exp3({"eta": 0.5, "gamma": 0.3})
    s = p.init(["a", "b", "c"])
    wrong = {"b": Output("no")}
    s2 = p.observe(s, Q, Feedback("q1", label="yes", confidence=0.8), wrong)
    assert s2["log_w"] == pytest.approx([0.0, -0.5 / 0.8, 0.0])
    # below gamma / k no answer of Exp3's had it: today's probability (1/3) is used
    s3 = p.observe(s, Q, Feedback("q1", label="yes", confidence=0.01), wrong)
    assert s3["log_w"] == pytest.approx([0.0, -1.5, 0.0])



def test_the_learner_gives_observe_the_confidence_stored_with_the_answer() -> None:
    seen: list[Feedback] = []
    stored = {"app": "one", "context": None, "answer": {"value": 7}, "predictions": {"m1": {"value": 7}},
              "confidence": 0.42}
    policy = SimpleNamespace(init=lambda models: {"models": models},
                             observe=lambda state, query, fb, preds: seen.append(fb) or state)

    class Store:
        def load_predictions(self, query_id: str) -> dict[str, Any]:
            return stored

        def observe_once(self, app: str, context: str | None, query_id: str, models: Any, fn: Any) -> list[str]:
            fn(None, list(models))
            return list(models)

    app = SimpleNamespace(name="one", models=("m1",))
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, policy, SimpleNamespace(kind="label", labels=None)),
                           view=lambda: SimpleNamespace(apps={"one": app}))
    learner = Learner(None, Store(), apps, SimpleNamespace(send=lambda **kw: None),  # type: ignore[arg-type]
                      guard=SimpleNamespace())  # type: ignore[arg-type]
    record = FeedbackRecord(query_id="q1", app="one", context=None, label=7, reward=None, created_us=1)
    assert learner.handle(FakeMsg(encode(record), "clipstream.feedback")) is True
    (fb,) = seen
    assert fb.confidence == pytest.approx(0.42) and fb.label == 7
