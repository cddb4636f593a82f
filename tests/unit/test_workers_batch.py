"""``handle_batch``: input checks, grouping by selector partition, cache entries, stats, errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipstream.errors import ModelError
from topics.catalogue import Catalogue
from registry.spec import OutputSpec, load_spec
from schemas import Batch, BatchItem, BatchStats, DeadLetter, Predictions, Tensor, decode_as, encode
from clipstream.testing.models import digits, digits_logreg, make_onnx_digits_model, make_python_model
from workers.backends import load_model
from workers.batch import handle_batch, output_rows


class Flaky:
    """Fails whenever any input's first value is negative."""

    def __init__(self, path: Path, config: dict) -> None:
        pass

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        if (inputs[:, 0] < 0).any():
            raise RuntimeError("negative input")
        return np.tile([0.25, 0.75], (len(inputs), 1))


def item(i: int, array: np.ndarray, part: int, cache: bool = True) -> BatchItem:
    return BatchItem(
        query_id=f"q{i}",
        selector_partition=part,
        deadline_us=10**18,
        cache_key=f"cs:cache:m:1:{i}" if cache else None,
        input=Tensor.of(array),
        trace={"batcher_in": 1, "batched": 2},
    )


def batch(items: list[BatchItem], created_us: int = 1_000) -> Batch:
    record = Batch(batch_id="b1", model="logreg", version=None, replica=0, created_us=created_us, items=items)
    return decode_as(Batch, encode(record))  # exactly what the worker decodes


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_model(load_spec(make_onnx_digits_model(tmp_path_factory.mktemp("m"))))


def test_outputs_grouped_by_selector_partition_and_correct(onnx_model: Any) -> None:
    x, _ = digits()
    items = [item(i, x[i], part=i % 3, cache=i != 4) for i in range(6)]
    clock = iter(range(5_000, 6_000)).__next__
    out = handle_batch(onnx_model, batch(items), worker_id="w", version="7", received_us=4_000, clock=clock)
    records = out.predictions_records()
    assert [(t, p) for t, p, _ in records] == [(None, 0), (None, 1), (None, 2)]
    expected = onnx_model.predict_batch(x[:6])
    seen = {}
    for _, part, rec in records:
        assert isinstance(rec, Predictions) and rec.selector_partition == part
        assert decode_as(Predictions, encode(rec)) == rec  # valid on the wire
        for pred in rec.items:
            i = int(pred.query_id[1:])
            assert i % 3 == part and pred.status == "ok" and pred.version == "7"
            assert pred.trace["worker_in"] == 4_000 and pred.trace["worker_out"] >= 5_000
            assert pred.trace["batched"] == 2
            assert pred.output is not None
            seen[i] = pred.output.array()
    assert sorted(seen) == list(range(6))
    for i, row in seen.items():
        assert row.dtype == np.float32 and row.shape == (10,)
        np.testing.assert_allclose(row, expected[i], rtol=1e-6)
        assert row.argmax() == digits_logreg().predict(x[i : i + 1])[0]
    keys = [k for k, _ in out.cache]
    assert keys == [f"cs:cache:m:1:{i}" for i in range(6) if i != 4]
    np.testing.assert_array_equal(decode_as(Tensor, out.cache[0][1]).array(), seen[0])
    assert out.dead_letters == []
    stats = out.stats
    assert isinstance(stats, BatchStats)
    assert stats.batch_size == 6 and stats.errors == 0 and stats.queue_wait_us == 3_000
    assert stats.service_us > 0 and stats.worker_id == "w"
    assert decode_as(BatchStats, encode(stats)) == stats


def test_bad_items_become_errors_and_dead_letters_without_failing_the_batch(onnx_model: Any) -> None:
    x, _ = digits()
    items = [
        item(0, x[0], 0),
        item(1, x[1][:10], 1),  # wrong shape
        item(2, x[2].astype(np.float64), 1),  # wrong dtype
        item(3, x[3], 1),
    ]
    items[3] = replace(items[3], input=Tensor("float32", [64], b"\x00" * 7))  # does not decode
    items.append(item(4, x[4], 1))
    out = handle_batch(onnx_model, batch(items), worker_id="w", source=("t", 0, 42))
    by_id = {p.query_id: p for recs in out.predictions.values() for p in recs}
    assert {q: p.status for q, p in by_id.items()} == {"q0": "ok", "q1": "error", "q2": "error", "q3": "error", "q4": "ok"}
    assert "shape [10]" in (by_id["q1"].error or "") and "float64" in (by_id["q2"].error or "")
    assert by_id["q1"].output is None
    assert [d.query_id for d in out.dead_letters] == ["q1", "q2", "q3"]
    letter = out.dead_letters[0]
    assert isinstance(letter, DeadLetter)
    assert letter.stage == "worker" and letter.source_offset == 42 and "shape" in letter.reason
    assert letter.payload is not None
    dead_item = decode_as(BatchItem, letter.payload)
    assert dead_item.query_id == "q1" and dead_item.trace == {"batcher_in": 1, "batched": 2}  # as it came
    assert decode_as(DeadLetter, encode(letter)) == letter
    assert out.stats is not None and out.stats.errors == 3 and out.stats.batch_size == 5
    assert [k for k, _ in out.cache] == ["cs:cache:m:1:0", "cs:cache:m:1:4"]


def test_a_model_exception_fails_only_the_inputs_it_fails_on(tmp_path: Path) -> None:
    model = load_model(load_spec(make_python_model(tmp_path, "flaky", Flaky, labels=["a", "b"], shape=[2])))
    good = np.ones(2, dtype=np.float32)
    out = handle_batch(model, batch([item(0, good, 0), item(1, -good, 0)]), worker_id="w")
    preds = out.predictions[(None, 0)]
    assert [p.status for p in preds] == ["ok", "error"]  # the batch-mate of a bad input is answered
    assert preds[1].error == "model error: RuntimeError: negative input" and preds[1].output is None
    np.testing.assert_allclose(preds[0].output.array(), [0.25, 0.75])  # type: ignore[union-attr]
    assert [k for k, _ in out.cache] == ["cs:cache:m:1:0"] and out.stats is not None and out.stats.errors == 1
    ok = handle_batch(model, batch([item(0, good, 0)]), worker_id="w")  # the next batch is fine
    output = ok.predictions[(None, 0)][0].output
    assert output is not None
    np.testing.assert_allclose(output.array(), [0.25, 0.75])


def test_out_of_range_selector_partition_is_a_dead_letter_only(onnx_model: Any) -> None:
    x, _ = digits()
    out = handle_batch(onnx_model, batch([item(0, x[0], 9), item(1, x[1], 1)]), worker_id="w", selector_partitions=4,
                       catalogue=Catalogue("t."))
    assert list(out.predictions) == [(None, 1)]
    assert [d.query_id for d in out.dead_letters] == ["q0"]


def test_an_item_with_a_reply_target_is_answered_there(onnx_model: Any) -> None:
    # a one-model app's query from the gateway (docs/design/0083): its selector_partition is unused
    x, _ = digits()
    straight = replace(item(0, x[0], 9), reply_topic="t.replies.gw", reply_partition=0)
    elsewhere = replace(item(2, x[2], 1), reply_topic="t.registry", reply_partition=0)
    out = handle_batch(onnx_model, batch([straight, item(1, x[1], 1), elsewhere]), worker_id="w",
                       selector_partitions=4, catalogue=Catalogue("t."))
    records = {(t, p): rec for t, p, rec in out.predictions_records()}
    assert sorted(records, key=str) == [("t.replies.gw", 0), (None, 1)]
    assert [(it.query_id, it.status) for it in records[("t.replies.gw", 0)].items] == [("q0", "ok")]
    # a reply target that is no gateway's reply topic: answered nowhere, a dead letter says why
    assert [(d.query_id, d.reason) for d in out.dead_letters] == [
        ("q2", "reply_topic 't.registry' is no gateway's reply topic (t.replies.<instance>)")]


def test_output_rows_shapes() -> None:
    scores = OutputSpec("class_scores", (0, 1))
    rows = output_rows(scores, np.array([[0.1, 0.9], [0.5, 0.5]], dtype=np.float64), 2)
    assert rows[0].dtype == np.float32 and rows[0].shape == (2,)
    labels = output_rows(OutputSpec("label", (3, 5)), np.array([5, 3]), 2)
    assert labels[0].shape == () and int(labels[0]) == 5
    reg = output_rows(OutputSpec("regression"), np.array([[1.5], [2.5]], dtype=np.float32), 2)
    assert reg[1].dtype == np.float64 and float(reg[1]) == 2.5
    with pytest.raises(ModelError, match="shape"):
        output_rows(scores, np.zeros((2, 3)), 2)
    with pytest.raises(ModelError):
        output_rows(OutputSpec("regression"), np.zeros(3), 2)


def test_string_labels_cannot_travel_and_become_errors(tmp_path: Path) -> None:
    src = "import numpy as np\nclass Model:\n    def __init__(self, p, c): pass\n" \
          "    def predict_batch(self, x): return np.array(['cat'] * len(x))\n"
    model = load_model(load_spec(make_python_model(tmp_path, "strlab", src, labels=["cat"], kind="label", shape=[1])))
    out = handle_batch(model, batch([item(0, np.zeros(1, dtype=np.float32), 0)]), worker_id="w")
    pred = out.predictions[(None, 0)][0]
    assert pred.status == "error" and "cannot travel" in (pred.error or "")
    told: list[tuple[str, str]] = []  # as loud as a model that raises: the worker's alert hears of it

    class Failures:
        def failed(self, model: str, version: str | None, failure: str, exc: object = None, *, group: object = None) -> None:
            told.append((model, failure))

    two = batch([item(0, np.zeros(1, dtype=np.float32), 0), item(1, np.ones(1, dtype=np.float32), 0)])
    handle_batch(model, two, worker_id="w", failures=Failures())  # type: ignore[arg-type]
    assert len(told) == 1 and "output cannot travel" in told[0][1]  # once a batch


def test_an_output_that_is_not_finite_is_that_inputs_error_not_a_null_answer(tmp_path: Path) -> None:
    src = "import numpy as np\nclass Model:\n    def __init__(self, p, c): pass\n" \
          "    def predict_batch(self, x): return np.where(x[:, 0] > 0, np.nan, x[:, 0] * 2.0)\n"
    model = load_model(load_spec(make_python_model(tmp_path, "nan", src, kind="regression", shape=[1])))
    out = handle_batch(model, batch([item(0, np.ones(1, np.float32), 0), item(1, -np.ones(1, np.float32), 0)]),
                       worker_id="w")
    bad, good = out.predictions[(None, 0)]
    assert bad.status == "error" and bad.error == "model error: output cannot travel: it is not a finite number (nan)"
    assert good.status == "ok" and float(good.output.array()) == -2.0  # type: ignore[union-attr]
    assert [k for k, _ in out.cache] == ["cs:cache:m:1:1"]  # no NaN is cached either


def test_a_model_raising_input_error_blames_the_callers_input_and_raises_no_alert(tmp_path: Path) -> None:
    src = ("import numpy as np\nfrom clipstream import InputError\nclass Model:\n"
           "    def __init__(self, p, c): pass\n"
           "    def predict_batch(self, x):\n"
           "        if (x < 0).any(): raise InputError('not an image: it holds a negative pixel')\n"
           "        return x[:, 0] * 2.0\n")
    model = load_model(load_spec(make_python_model(tmp_path, "img", src, kind="regression", shape=[1])))
    told: list[str] = []

    class Failures:
        def failed(self, model: str, version: str | None, failure: str, exc: object = None, *, group: object = None) -> None:
            told.append(failure)

    for n, bad in ((1, {0}), (4, {1}), (3, {0, 1, 2})):
        out = handle_batch(model, batch([item(i, -np.ones(1, np.float32) if i in bad else np.ones(1, np.float32), 0)
                                         for i in range(n)]), worker_id="w", failures=Failures())  # type: ignore[arg-type]
        preds = out.predictions[(None, 0)]
        assert [p.error for p in preds if p.status == "error"] == [
            "bad input: not an image: it holds a negative pixel"] * len(bad)
        assert sum(p.status == "ok" for p in preds) == n - len(bad)
    assert told == []  # the model is not broken: no alert to roll it back


def test_bad_inputs_are_found_in_a_few_calls_and_a_model_failing_everything_is_not_split_again(
        tmp_path: Path) -> None:
    model = load_model(load_spec(make_python_model(tmp_path, "flaky", Flaky, labels=["a", "b"], shape=[2])))
    calls: list[int] = []
    predict = model.predict_batch

    def counted(inputs: np.ndarray) -> Any:
        calls.append(len(inputs))
        return predict(inputs)

    def failed(bad: set[int], n: int) -> list[str]:
        out = handle_batch(model, batch([item(i, -good if i in bad else good, 0) for i in range(n)]), worker_id="w")
        return [p.query_id for p in out.predictions[(None, 0)] if p.status == "error"]

    model.predict_batch = counted  # type: ignore[method-assign]
    good = np.ones(2, dtype=np.float32)
    assert failed({5}, 16) == ["q5"]
    assert len(calls) <= 1 + 2 * 4  # the batch, then two halves at each of log2(16) levels
    assert failed({3, 9, 15, 21, 27}, 30) == ["q3", "q9", "q15", "q21", "q27"]  # several, in both halves
    calls.clear()
    out = handle_batch(model, batch([item(i, -good, 0) for i in range(16)]), worker_id="w")
    assert len(calls) == 1 + 30  # every input tried alone once: each fails
    assert {p.error for p in out.predictions[(None, 0)]} == {
        "model error: RuntimeError on a batch of 16 (the model fails on every input)"}  # no caller's text
    calls.clear()
    assert len(failed(set(range(16)), 16)) == 16 and calls == [16]  # failing on everything: not split again
    assert failed(set(), 4) == [] and failed({1}, 4) == ["q1"]  # until a batch is answered
