"""A group's batch through every member (``workers.group``): one record per destination holding
each member's predictions, per-member errors and cache keys, the worker's loop and the CLI."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from clipstream.cachekey import input_digest, key_of
from clipstream.errors import ConfigError
from clipstream.settings import Settings
from clipstream.testing.models import digits, make_onnx_digits_model, make_profile_model, make_python_model
from registry.groups import groups_of
from registry.spec import load_spec
from registry.topic import ModelConfig, RegistryView
from schemas import Batch, BatchItem, BatchStats, Predictions, Tensor, decode_as, encode
from tests.unit.test_workers_batch import Flaky
from tests.unit.test_workers_loop import FakeCacheWrites, FakeConsumer, FakeProducer, Msg
from topics.catalogue import Catalogue
from workers import cli
from workers.backends import BatchModel, load_model
from workers.batch import BatchOutcome
from workers.group import GroupModel, Member, finish_group, prepare, run, run_group, warm
from workers.worker import Worker

GROUP_VERSION = "g0123456789"


class Mean:
    """Regression: each input's mean. Keeps every batch it was given."""

    def __init__(self, path: Path, config: dict) -> None:
        self.calls: list[np.ndarray] = []

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        self.calls.append(inputs)
        return inputs.mean(axis=1)


@pytest.fixture(scope="module")
def logreg(tmp_path_factory: pytest.TempPathFactory) -> BatchModel:
    return load_model(load_spec(make_onnx_digits_model(tmp_path_factory.mktemp("m"))), device="cpu")


def python_model(root: Path, name: str, cls: type, **kwargs: Any) -> BatchModel:
    return load_model(load_spec(make_python_model(root, name, cls, version="3", **kwargs)))


@pytest.fixture
def mean(tmp_path: Path) -> BatchModel:
    return python_model(tmp_path, "gmean", Mean)


@pytest.fixture
def flaky(tmp_path: Path) -> BatchModel:
    return python_model(tmp_path, "gflaky", Flaky, labels=["a", "b"])


def group_of(*members: tuple[str, BatchModel]) -> GroupModel:
    return GroupModel("ens", GROUP_VERSION, tuple(Member(name, "1" if name == "logreg" else "3", model)
                                                  for name, model in members))


def item(i: int, array: np.ndarray, part: int = 0, models: tuple[str, ...] = (), cached: bool = True,
         **kwargs: Any) -> BatchItem:
    tensor = Tensor.of(array)
    return BatchItem(query_id=f"q{i}", selector_partition=part, deadline_us=10**18,
                     cache_key=input_digest(tensor) if cached else None, input=tensor,
                     trace={"batcher_in": 1, "batched": 2}, models=list(models), **kwargs)


def batch(items: list[BatchItem], batch_id: str = "b1") -> Batch:
    record = Batch(batch_id=batch_id, model="ens", version=GROUP_VERSION, replica=0, created_us=1_000, items=items)
    return decode_as(Batch, encode(record))  # exactly what the worker decodes


def serve(group: GroupModel, b: Batch, **kwargs: Any) -> BatchOutcome:
    p = prepare(group, b, received_us=4_000, **kwargs)
    return finish_group(p, run_group(group, p), worker_id="w")


def answers(out: BatchOutcome) -> dict[tuple[str, str], Any]:
    """(query, member) -> its prediction, from every record."""
    found = {}
    for _, _, record in out.predictions_records():
        for pred in record.items:
            assert (pred.query_id, pred.model) not in found  # one prediction per member and item
            found[(pred.query_id, pred.model)] = pred
    return found


def test_every_member_answers_each_item_in_one_record_per_destination(logreg: BatchModel, mean: BatchModel) -> None:
    x, _ = digits()
    group = group_of(("logreg", logreg), ("gmean", mean))
    items = [item(i, x[i], part=i % 2) for i in range(4)]
    items.append(replace(item(4, x[4], part=9), reply_topic="t.replies.gw", reply_partition=0))
    p = prepare(group, batch(items), received_us=4_000)
    out = finish_group(p, run(group, p), worker_id="w")  # type: ignore[arg-type]
    records = out.predictions_records()
    assert [(t, part) for t, part, _ in records] == [(None, 0), (None, 1), ("t.replies.gw", 0)]
    expected = logreg.predict_batch(x[:5])
    for topic, part, record in records:
        assert isinstance(record, Predictions) and decode_as(Predictions, encode(record)) == record
        queries = {pred.query_id for pred in record.items}
        assert queries == ({"q4"} if topic else {f"q{i}" for i in range(4) if i % 2 == part})
        assert sorted((pred.model, pred.version) for pred in record.items) == sorted(
            [("gmean", "3"), ("logreg", "1")] * len(queries))
        for pred in record.items:
            i = int(pred.query_id[1:])
            assert pred.status == "ok" and pred.error is None and pred.output is not None
            assert pred.trace["worker_in"] == 4_000 and pred.trace["worker_out"] > 0 and pred.trace["batched"] == 2
            if pred.model == "logreg":
                np.testing.assert_allclose(pred.output.array(), expected[i], rtol=1e-6)
            else:
                assert pred.output.array().dtype == np.float64 and pred.output.array() == pytest.approx(x[i].mean())
    assert items[0].trace == {"batcher_in": 1, "batched": 2}  # the item's own trace is left alone
    assert mean.impl.calls == [p.inputs] and mean.impl.calls[0] is p.inputs  # type: ignore[attr-defined]
    stats = out.stats
    assert isinstance(stats, BatchStats) and decode_as(BatchStats, encode(stats)) == stats
    assert (stats.model, stats.batch_size, stats.errors, stats.worker_id) == ("ens", 5, 0, "w")
    assert stats.queue_wait_us == 3_000 and stats.service_us > 0
    assert out.dead_letters == []


def test_an_item_naming_some_members_gets_only_theirs(logreg: BatchModel, mean: BatchModel) -> None:
    x, _ = digits()
    group = group_of(("logreg", logreg), ("gmean", mean))
    items = [item(0, x[0]), item(1, x[1], models=("gmean",)), item(2, x[2], models=("logreg",)),
             item(3, x[3], models=("gmean", "logreg"))]
    out = serve(group, batch(items))
    assert sorted(answers(out)) == [("q0", "gmean"), ("q0", "logreg"), ("q1", "gmean"), ("q2", "logreg"),
                                    ("q3", "gmean"), ("q3", "logreg")]
    (ran,) = mean.impl.calls  # type: ignore[attr-defined]
    np.testing.assert_array_equal(ran, x[[0, 1, 3]])  # only the rows that need it
    for i in (0, 1, 3):  # each row's answer is its own item's
        assert answers(out)[(f"q{i}", "gmean")].output.array() == pytest.approx(x[i].mean())
    expected = logreg.predict_batch(x[[0, 2, 3]])
    for k, i in enumerate((0, 2, 3)):
        np.testing.assert_allclose(answers(out)[(f"q{i}", "logreg")].output.array(), expected[k], rtol=1e-6)
    assert out.stats is not None and out.stats.errors == 0 and out.stats.batch_size == 4


def test_a_failing_member_fails_only_its_own_predictions(flaky: BatchModel, mean: BatchModel) -> None:
    group = group_of(("gflaky", flaky), ("gmean", mean))
    good = np.ones(64, dtype=np.float32)
    out = serve(group, batch([item(0, good), item(1, -good), item(2, good, models=("gmean",))]))
    found = answers(out)
    assert {k: p.status for k, p in found.items()} == {
        ("q0", "gflaky"): "ok", ("q1", "gflaky"): "error",  # only the input it fails on
        ("q0", "gmean"): "ok", ("q1", "gmean"): "ok", ("q2", "gmean"): "ok"}
    failed = found[("q1", "gflaky")]
    assert failed.error == "model error: RuntimeError: negative input" and failed.output is None
    assert failed.version == "3" and failed.trace["worker_in"] == 4_000
    assert found[("q1", "gmean")].output.array() == pytest.approx(-1.0)
    digests = [input_digest(Tensor.of(v)) for v in (good, -good)]
    assert sorted(k for k, _ in out.cache) == sorted([*(key_of("gmean", "3", d) for d in (*digests, digests[0])),
                                                      key_of("gflaky", "3", digests[0])])
    assert out.stats is not None and out.stats.errors == 1 and out.stats.batch_size == 3
    again = serve(group, batch([item(0, good)]))  # the next batch is fine
    assert [p.status for p in answers(again).values()] == ["ok", "ok"]


def test_cache_entries_are_each_members_own_key(logreg: BatchModel, mean: BatchModel) -> None:
    x, _ = digits()
    group = group_of(("logreg", logreg), ("gmean", mean))
    items = [item(0, x[0]), item(1, x[1], cached=False), item(2, x[2], models=("gmean",))]
    out = serve(group, batch(items))
    digest = {i: input_digest(Tensor.of(x[i])) for i in range(3)}
    assert items[0].cache_key == digest[0]
    cache = dict(out.cache)
    assert len(cache) == len(out.cache) == 3  # none for the item without a key, none twice
    assert set(cache) == {key_of("logreg", "1", digest[0]), key_of("gmean", "3", digest[0]),
                          key_of("gmean", "3", digest[2])}
    assert key_of("logreg", "1", digest[0]) == f"cs:cache:logreg:1:{digest[0]}"
    for (q, member), pred in answers(out).items():
        key = key_of(member, pred.version, digest[int(q[1:])])
        if q != "q1":
            np.testing.assert_array_equal(decode_as(Tensor, cache[key]).array(), pred.output.array())


def test_a_bad_input_gets_an_error_from_each_member_it_needs_and_a_dead_letter(
        logreg: BatchModel, mean: BatchModel) -> None:
    x, _ = digits()
    group = group_of(("logreg", logreg), ("gmean", mean))
    undecodable = replace(item(3, x[3], models=("logreg", "gmean")), input=Tensor("float32", [64], b"\x00" * 7))
    items = [item(0, x[0]), item(1, x[1][:10]), item(2, x[2].astype(np.float64), models=("gmean",)),
             undecodable, item(4, x[4], part=5)]
    out = serve(group, batch(items), source=("t", 0, 42), selector_partitions=2, catalogue=Catalogue("t."))
    found = answers(out)
    assert sorted((q, m, p.version, p.status) for (q, m), p in found.items()) == [
        ("q0", "gmean", "3", "ok"), ("q0", "logreg", "1", "ok"),
        ("q1", "gmean", "3", "error"), ("q1", "logreg", "1", "error"),
        ("q2", "gmean", "3", "error"),
        ("q3", "gmean", "3", "error"), ("q3", "logreg", "1", "error")]
    assert all("shape [10]" in (found[("q1", m)].error or "") for m in ("gmean", "logreg"))
    assert (found[("q2", "gmean")].error or "").startswith("bad input:")
    assert [d.query_id for d in out.dead_letters] == ["q1", "q2", "q3", "q4"]  # q4: answered nowhere
    assert out.dead_letters[0].source_offset == 42 and "shape" in out.dead_letters[0].reason
    assert decode_as(BatchItem, out.dead_letters[0].payload or b"").trace == {"batcher_in": 1, "batched": 2}
    assert out.stats is not None and (out.stats.model, out.stats.batch_size, out.stats.errors) == ("ens", 5, 6)


def test_a_batch_with_nothing_to_run_still_reports(logreg: BatchModel, mean: BatchModel) -> None:
    x, _ = digits()
    group = group_of(("logreg", logreg), ("gmean", mean))
    p = prepare(group, batch([item(0, x[0][:3])]), received_us=4_000)
    assert run(group, p) is None
    out = finish_group(p, None, worker_id="w")
    assert [(pred.model, pred.status) for pred in out.predictions[(None, 0)]] == [("logreg", "error"), ("gmean", "error")]
    assert out.stats is not None and (out.stats.service_us, out.stats.errors, out.stats.batch_size) == (0, 2, 1)


def test_the_group_checks_its_members_and_warms_each(tmp_path: Path, logreg: BatchModel, mean: BatchModel) -> None:
    group = group_of(("logreg", logreg), ("gmean", mean))
    assert group.spec == logreg.spec and group.device == "cpu"
    warm(group)
    assert [c.shape for c in mean.impl.calls] == [(1, 64), (2, 64)]  # type: ignore[attr-defined]  # then a batch of two
    mean.impl.calls.clear()  # type: ignore[attr-defined]
    warm(group, batches=False)  # batches of one request at most
    assert [c.shape for c in mean.impl.calls] == [(1, 64)]  # type: ignore[attr-defined]
    narrow = python_model(tmp_path, "narrow", Mean, shape=[4])
    with pytest.raises(ConfigError, match="members share one input"):
        group_of(("logreg", logreg), ("narrow", narrow))
    with pytest.raises(ConfigError, match="no members"):
        GroupModel("ens", GROUP_VERSION, ())


def test_the_worker_serves_a_group(logreg: BatchModel, mean: BatchModel) -> None:
    """The worker's own loop, with fake Kafka and Redis: the main thread's path and the
    pipeline's alike finish a group's batch by member."""
    x, _ = digits()
    w = Worker(Settings(topic_prefix="p."), group_of(("logreg", logreg), ("gmean", mean)), "ens",
               version=GROUP_VERSION)
    w.producer = producer = FakeProducer()  # type: ignore[assignment]
    w.consumer = consumer = FakeConsumer(producer.log)  # type: ignore[assignment]
    w.cache_writes = cache = FakeCacheWrites()  # type: ignore[assignment]
    w.ws = w.ws.model_copy(update={"flush_timeout_s": 5.0})
    w.selector_partitions = 2
    w.start_pipeline()
    second = batch([item(2, x[2], part=1, models=("gmean",))], batch_id="b2")
    consumer.fetched.append(Msg(encode(second), 1, "p.batches.ens"))  # arrives while the first runs
    nxt = w.feed(Msg(encode(batch([item(0, x[0]), item(1, x[1][:5])])), 0, "p.batches.ens"))
    assert nxt is not None and w.feed(nxt) is None
    assert w.drain(5.0)
    producer.flush(0)
    w.housekeep()
    assert consumer.commits == [2]
    preds = [p for t, _, v in producer.sent if t == "p.predictions" for p in decode_as(Predictions, v).items]
    assert sorted((p.query_id, p.model, p.status) for p in preds) == [
        ("q0", "gmean", "ok"), ("q0", "logreg", "ok"), ("q1", "gmean", "error"), ("q1", "logreg", "error"),
        ("q2", "gmean", "ok")]
    stats = [decode_as(BatchStats, v) for t, _, v in producer.sent if t == "p.batch-stats.ens"]
    assert [(s.batch_id, s.model, s.errors) for s in stats] == [("b1", "ens", 2), ("b2", "ens", 0)]
    digest = input_digest(Tensor.of(x[0]))
    assert {key_of("logreg", "1", digest), key_of("gmean", "3", digest),
            key_of("gmean", "3", input_digest(Tensor.of(x[2])))} <= set(cache.store)


# -- clipstream worker --model <group> ------------------------------------------------------

def fake_registry(monkeypatch: pytest.MonkeyPatch, view: RegistryView) -> list[dict[str, Any]]:
    """The CLI's registry and Worker, faked: returns the Worker's arguments once it runs."""
    made: list[dict[str, Any]] = []

    class RegistryFollower:
        def __init__(self, settings: object) -> None:
            pass

        def start(self) -> "RegistryFollower":
            return self

        def wait_ready(self, timeout_s: float) -> RegistryView:
            return view

        def view(self) -> RegistryView:
            return view

        def stop(self) -> None:
            pass

    class FakeWorker:
        def __init__(self, settings: Settings, model: Any, name: str, **kwargs: Any) -> None:
            made.append({"model": model, "name": name, **kwargs})

        def run(self) -> None:
            pass

    monkeypatch.setattr(cli, "RegistryFollower", RegistryFollower)
    monkeypatch.setattr(cli, "Worker", FakeWorker)
    return made


def registered(tmp_path: Path) -> RegistryView:
    models = {}
    for name, version, replicas, group in (("pa", "1", 2, "ens"), ("pb", "5", 3, "ens"), ("solo", "2", 1, None)):
        folder = make_profile_model(tmp_path, name, version)
        models[name] = ModelConfig(name, version, folder, replicas=replicas, spec=load_spec(folder),
                                   location=str(folder), group=group)
    return RegistryView(models=models, groups=groups_of(models))


def test_cli_serves_a_group_from_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    view = registered(tmp_path)
    made = fake_registry(monkeypatch, view)
    result = CliRunner().invoke(cli.worker, ["--model", "ens", "--replica", "1", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    (args,) = made
    group = args["model"]
    assert isinstance(group, GroupModel) and args["name"] == "ens" and group.name == "ens"
    assert args["version"] == group.version == view.groups["ens"].version and group.version.startswith("g")
    assert args["replicas"] == 3 and args["replica"] == 1 and args["own_version_only"] is True
    assert [(m.name, m.version, m.model.spec.path) for m in group.members] == [
        ("pa", "1", tmp_path / "pa" / "1"), ("pb", "5", tmp_path / "pb" / "5")]
    # a plain model is served as before
    assert CliRunner().invoke(cli.worker, ["--model", "solo"]).exit_code == 0
    assert made[1]["version"] == "2" and not isinstance(made[1]["model"], GroupModel)


def test_cli_refuses_a_group_version_that_is_not_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    view = registered(tmp_path)
    made = fake_registry(monkeypatch, view)
    result = CliRunner().invoke(cli.worker, ["--model", "ens", "--version", "g999"])
    assert result.exit_code == 1 and made == []
    assert f"current version is {view.groups['ens'].version}" in result.output
    assert "members' current versions" in result.output
    same = CliRunner().invoke(cli.worker, ["--model", "ens", "--version", view.groups["ens"].version])
    assert same.exit_code == 0 and isinstance(made[0]["model"], GroupModel)
    unknown = CliRunner().invoke(cli.worker, ["--model", "nope", "--registry-timeout", "0.2"])
    assert unknown.exit_code == 1 and "model or group 'nope' is not in the registry" in unknown.output


def test_a_model_that_fails_on_a_batch_of_two_fails_its_workers_start_saying_what_to_do(tmp_path: Path) -> None:
    """An ONNX export with a fixed batch of one answers the warm-up's one row, then fails on the
    first busy moment's batch of two: found at the start instead, with the way out."""
    from clipstream.errors import ModelError

    class OneAtATime:  # its source is written to the model's folder: no annotations it cannot import
        def __init__(self, path, config):  # noqa: ANN001
            pass

        def predict_batch(self, x):  # noqa: ANN001
            if len(x) != 1:
                raise ValueError("Got invalid dimensions for input\nindex: 0 Got: 2 Expected: 1")
            return np.zeros(1, np.float32)  # one regression value

    model = python_model(tmp_path, "fixed", OneAtATime, shape=[4])
    with pytest.raises(ModelError, match=r"not a batch of two \(model error: ValueError: Got invalid dimensions "
                                         r"for input index: 0 Got: 2 Expected: 1\).*`max_batch_size: 1`"):
        warm(model)
    warm(model, batches=False)  # its batches hold one request: it serves


@pytest.mark.parametrize("batches", [True, False])
def test_an_answer_too_wide_for_its_labels_is_said_as_that_whatever_the_batch(tmp_path: Path, batches: bool) -> None:
    """Four scores for three labels: the model's answer does not fit its model.yaml, at a batch
    of one as at two; sending the operator to the batch axis would not help."""
    from clipstream.errors import ModelError

    class Wide:  # its source is written to the model's folder: no annotations it cannot import
        def __init__(self, path, config):  # noqa: ANN001
            pass

        def predict_batch(self, x):  # noqa: ANN001
            return np.full((len(x), 4), 0.25, np.float32)

    model = python_model(tmp_path, "wide", Wide, shape=[4], labels=[0, 1, 2])
    with pytest.raises(ModelError, match=r"its answer does not fit its model.yaml \(.*shape \[1, 3\], got \[1, 4\]"):
        warm(model, batches=batches)


def test_a_label_model_answering_strings_fails_its_workers_start_saying_what_to_do(tmp_path: Path) -> None:
    from clipstream.errors import ModelError

    class Names:  # its source is written to the model's folder: no annotations it cannot import
        def __init__(self, path, config):  # noqa: ANN001
            pass

        def predict_batch(self, x):  # noqa: ANN001
            return np.array(["setosa"] * len(x))

    model = python_model(tmp_path, "names", Names, shape=[4], kind="label")
    with pytest.raises(ModelError, match=r"cannot travel as tensors .*use `kind: class_scores` with `labels`"):
        warm(model, batches=False)


def test_a_model_of_bytes_is_tried_at_its_start_on_its_example_only(tmp_path: Path) -> None:
    from clipstream.errors import ModelError
    from clipstream.testing.models import write_model_yaml

    class Decoder:  # as a model of encoded images: an empty input is no image
        def __init__(self, path, config):  # noqa: ANN001
            pass

        def predict_batch(self, blobs):  # noqa: ANN001
            if any(not b.startswith(b"IMG") for b in blobs):
                raise ValueError("not an image")
            return np.array([float(len(b)) for b in blobs])

    folder = make_python_model(tmp_path, "decoder", Decoder, kind="regression", dtype="bytes", shape=())
    warm(load_model(load_spec(folder)))  # no example: not tried on b"", which it could not take
    (folder / "sample.img").write_bytes(b"IMG\x00\xff")
    spec = load_spec(folder)
    write_model_yaml(folder, {**spec.config, "example": "sample.img"})
    warm(load_model(load_spec(folder)))  # tried on its example: a batch of one, then of two
    (folder / "sample.img").write_bytes(b"PNG")
    with pytest.raises(ModelError, match="it fails on its model.yaml example 'sample.img': ValueError: not an image"):
        warm(load_model(load_spec(folder)))
