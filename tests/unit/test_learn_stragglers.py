"""A model asked that gave no answer by the deadline learns as a wrong answer.

Left out of learning, a model that always straggles kept its weight while the others lost
some, so it came to lead the weights (and the dashboard) though it never answered. The app's
answer at the deadline had nothing from it, which is what a wrong answer is worth.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from clipstream.clock import now_us
from registry.outputs import stored_answer
from schemas import Feedback as FeedbackRecord
from schemas import encode
from selector.learn import Learner
from selector.policies import Exp3, Exp4
from tests.fakes import FakeMsg

MODELS = ("good", "late", "bad")


class Store:
    """One query's stored predictions, and one policy state that ``observe_once`` updates."""

    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored = stored
        self.state: dict[str, Any] | None = None

    def load_predictions(self, query_id: str) -> dict[str, Any]:
        return self.stored

    def observe_once(self, app: str, context: str | None, query_id: str, models: Any, fn: Any) -> list[str]:
        self.state = fn(self.state, list(models))
        return list(models)


def _learn(policy: Any, stored: dict[str, Any], label: Any = None, reward: float | None = None) -> dict[str, Any]:
    store = Store(stored)
    app = SimpleNamespace(name="app", models=MODELS)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, policy, SimpleNamespace(kind="label", labels=None)),
                           view=lambda: SimpleNamespace(apps={"app": app}))
    learner = Learner(None, store, apps, SimpleNamespace(send=lambda **kw: None),  # type: ignore[arg-type]
                      guard=SimpleNamespace())  # type: ignore[arg-type]
    record = FeedbackRecord(query_id="q1", app="app", context=None, label=label, reward=reward, created_us=1)
    assert learner.handle(FakeMsg(encode(record), "clipstream.feedback")) is True
    assert store.state is not None
    return dict(zip(store.state["models"], store.state["log_w"]))


def test_exp4_scores_a_straggler_as_a_wrong_answer() -> None:
    stored = stored_answer("app", None, {"value": 3}, {"good": {"value": 3}, "bad": {"value": 5}}, 0.67, ["late"])
    w = _learn(Exp4({"eta": 0.5}), stored, label=3)
    assert w["good"] == 0.0 and w["late"] == pytest.approx(-0.5) and w["bad"] == pytest.approx(-0.5)


def test_a_reward_says_nothing_of_a_model_that_did_not_answer() -> None:
    stored = stored_answer("app", None, {"value": 3}, {"good": {"value": 3}, "bad": {"value": 5}}, 0.67, ["late"])
    w = _learn(Exp4({"eta": 0.5}), stored, reward=0.0)
    # good agreed with the answer and shares its loss; bad did not, and late gave nothing
    assert w["good"] == pytest.approx(-0.5) and w["late"] == 0.0 and w["bad"] == 0.0


def test_exp3_learns_from_feedback_on_the_default_its_chosen_model_left_it_with() -> None:
    stored = stored_answer("app", None, None, {}, None, ["late"])
    w = _learn(Exp3({"eta": 0.5, "gamma": 0.3}), stored, label=3)
    assert w["late"] == pytest.approx(-1.5) and w["good"] == w["bad"] == 0.0  # loss 1 over p = 1/3


def _selector(policy: Any, saved: list[tuple[str, dict[str, Any]]]) -> Any:
    import numpy as np

    from clipstream.settings import get_settings
    from schemas import QueryEvent, Tensor
    from selector.service import Selector
    from selector.store import StateStore
    from tests.unit.test_selector_state_loading import FakeProducer
    from topics.catalogue import Catalogue

    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    app = SimpleNamespace(name="app", models=("m1", "m2"), default_output=-1)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, policy, SimpleNamespace(kind="label", labels=None)))
    store = StateStore(None)  # type: ignore[arg-type]
    store.fresh = lambda pairs, fresh_s: {pair: None for pair in pairs}  # type: ignore[method-assign]
    sel = Selector(None, FakeProducer(), store, apps, SimpleNamespace(send=lambda *a, **k: None),  # type: ignore[arg-type]
                   cat, settings, save=lambda qid, record: saved.append((qid, record)))  # type: ignore[arg-type]
    sel._model_topics.update(("m1", "m2"))
    ev = QueryEvent(query_id="q", app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                    created_us=now_us() - 1_000_000, deadline_us=now_us() + 30_000_000)
    sel.dispatch(FakeMsg(encode(ev), cat.queries.name), ev)
    return sel


def test_the_selector_stores_who_gave_nothing_even_for_a_default_answer() -> None:
    from selector.types import Output

    saved: list[tuple[str, dict[str, Any]]] = []
    sel = _selector(Exp4(), saved)
    sel.join.add("q", "m1", "ok", Output(3))
    sel.answer(sel.join.get("q"))  # the deadline: m2 straggles
    ((qid, record),) = saved
    assert qid == "q" and record["missing"] == ["m2"] and set(record["predictions"]) == {"m1"}

    saved.clear()
    sel = _selector(Exp4(), saved)
    sel.answer(sel.join.get("q"))  # nothing arrived: the default, and both are to learn from it
    ((_, record),) = saved
    assert record["answer"] is None and record["predictions"] == {} and record["missing"] == ["m1", "m2"]


def test_a_model_that_refused_the_callers_input_is_not_taught_it_was_wrong() -> None:
    """Every model refused the input: the caller's mistake, so a feedback on that default finds
    nothing to learn rather than counting each model as wrong."""
    from schemas.reasons import BAD_INPUT

    saved: list[tuple[str, dict[str, Any]]] = []
    sel = _selector(Exp4(), saved)
    sel.join.add("q", "m1", "error", error=f"{BAD_INPUT}m1: input: NaN")
    sel.answer(sel.join.add("q", "m2", "error", error="bad input: the word bad"))
    ((_, record),) = saved
    assert record["predictions"] == {} and record["missing"] == []


def test_a_query_answered_before_any_model_was_asked_stores_that_nothing_was_asked() -> None:
    """Out of time when the selector read it: the default went out with no model asked. A
    feedback on it is a fine one with nothing to teach, not an unknown query's dead letter."""
    import numpy as np

    from clipstream.settings import get_settings
    from schemas import QueryEvent, Tensor
    from selector.service import Selector
    from selector.store import StateStore
    from tests.unit.test_selector_state_loading import FakeProducer
    from topics.catalogue import Catalogue

    saved: list[tuple[str, dict[str, Any]]] = []
    settings = get_settings()
    cat = Catalogue.from_settings(settings)
    app = SimpleNamespace(name="app", models=("m1", "m2"), default_output=-1)
    apps = SimpleNamespace(versions=lambda name: {}, get=lambda name: (app, Exp4(), SimpleNamespace(kind="label", labels=None)),
                           view=lambda: SimpleNamespace(apps={"app": app}, models={}))
    sel = Selector(None, FakeProducer(), StateStore(None), apps, SimpleNamespace(send=lambda *a, **k: None),  # type: ignore[arg-type]
                   cat, settings, save=lambda qid, record: saved.append((qid, record)))  # type: ignore[arg-type]
    ev = QueryEvent(query_id="q-late", app="app", context="c", input=Tensor.of(np.zeros(2, np.float32)),
                    created_us=1_000, deadline_us=2_000)
    sel.dispatch(FakeMsg(encode(ev), cat.queries.name), ev)
    ((qid, stored),) = saved
    assert qid == "q-late" and stored["app"] == "app" and stored["context"] == "c"
    assert stored["predictions"] == {} and stored["missing"] == []

    store = Store(stored)
    dead: list[dict[str, Any]] = []
    learner = Learner(None, store, apps, SimpleNamespace(send=lambda **kw: dead.append(kw)),  # type: ignore[arg-type]
                      guard=SimpleNamespace())  # type: ignore[arg-type]
    record = FeedbackRecord(query_id="q-late", app="app", context=None, label=3, reward=None, created_us=1)
    assert learner.handle(FakeMsg(encode(record), "clipstream.feedback")) is True
    assert dead == [] and store.state is None  # no dead letter, and no state written
    assert learner.metrics.registry.get_sample_value(
        "clipstream_selector_feedback_total", {"app": "app", "outcome": "nothing_to_learn"}) == 1
