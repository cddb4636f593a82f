"""Which stages `clipstream up` runs for a registry view, per model or with one shared batcher."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from clipstream.pipeline import Pipeline, wanted_stages
from registry.groups import groups_of
from registry.topic import ModelConfig, RegistryView

SPEC: Any = object()  # any non-None spec: the model loaded


def view(**versions: str) -> RegistryView:
    models = {n: ModelConfig(n, v, Path("/m"), replicas=2 if n == "b" else 1, spec=SPEC) for n, v in versions.items()}
    models["broken"] = ModelConfig("broken", "1", Path("/x"), spec=None)  # no model.yaml: not served
    return RegistryView(models=models)


def test_per_model_batchers_follow_the_version_themselves() -> None:
    w = wanted_stages(view(a="1", b="3"), shared_batcher=False)
    assert w["batcher-a"] == ["batcher", "--model", "a", "--member", "batcher-1"]
    assert w["batcher-b"] == ["batcher", "--model", "b", "--member", "batcher-1"]
    assert sorted(k for k in w if k.startswith("worker-")) == ["worker-a-v1-0", "worker-b-v3-0", "worker-b-v3-1"]
    assert not any("broken" in k for k in w)


def test_a_shared_batcher_serves_every_loaded_model_and_is_named_by_them_not_their_versions() -> None:
    w = wanted_stages(view(b="3", a="1"))  # the default
    assert [k for k in w if k.startswith("batcher")] == ["batchers-a+b"]
    assert w["batchers-a+b"] == ["batcher", "--model", "a", "--model", "b", "--member", "batcher-1"]
    assert "worker-b-v3-1" in w
    again = wanted_stages(view(a="2", b="3"), shared_batcher=True)  # a new version of a
    assert "batchers-a+b" in again and "worker-a-v2-0" in again  # the batcher stays; a's worker is replaced


class FakeProc:
    def __init__(self) -> None:
        self.returncode: int | None = None
        self.pid = -1

    def poll(self) -> int | None:
        return self.returncode


class FakeStage:
    def __init__(self, name: str = "", argv: list[str] | None = None) -> None:
        self.name, self.argv = name, argv or []
        self.ready = threading.Event()
        self.proc = FakeProc()
        self.removed = False
        self.spare = False
        self.ready_line = f"ready: {name}"  # it has served (a test makes one that never got ready)
        self.restarts = 0


class FakeSupervisor:
    def __init__(self) -> None:
        self.stages: dict[str, FakeStage] = {}
        self.removed: list[str] = []

    def add(self, name: str, argv: list[str], env: dict[str, str], spare: bool = False) -> FakeStage:
        self.stages[name] = FakeStage(name, argv)
        self.stages[name].spare = spare
        return self.stages[name]

    def remove(self, name: str) -> None:
        self.removed.append(name)
        del self.stages[name]

    def release(self, name: str) -> FakeStage | None:
        stage = self.stages.pop(name, None)
        if stage is not None:
            stage.removed = True
        return stage

    def adopt(self, stage: FakeStage, restart: bool = True) -> None:
        stage.removed = not restart
        self.stages.setdefault(stage.name, stage)


def test_a_replaced_shared_batcher_stops_only_once_its_successor_is_ready(capsys: Any) -> None:
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_batcher=True)  # type: ignore[arg-type]
    pipe.sync(view(a="1"))
    sup.stages["batchers-a"].ready.set()
    pipe.sync(view(a="1", b="1"))  # a model came: a new batcher for both
    assert "batchers-a" in sup.stages and "batchers-a+b" in sup.stages
    pipe.retire()
    assert "batchers-a" in sup.stages  # the new one is not ready yet: the old one keeps serving
    sup.stages["batchers-a+b"].ready.set()
    assert "stopped" not in capsys.readouterr().err
    pipe.retire()
    assert sup.removed == ["batchers-a"] and "batchers-a+b" in sup.stages
    assert capsys.readouterr().err == "stopped batchers-a (registry change)\n"  # as its successor's start is said



def test_an_old_versions_workers_serve_on_beside_the_new_ones_until_handed_over() -> None:
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_batcher=True)  # type: ignore[arg-type]
    pipe.sync(view(a="1", b="3"))
    old = sup.stages["worker-b-v3-1"]
    pipe.sync(view(a="1", b="4"))  # deploy-model b 4
    assert {"worker-b-v4-0", "worker-b-v4-1"} <= set(sup.stages) and sup.removed == []
    assert sorted(pipe.leaving) == ["worker-b-v3-0", "worker-b-v3-1"] and old.removed  # no restart
    assert "worker-b-v3-1" not in sup.stages
    pipe.sync(view(a="1", b="3"))  # rolled back before version 4 took over: version 3 serves on
    assert sup.stages["worker-b-v3-1"] is old and not old.removed
    assert sorted(pipe.leaving) == ["worker-b-v4-0", "worker-b-v4-1"] and sup.removed == []
    new = pipe.leaving["worker-b-v4-0"].stage
    pipe.sync(view(a="1", b="4"))  # and deployed again: version 4's live workers come back, not new ones
    assert sup.stages["worker-b-v4-0"] is new and sorted(pipe.leaving) == ["worker-b-v3-0", "worker-b-v3-1"]
    old.proc.returncode = 0  # the batcher handed its partition over: it stopped by itself
    pipe.retire()
    assert sorted(pipe.leaving) == ["worker-b-v3-0"] and sup.removed == []


def test_a_removed_replica_serves_what_was_sent_to_it_and_each_stop_is_said(capsys: Any) -> None:
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_batcher=True)  # type: ignore[arg-type]
    pipe.sync(view(b="3"))
    fewer = view(b="3")
    fewer.models["b"] = ModelConfig("b", "3", Path("/m"), replicas=1, spec=SPEC)
    assert pipe.sync(fewer) == []
    # not stopped: it leaves once the batcher's retirement follows the batches sent to it
    assert sup.removed == [] and sorted(pipe.leaving) == ["worker-b-v3-1"]
    assert capsys.readouterr().err == ("worker-b-v3-1 serves until the batches sent to it are served "
                                       "(b now has 1 replica)\n")
    pipe.leaving["worker-b-v3-1"].stage.proc.returncode = 0  # it stopped by itself
    pipe.retire()
    assert not pipe.leaving
    # as ``up`` says "started worker-... (registry change)" for a scale-up
    assert capsys.readouterr().err == "worker-b-v3-1 stopped (its partition was handed over, exit code 0)\n"


def test_a_replaced_worker_that_never_got_ready_is_stopped_at_once_and_a_kept_one_is_said(capsys: Any) -> None:
    """A version that crash-looped since its deploy has served nothing: a rollback stops its
    workers at once rather than waiting for a handover; the old version's worker, rolled back
    to before it left, is said to serve on."""
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_batcher=True)  # type: ignore[arg-type]
    pipe.sync(view(b="3"))
    pipe.sync(view(b="4"))  # deploy-model b 4, whose model does not load
    for name in ("worker-b-v4-0", "worker-b-v4-1"):
        sup.stages[name].ready_line = ""
        sup.stages[name].restarts = 2  # it exits at every start
    capsys.readouterr()
    pipe.sync(view(b="3"))  # rollback b
    assert sorted(sup.removed) == ["worker-b-v4-0", "worker-b-v4-1"] and not pipe.leaving
    err = capsys.readouterr().err
    assert "stopped worker-b-v4-0 (registry change; it was never ready)" in err
    assert "worker-b-v3-0 serves on (registry change)" in err


def test_a_replaced_worker_still_loading_is_left_to_its_handover_not_stopped(capsys: Any) -> None:
    """Two deploys a second apart: the first one's worker is still loading when the second
    comes. The batcher may hand the partition to it the moment it is ready, before up reads its
    ready line; stopped then, the model would have no worker until the second one loaded."""
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_batcher=True)  # type: ignore[arg-type]
    pipe.sync(view(b="2"))
    pipe.sync(view(b="3"))  # deploy-model b 3
    for name in ("worker-b-v3-0", "worker-b-v3-1"):
        sup.stages[name].ready_line = ""  # loading, alive, never restarted
    capsys.readouterr()
    pipe.sync(view(b="1"))  # deploy-model b 1, a second later
    assert sup.removed == [] and {"worker-b-v3-0", "worker-b-v3-1"} <= set(pipe.leaving)
    assert "worker-b-v3-0 serves until version 1 of b is ready" in capsys.readouterr().err


def test_an_old_worker_never_handed_over_is_stopped_after_a_grace(monkeypatch: Any) -> None:
    import signal

    import clipstream.pipeline as pipeline

    sent: list[signal.Signals] = []
    monkeypatch.setattr(pipeline, "_killpg", lambda pid, sig: sent.append(sig))
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_batcher=True)  # type: ignore[arg-type]
    pipe.sync(view(a="1"))
    pipe.sync(view(a="2"))
    pipe._see_out(0.0)  # version 2 is still loading: version 1 serves, however long that takes
    pipe._see_out(1000.0)
    assert sent == []
    sup.stages["worker-a-v2-0"].ready.set()
    pipe._see_out(1000.0)
    pipe._see_out(1000.0 + pipeline.LEAVE_GRACE_S + 1)
    pipe._see_out(1000.0 + pipeline.LEAVE_GRACE_S + 2)
    assert sent == [signal.SIGTERM]
    pipe._see_out(1000.0 + 2 * pipeline.LEAVE_GRACE_S + 1)
    assert sent == [signal.SIGTERM, signal.SIGKILL]


def test_batcher_members_share_one_group_each_a_named_static_member() -> None:
    w = wanted_stages(view(a="1", b="3"), shared_batcher=True, batcher_members=2)
    assert [k for k in w if k.startswith("batcher")] == ["batchers-a+b.1", "batchers-a+b.2"]
    assert w["batchers-a+b.2"] == ["batcher", "--model", "a", "--model", "b", "--member", "batcher-2"]
    per_model = wanted_stages(view(a="1"), shared_batcher=False, batcher_members=2)
    assert per_model["batcher-a.1"][-2:] == ["--member", "batcher-1"] and "batcher-a.2" in per_model


def test_batchers_and_workers_keep_a_spare_process_unless_spares_are_off() -> None:
    for spares in (True, False):
        sup = FakeSupervisor()
        Pipeline(sup, {}, shared_batcher=True, spares=spares).sync(view(a="1", b="3"))  # type: ignore[arg-type]
        kept = {name: stage.spare for name, stage in sup.stages.items()}
        assert kept == {"batchers-a+b": spares, "worker-a-v1-0": spares, "worker-b-v3-0": spares, "worker-b-v3-1": spares}


def test_a_group_gets_one_batcher_entry_and_its_own_workers_not_its_members() -> None:
    v = view(a="1", b="3", c="1")
    models = {n: (replace(m, group="g") if n in ("a", "b") else m) for n, m in v.models.items()}
    grouped = RegistryView(models=models, groups=groups_of(models))
    w = wanted_stages(grouped)
    assert w["batchers-c+g"] == ["batcher", "--model", "c", "--model", "g", "--member", "batcher-1"]
    gv = grouped.groups["g"].version
    assert sorted(k for k in w if k.startswith("worker-")) == sorted(
        ["worker-c-v1-0", f"worker-g-v{gv}-0", f"worker-g-v{gv}-1"])  # b's two replicas are the group's
    assert w[f"worker-g-v{gv}-1"] == ["worker", "--model", "g", "--version", gv, "--replica", "1", "--replicas", "2"]
    apart = wanted_stages(grouped, shared_batcher=False)  # a batcher per served unit: the group has one
    assert sorted(k for k in apart if k.startswith("batcher")) == ["batcher-c", "batcher-g"]


def test_a_model_this_host_cannot_read_is_said_once_with_the_way_out(capsys: Any) -> None:
    """A location in a model repository that `up` was not told of: no worker starts, and
    nothing else would say why."""
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_batcher=True)  # type: ignore[arg-type]
    unread = ModelConfig("repom", "1", Path("logreg/1"), spec=None,
                         spec_error="logreg/1: a relative location needs CLIPSTREAM_MODEL_REPOSITORY")
    v = RegistryView(models={**view(a="1").models, "repom": unread})
    pipe.sync(v)
    pipe.sync(v)  # said once
    err = capsys.readouterr().err
    assert err.count("alert: up: model repom version 1 is not served") == 1, err
    assert "CLIPSTREAM_MODEL_REPOSITORY set for up as for deploy-model" in err
    assert not any("repom" in s for s in sup.stages)
