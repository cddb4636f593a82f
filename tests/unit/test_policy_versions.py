"""Each version of a model has weights of its own in a policy's state.

A rollback returns to a version the policy had learnt well: it gets its weight back at once,
rather than starting from the weight the broken version sank to. A new version starts where
its model was, and each answer teaches the version that gave it.
"""

from __future__ import annotations

import numpy as np
import pytest

from clipstream.weights import KEEP_LEFT_VERSIONS
from selector.policies import Exp4, align_state, as_versions
from selector.types import Feedback, Output, Query

MODELS = ["good", "medium", "bad"]


def test_a_version_left_keeps_its_weight_and_a_rollback_takes_it_back() -> None:
    p = Exp4()
    s = align_state(p, None, MODELS, {"good": "1", "medium": "1", "bad": "1"})
    s["log_w"] = [0.0, -3.0, -8.0]
    v2 = align_state(p, s, MODELS, {"good": "2"})
    assert v2["log_w"] == [0.0, -3.0, -8.0] and v2["versions"]["good"] == "2"  # a new version starts where it was
    assert s["versions"]["good"] == "1"  # the state it came from is untouched
    v2["log_w"] = [-9.0, 0.0, -5.0]  # what version 2's answers taught
    back = align_state(p, v2, MODELS, {"good": "1"})
    assert back["log_w"] == [0.0, 0.0, -5.0] and back["left"] == {"good@2": -9.0}
    again = align_state(p, back, MODELS, {"good": "2"})
    assert again["log_w"][0] == -9.0 and again["left"] == {"good@1": 0.0}
    assert align_state(p, again, MODELS, {"good": None}) is again  # no version known: as it is


def test_only_the_newest_versions_left_are_kept() -> None:
    p = Exp4()
    s = align_state(p, None, ["m"], {"m": "0"})
    for v in range(1, KEEP_LEFT_VERSIONS + 5):
        s = align_state(p, s, ["m"], {"m": str(v)})
    assert len(s["left"]) == KEEP_LEFT_VERSIONS and "m@0" not in s["left"]
    assert f"m@{KEEP_LEFT_VERSIONS + 3}" in s["left"]


def test_answers_are_combined_with_the_weight_of_the_version_that_gave_them() -> None:
    p = Exp4({"kind": "label"})
    s = align_state(p, None, ["good", "medium"], {"good": "1", "medium": "1"})
    s = align_state(p, s, ["good", "medium"], {"good": "2"})
    s["log_w"] = [-9.0, 0.0]  # version 2 of good answers wrongly
    s = align_state(p, s, ["good", "medium"], {"good": "1"})  # rolled back: the registry serves 1
    preds = {"good": Output("wrong"), "medium": Output("right")}
    # version 2's workers still answer while version 1's warm up: it is weighed as itself
    assert p.combine(as_versions(s, {"good": "2", "medium": "1"}), Query("q", "a"), preds)[0].value == "right"
    assert p.combine(s, Query("q", "a"), preds)[0].value == "wrong"  # weighed as version 1 would be


def _accuracy_after_rollback(per_version: bool) -> float:
    """Exp4 over three models; ``good`` is broken as version 2 for 1,000 queries, then rolled
    back. The share of right answers in the 200 queries after the rollback."""
    rng = np.random.default_rng(5)
    n, deploy, rollback = 4_000, 1_500, 2_500
    err = np.tile([0.03, 0.35, 0.9], (n, 1))
    err[deploy:rollback, 0] = 1.0
    y = rng.integers(0, 10, n)
    wrong = rng.random(err.shape) < err
    yhat = np.where(wrong, (y[:, None] + rng.integers(1, 10, err.shape)) % 10, y[:, None])
    p = Exp4({"kind": "label"})
    state, right = None, []
    for t in range(n):
        version = "2" if deploy <= t < rollback else "1"
        versions = {"good": version, "medium": "1", "bad": "1"} if per_version else None
        state = align_state(p, state, MODELS, versions)
        q = Query(f"q{t}", "a")
        preds = {m: Output(int(yhat[t, i])) for i, m in enumerate(MODELS)}
        answer, _ = p.combine(state, q, preds)
        if rollback <= t < rollback + 200:
            right.append(answer.value == y[t])
        state = p.observe(state, q, Feedback(q.query_id, label=int(y[t])), preds)
    return float(np.mean(right))


def test_after_a_rollback_the_ensemble_is_as_right_as_before_the_broken_version() -> None:
    with_versions, by_name = _accuracy_after_rollback(True), _accuracy_after_rollback(False)
    assert with_versions > 0.93
    assert by_name < with_versions - 0.1  # by name alone, the old version had to be learnt again


def test_feedback_teaches_the_version_that_answered_not_the_one_serving_now() -> None:
    from types import SimpleNamespace

    from registry.outputs import stored_answer
    from schemas import Feedback as FeedbackRecord
    from schemas import encode
    from selector.learn import Learner
    from tests.fakes import FakeMsg

    p = Exp4({"eta": 0.5})
    serving = align_state(p, None, ["good", "medium"], {"good": "1", "medium": "1"})  # rolled back to 1
    serving["left"] = {"good@2": -4.0}
    states = [serving]

    class Store:
        def load_predictions(self, query_id: str) -> dict:
            # answered by version 2, whose workers served on while version 1's warmed up
            return stored_answer("a", None, {"value": 5}, {"good": {"value": 5}, "medium": {"value": 3}},
                                 1.0, [], {"good": "2", "medium": "1"})

        def observe_once(self, app, context, query_id, models, fn):  # noqa: ANN001, ANN201
            states.append(fn(states[-1], list(models)))
            return list(models)

    app = SimpleNamespace(name="a", models=("good", "medium"))
    apps = SimpleNamespace(get=lambda name: (app, p, SimpleNamespace(kind="label", labels=None)),
                           view=lambda: SimpleNamespace(apps={"a": app}))
    learner = Learner(None, Store(), apps, SimpleNamespace(send=lambda **kw: None),  # type: ignore[arg-type]
                      guard=SimpleNamespace())  # type: ignore[arg-type]
    record = FeedbackRecord(query_id="q", app="a", context=None, label=3, reward=None, created_us=1)
    assert learner.handle(FakeMsg(encode(record), "clipstream.feedback")) is True
    learnt = align_state(p, states[-1], ["good", "medium"], {"good": "1"})  # as the selector serves it
    assert learnt["log_w"][0] == 0.0  # version 1 untouched by version 2's wrong answer
    assert learnt["left"]["good@2"] == pytest.approx(-4.5)


def test_a_version_left_stays_in_the_frame_of_the_weights_that_go_on_learning() -> None:
    """The weights are shifted so the best is 0 after each update: a version left must shift
    with them, or it comes back level with a model it was far ahead of."""
    p = Exp4({"eta": 0.5, "kind": "label"})
    s = align_state(p, None, ["good", "tree"], {"good": "1", "tree": "1"})
    s["log_w"] = [0.0, -10.0]  # version 1 of good, far ahead of the tree
    s = align_state(p, s, ["good", "tree"], {"good": "2"})  # a broken version 2
    for i in range(60):  # version 2 wrong, the tree right: the tree leads, and the frame moves
        q = Query(f"q{i}", "a")
        s = p.observe(s, q, Feedback(q.query_id, label="y"), {"good": Output("n"), "tree": Output("y")})
    assert s["log_w"][1] == 0.0
    back = align_state(p, s, ["good", "tree"], {"good": "1"})
    assert back["log_w"][0] - back["log_w"][1] == pytest.approx(10.0)  # as far ahead as when it was left


def test_the_shares_shown_are_those_the_selector_weighs_with() -> None:
    """``inspect`` and the gauge read a stored state without aligning it: they weigh each model
    as its serving version, as ``align_state`` would."""
    from clipstream.weights import policy_weights
    from selector.policies.base import softmax

    p = Exp4()
    s = align_state(p, None, MODELS, {m: "1" for m in MODELS})
    s["log_w"] = [0.0, -2.0, -6.0]
    s = align_state(p, s, MODELS, {"good": "2"})
    s["log_w"] = [-9.0, 0.0, -6.0]  # version 2 taught
    serving = {"good": "1", "medium": "1", "bad": "1"}
    aligned = align_state(p, s, MODELS, serving)
    assert list(policy_weights(s, serving).values()) == pytest.approx(softmax(aligned["log_w"]))
    assert list(policy_weights(s).values()) == pytest.approx(softmax(s["log_w"]))
