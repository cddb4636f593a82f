"""A failing model call is written to the worker's log, rate limited per kind of failure
(``workers.failures``): without it a broken version is silent but for a metric."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clipstream.testing.models import make_python_model
from registry.spec import load_spec
from schemas import BatchStats, decode_as
from tests.unit.test_workers_batch import Flaky
from tests.unit.test_workers_group import Mean, batch, group_of, item, python_model
from tests.unit.test_workers_loop import Msg, batch_bytes, make_worker
from workers.backends import load_model
from workers.failures import OTHER, Folding, ModelFailures
from workers.group import finish_group, prepare, run_group


class Clock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class AlwaysFails:
    """A version whose every call raises, as a model whose weights did not ship would."""

    def __init__(self, path: Path, config: dict) -> None:
        pass

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        raise RuntimeError("weights missing")


def test_folding_says_each_kind_at_once_then_once_per_interval_with_the_count() -> None:
    clock = Clock()
    f = Folding(30.0, clock=clock)
    first = f.offer("a")
    assert first is not None and first.first and first.folded == 0
    for _ in range(100):  # hundreds of failing batches a second: folded
        clock.now += 0.25
        assert f.offer("a") is None
    b = f.offer("b")  # another kind is not held back by the first
    assert b is not None and b.first
    clock.now = 1030.0
    due = f.offer("a")
    assert due is not None and not due.first and due.folded == 100 and due.over_s == pytest.approx(30.0)
    assert f.offer("a") is None  # the interval starts again from that line
    clock.now = 1040.0
    assert [(s.kind, s.folded, s.over_s) for s in f.unsaid()] == [("a", 1, pytest.approx(10.0))]
    assert f.unsaid() == []  # said once
    clock.now = 1100.0
    again = f.offer("b")
    assert again is not None and not again.first and again.folded == 0


def test_folding_counts_a_bounded_number_of_kinds_apart() -> None:
    """Messages that differ every time (an id in them) must not each get a line."""
    clock = Clock()
    f = Folding(30.0, clock=clock, max_kinds=2)
    assert f.offer("a") is not None and f.offer("b") is not None
    other = f.offer("c")
    assert other is not None and other.kind == OTHER and other.first
    assert f.offer("d") is None and f.offer("e") is None  # folded together
    clock.now += 30.0  # a and b said nothing since: forgotten to make room
    fresh = f.offer("f")
    assert fresh is not None and fresh.kind == "f" and fresh.first


def _deep(n: int) -> None:
    if n == 0:
        raise ValueError("bad weights")
    _deep(n - 1)


def _raised(n: int) -> BaseException:
    try:
        _deep(n)
    except ValueError as exc:
        return exc
    raise AssertionError("no exception")


def test_model_failures_name_the_model_and_the_way_out_with_one_short_traceback() -> None:
    clock, lines = Clock(), []
    failures = ModelFailures(2, say=lines.append, clock=clock)
    for _ in range(3):
        failures.failed("m", "4", "model error: ValueError: bad weights", _raised(20))
    (line,) = lines
    head, _, trace = line.partition("\n")
    assert head == ("model m version 4 replica 2: predict_batch failed: ValueError: bad weights; its items are "
                    "answered with errors. Roll it back (clipstream rollback m) or deploy a fixed version "
                    "(clipstream deploy-model m PATH --version N)")
    assert trace.startswith("Traceback") and 'raise ValueError("bad weights")' in trace  # where it was raised
    assert "in _raised" not in trace and trace.endswith("(the last 5 of 22 frames)")  # not where it began
    clock.now += 31.0
    failures.failed("m", "4", "model error: ValueError: bad weights", _raised(20))
    assert lines[1].endswith("(2 more failures like it in 31 s)") and "Traceback" not in lines[1]
    failures.failed("m", "4", "model error: ValueError: other", None)  # a new kind: its own line
    assert len(lines) == 3 and "ValueError: other" in lines[2]
    failures.failed("m", "4", "model error: ValueError: other", None)
    failures.close()  # stopping: what was folded since is said
    assert lines[3].endswith("(1 more failure like it in 0 s)") and "ValueError: other" in lines[3]


def test_failures_folded_in_a_burst_are_said_once_the_interval_passes_without_more() -> None:
    clock, lines = Clock(), []
    failures = ModelFailures(0, say=lines.append, clock=clock)
    for _ in range(150):  # a burst, then the model answers again
        failures.failed("m", "1", "model error: ValueError: bad row", None)
        clock.now += 0.1
    assert len(lines) == 1 and failures.folding.folded == 149
    failures.tick()  # 15 s on: not yet
    assert len(lines) == 1
    clock.now += 15.0
    failures.tick()
    assert len(lines) == 2 and lines[1].endswith("(149 more failures like it in 30 s)"), lines
    failures.tick()
    failures.close()  # nothing left to say when stopping
    assert len(lines) == 2 and failures.folding.folded == 0
    clock.now += 200.0  # a new burst, minutes later: its first line folds nothing
    failures.failed("m", "1", "model error: ValueError: bad row", None)
    assert len(lines) == 3 and lines[2].endswith("bad row; its items are answered with errors. Roll it back "
                                                 "(clipstream rollback m) or deploy a fixed version (clipstream "
                                                 "deploy-model m PATH --version N)"), lines[2]


def test_a_model_failing_on_every_batch_is_logged_once_with_the_way_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = load_model(load_spec(make_python_model(tmp_path, "sim", AlwaysFails, labels=[0, 1], shape=[4])))
    w, producer, _, _ = make_worker(tmp_path, model=model)
    for n in range(40):
        w.feed(Msg(batch_bytes(n), n))
    assert w.drain(5.0)
    stats = [decode_as(BatchStats, v) for t, _, v in producer.sent if t == "p.batch-stats.sim"]
    assert len(stats) == 40 and all(s.errors == 3 for s in stats)  # every batch failed, and was answered
    err = capsys.readouterr().err
    failed = [line for line in err.splitlines() if "predict_batch failed" in line]
    assert failed == ["alert: worker: model sim version 1 replica 0: predict_batch failed: RuntimeError: weights missing; "
                      "its items are answered with errors. Roll it back (clipstream rollback sim) or deploy a "
                      "fixed version (clipstream deploy-model sim PATH --version N)"]
    assert err.count("Traceback") == 1 and "in predict_batch" in err
    w.stop_pipeline()
    folded = [line for line in capsys.readouterr().err.splitlines() if "predict_batch failed" in line]
    assert len(folded) == 1 and "(39 more failures like it in" in folded[0]


def test_a_failing_group_member_is_named_with_its_group(tmp_path: Path) -> None:
    group = group_of(("gflaky", python_model(tmp_path, "gflaky", Flaky, labels=["a", "b"])),
                     ("gmean", python_model(tmp_path, "gmean", Mean)))
    lines: list[str] = []
    failures = ModelFailures(1, say=lines.append)
    good = np.ones(64, dtype=np.float32)
    for items in ([item(0, good)], [item(1, -good)], [item(2, -good)]):  # the first batch fails nothing
        p = prepare(group, batch(items), received_us=4_000)
        finish_group(p, run_group(group, p), worker_id="w", failures=failures)
    (line,) = lines
    assert line.startswith("model gflaky version 3 (member of group ens) replica 1: predict_batch failed: "
                           "RuntimeError: negative input;") and "clipstream rollback gflaky" in line


def _quoting(value: float) -> BaseException:
    try:
        raise ValueError(f"input too big: {value}")  # a message that quotes the input
    except ValueError as exc:
        return exc


def test_failures_whose_message_quotes_the_input_are_one_kind() -> None:
    clock, lines = Clock(), []
    failures = ModelFailures(0, say=lines.append, clock=clock)
    for value in (202.0, 317.5, 999.0):
        exc = _quoting(value)
        failures.failed("m", "1", f"model error: ValueError: {exc}", exc)
    assert len(lines) == 1 and "input too big: 202.0" in lines[0]  # one line, not one per input
    failures.close()  # the stop's last word names the failure as it was raised, not its kind
    assert len(lines) == 2 and "ValueError: input too big: 999.0" in lines[1] and "(2 more failures" in lines[1]
    failures.failed("m", "1", "model error: ValueError: bad weights", _raised(1))  # raised elsewhere: its own
    assert len(lines) == 3
