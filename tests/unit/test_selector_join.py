"""The join state: complete on the last report, answer at the deadline, count late arrivals."""

from __future__ import annotations

from selector.join import Asked, JoinState


def test_completes_when_every_expected_model_has_reported() -> None:
    j = JoinState()
    j.register("q1", ["a", "b"], deadline_us=1_000, asked=Asked(app="app", reply_topic="r"))
    assert j.add("q1", "a", "ok", output=1) is None
    done = j.add("q1", "b", "cached", output=2)
    assert done is not None and done.arrived == {"a": 1, "b": 2} and done.missing == []
    assert done.asked.reply_topic == "r" and done.asked.app == "app" and "q1" not in j and j.answered("q1")


def test_expired_and_error_reports_complete_but_count_as_missing() -> None:
    j = JoinState()
    j.register("q1", ["a", "b", "c"], deadline_us=1_000)
    j.add("q1", "a", "ok", output=1)
    j.add("q1", "b", "expired")
    done = j.add("q1", "c", "error", error="boom")
    assert done is not None
    assert done.missing == ["b", "c"] and done.failed == {"b": "expired", "c": "boom"}


def test_deadline_answers_with_what_arrived_and_names_stragglers() -> None:
    j = JoinState()
    j.register("q1", ["a", "b"], deadline_us=2_000)
    j.register("q2", ["a"], deadline_us=1_000)
    j.register("q3", ["a"], deadline_us=3_000)
    assert j.next_deadline() == 1_000
    j.add("q1", "a", "ok", output=5)
    assert j.expired(999) == []
    due = j.expired(2_000)
    assert [p.query_id for p in due] == ["q2", "q1"]
    assert due[1].arrived == {"a": 5} and due[1].missing == ["b"]
    assert j.next_deadline() == 3_000 and len(j) == 1


def test_next_deadline_skips_answered_queries() -> None:
    j = JoinState()
    j.register("q1", ["a"], deadline_us=1_000)
    j.register("q2", ["a"], deadline_us=5_000)
    j.add("q1", "a", "ok", output=0)
    assert j.next_deadline() == 5_000
    j.add("q2", "a", "ok", output=0)
    assert j.next_deadline() is None and j.expired(10**12) == []


def test_late_unknown_and_duplicate_predictions_are_dropped_and_counted() -> None:
    j = JoinState(answered_capacity=2)
    j.register("q1", ["a", "b"], deadline_us=1_000)
    j.add("q1", "a", "ok", output=1)
    assert j.add("q1", "a", "ok", output=1) is None and j.duplicates == 1
    assert j.add("q1", "z", "ok", output=1) is None and j.duplicates == 2
    j.expired(1_000)
    assert j.add("q1", "b", "ok", output=2) is None and j.late == 1
    assert j.add("nobody", "a", "ok", output=1) is None and j.unknown == 1
    for i in range(3):  # the answered set is bounded: q1 is forgotten
        j.register(f"x{i}", ["a"], deadline_us=0)
    j.expired(1)
    assert not j.answered("q1") and j.answered("x2")


def test_nothing_arrived_waits_to_the_last_resort_once() -> None:
    j = JoinState()
    j.register("empty", ["a", "b"], deadline_us=1_000, last_resort_us=1_700)
    j.register("some", ["a", "b"], deadline_us=1_000, last_resort_us=1_700)
    j.register("plain", ["a"], deadline_us=1_000)  # no last resort: answered at its deadline
    j.add("some", "a", "ok", output=1)
    j.add("empty", "b", "expired")  # a failed report is not an answer: still nothing to combine
    assert sorted(p.query_id for p in j.expired(1_000)) == ["plain", "some"]
    assert j.next_deadline() == 1_700 and j.get("empty").deadline_us == 1_700
    assert j.expired(1_699) == []
    done = j.add("empty", "a", "ok", output=3)  # the first prediction within the grace completes it
    assert done is not None and done.arrived == {"a": 3} and done.missing == ["b"]

    j.register("never", ["a"], deadline_us=2_000, last_resort_us=2_500)
    (due,) = j.expired(2_600)  # past both at once (a late timer): answered, not pushed again
    assert due.query_id == "never" and due.arrived == {} and j.next_deadline() is None


def test_a_last_resort_not_after_the_deadline_changes_nothing() -> None:
    j = JoinState()
    j.register("q", ["a"], deadline_us=1_000, last_resort_us=1_000)
    assert [p.query_id for p in j.expired(1_000)] == ["q"]


def test_answered_ids_are_remembered_for_a_window_of_time_only() -> None:
    """A long-running selector's memory of answered ids stays flat: ids whose deadline is more
    than the window before the newest answer are forgotten, however few they are."""
    j = JoinState(answered_capacity=1_000_000, answered_window_us=10_000)
    for i in range(100):  # one answer every 1,000 µs of deadline
        j.register(f"q{i}", ["a"], deadline_us=i * 1_000)
        j.add(f"q{i}", "a", "ok", output=0)
    assert j.answered("q99") and j.answered("q89") and not j.answered("q88")
    assert sum(j.answered(f"q{i}") for i in range(100)) == 11
    j.add("q50", "a", "ok", output=0)  # forgotten: unknown now, not late
    j.add("q95", "a", "ok", output=0)
    assert (j.unknown, j.late) == (1, 1)


def test_an_input_every_model_refused_is_said_once_and_counted_as_no_models_failure() -> None:
    """An ensemble's query with a NaN in it: each model's batcher refuses it with the same
    reason. The default says it once, as the caller's input; a model's own failure among them
    keeps every model's reason."""
    from schemas.reasons import BAD_INPUT
    from selector.join import Pending, why_default
    from selector.metrics import default_reason

    why = "input: NaN or infinity is not a number the model takes"
    refused = Pending("q", ("a", "b"), 0, failed={m: f"{BAD_INPUT}{m}: {why}" for m in ("a", "b")})
    assert why_default(refused) == f"every model refused the input: {why}"
    assert default_reason(why_default(refused)) == "rejected"  # the caller's, as a dispatch refusal is
    mixed = Pending("q", ("a", "b"), 0, failed={"a": f"{BAD_INPUT}a: {why}", "b": "model error: boom"})
    assert why_default(mixed) == f"every model failed: a: {BAD_INPUT}a: {why}; b: model error: boom"
    # a model that raised ``InputError`` refuses the input itself, as a batcher's check does
    own = Pending("q", ("t",), 0, failed={"t": "bad input: the word bad"})
    assert why_default(own) == "every model refused the input: the word bad"


def test_a_one_model_apps_input_its_model_refused_is_said_as_the_callers() -> None:
    from frontend.direct import answer_of
    from registry.topic import AppConfig
    from schemas import Prediction

    cfg = AppConfig(name="t", policy="single", slo_ms=50.0, default_output=-1, models=("textlen",))
    pred = Prediction(query_id="q", model="textlen", version="1", status="error",
                      error="bad input: the word bad", output=None)
    record, stored = answer_of(pred, cfg, "label", None, None, 2**62)
    assert record.default_reason == "every model refused the input: the word bad"
    assert stored["predictions"] == {} and stored["missing"] == []  # the caller's mistake teaches nothing
    failed = answer_of(Prediction(query_id="q", model="textlen", version="1", status="error",
                                  error="model error: RuntimeError: boom", output=None), cfg, "label", None, None, 2**62)
    assert failed[0].default_reason == "every model failed: textlen: model error: RuntimeError: boom"


def test_every_model_given_up_as_late_is_said_late_not_failed() -> None:
    """Every model's batcher gave its request up (queued past the deadline, or too slow for the
    time left): the default says late, which the gateway reads as behind and an operator as
    capacity; one model's own error among them keeps the failure's words."""
    from frontend.admission import verdict
    from selector.join import Pending, why_default
    from selector.metrics import default_reason

    queued, hopeless = "deadline passed while queued in the batcher", "given up before its deadline: slow"
    late = Pending("q", ("a", "b"), 0, failed={"a": queued, "b": hopeless}, expired={"a", "b"})
    assert why_default(late) == f"every model was late: a: {queued}; b: {hopeless}"
    assert default_reason(why_default(late)) == "models_late"
    answer = {"latency_ms": 40.0, "default": True, "default_reason": why_default(late),
              "models": {"answered": [], "missing": ["a", "b"]}}
    assert verdict(answer, False, slo_ms=50.0, slow_fraction=0.8) == "late"
    broken = Pending("q", ("a", "b"), 0, failed={"a": queued, "b": "model error: boom"}, expired={"a"})
    assert why_default(broken) == f"every model failed: a: {queued}; b: model error: boom"
    assert default_reason(why_default(broken)) == "models_failed"


def test_a_one_model_apps_request_given_up_as_late_is_said_late() -> None:
    from frontend.direct import answer_of
    from registry.topic import AppConfig
    from schemas import Prediction

    cfg = AppConfig(name="t", policy="single", slo_ms=50.0, default_output=-1, models=("m",))
    pred = Prediction(query_id="q", model="m", version="1", status="expired",
                      error="deadline passed while queued in the batcher", output=None)
    record, stored = answer_of(pred, cfg, "label", None, None, 2**62)
    assert record.default_reason == "every model was late: m: deadline passed while queued in the batcher"
    assert stored["predictions"] == {} and stored["missing"] == ["m"]  # a feedback teaches it was wrong
