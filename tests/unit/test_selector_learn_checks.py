"""The learner refuses feedback the REST gateway would refuse (another app's query, a reward
outside [0, 1]) with a dead letter that changes nothing, and counts every outcome for
Prometheus."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from schemas import Feedback, encode
from selector.learn import Learner
from tests.fakes import FakeMsg as Msg

FEEDBACK = "clipstream.feedback"


class FakeStore:
    """Stored predictions by query id; ``observe_once`` applies each (query, model) once."""

    def __init__(self, stored: dict[str, dict[str, Any]]) -> None:
        self.stored = stored
        self.loads: list[str] = []
        self.observed: list[tuple[str, str | None, str]] = []
        self._had: set[tuple[str, str]] = set()

    def load_predictions(self, query_id: str) -> dict[str, Any] | None:
        self.loads.append(query_id)
        return self.stored.get(query_id)

    def observe_once(self, app: str, context: str | None, query_id: str, models: Any, fn: Any) -> list[str]:
        todo = [m for m in models if (query_id, m) not in self._had]
        self._had.update((query_id, m) for m in todo)
        if todo:
            self.observed.append((app, context, query_id))
        return todo


def _learner(store: FakeStore) -> tuple[Learner, list[dict[str, Any]]]:
    apps_ = {name: SimpleNamespace(name=name, models=("m1",)) for name in ("one", "digits")}
    policy = SimpleNamespace(stateless=False)
    outputs = SimpleNamespace(kind="label", labels=None)

    def get(name: str) -> tuple[Any, Any, Any]:
        if name not in apps_:
            raise AssertionError(f"the learner asked for app {name!r}")
        return apps_[name], policy, outputs

    apps = SimpleNamespace(versions=lambda name: {}, get=get, view=lambda: SimpleNamespace(apps=apps_))
    dead: list[dict[str, Any]] = []
    learner = Learner(None, store, apps, SimpleNamespace(send=lambda **kw: dead.append(kw)),  # type: ignore[arg-type]
                      guard=SimpleNamespace())  # type: ignore[arg-type]
    return learner, dead


def _stored(app: str) -> dict[str, Any]:
    return {"app": app, "context": None, "answer": {"value": 7}, "predictions": {"m1": {"value": 7}}}


def _fb(query_id: str, app: str, label: Any = None, reward: float | None = None, offset: int = 0) -> Msg:
    return Msg(encode(Feedback(query_id=query_id, app=app, context=None, label=label, reward=reward, created_us=1)),
               FEEDBACK, offset=offset)


def _count(learner: Learner, app: str, outcome: str) -> float:
    return learner.metrics.registry.get_sample_value(
        "clipstream_selector_feedback_total", {"app": app, "outcome": outcome}) or 0.0


def test_feedback_naming_another_app_than_its_querys_is_refused_and_changes_nothing() -> None:
    store = FakeStore({"q-digits": _stored("digits")})
    learner, dead = _learner(store)
    assert learner.handle(_fb("q-digits", "one", label=7)) is True
    assert store.observed == []  # digits' policy state untouched
    (letter,) = dead
    assert letter["query_id"] == "q-digits" and "'digits'" in letter["reason"] and "'one'" in letter["reason"]
    assert learner.stats["bad_feedback"] == 1 and learner.stats["observed"] == 0
    assert _count(learner, "digits", "refused") == 1
    assert learner.handle(_fb("q-digits", "digits", label=7)) is True  # its own app's: applied
    assert store.observed == [("digits", None, "q-digits")] and len(dead) == 1


@pytest.mark.parametrize("reward", [5.0, -3.0, math.nan, math.inf, -math.inf, 1.0000001])
def test_a_reward_outside_zero_to_one_is_refused_before_redis_is_asked(reward: float) -> None:
    store = FakeStore({"q": _stored("one")})
    learner, dead = _learner(store)
    assert learner.handle(_fb("q", "one", reward=reward)) is True
    assert store.loads == [] and store.observed == []
    (letter,) = dead
    assert letter["reason"].startswith("feedback reward refused") and "[0, 1]" in letter["reason"]
    assert _count(learner, "one", "refused") == 1
    for i, edge in enumerate((0.0, 1.0)):  # the bounds themselves are rewards
        store.stored[f"q{i}"] = _stored("one")
        assert learner.handle(_fb(f"q{i}", "one", reward=edge)) is True
    assert len(dead) == 1 and store.observed == [("one", None, "q0"), ("one", None, "q1")]


def test_every_outcome_is_counted_with_a_bounded_app_label() -> None:
    store = FakeStore({"q1": _stored("one")})
    learner, dead = _learner(store)
    learner.handle(_fb("q1", "one", label=7))
    learner.handle(_fb("q1", "one", label=7))  # had before: changes nothing
    assert (_count(learner, "one", "applied"), _count(learner, "one", "repeated")) == (1, 1)
    # unknown queries, given up at once: the app a caller names is a label only if registered
    assert learner.handle(_fb("q-gone", "one", label=7), give_up_at=0.0) is True
    for i in range(3):
        learner.handle(_fb("q-gone", f"made-up-{i}", label=7), give_up_at=0.0)
    assert _count(learner, "one", "unknown_query") == 1 and _count(learner, "_unknown", "unknown_query") == 3
    learner.handle(Msg(b"\x00garbage", FEEDBACK))
    assert _count(learner, "_unknown", "refused") == 1
    learner._dead_letter(_fb("q1", "one", label=7), RuntimeError("boom"))
    assert _count(learner, "_unknown", "failed") == 1
    apps = {dict(labels)["app"] for labels in _series(learner)}
    assert apps == {"one", "_unknown"}


def _series(learner: Learner) -> list[tuple[tuple[str, str], ...]]:
    return [tuple(sorted(s.labels.items())) for metric in learner.metrics.registry.collect()
            if metric.name == "clipstream_selector_feedback" for s in metric.samples if s.name.endswith("_total")]


def test_feedback_with_an_empty_query_id_is_refused_as_such_at_once() -> None:
    store = FakeStore({})
    learner, dead = _learner(store)
    assert learner.handle(_fb("", "one", label=7)) is True  # not parked to wait for predictions
    (letter,) = dead
    assert "empty query_id" in letter["reason"] and store.loads == []
    assert learner.handle(_fb("q-gone", "one", label=7), give_up_at=0.0) is True
    assert "CLIPSTREAM_STORED_PREDICTIONS_TTL_S" in dead[-1]["reason"]
