"""`clipstream up` with worker hosts (``CLIPSTREAM_UP_WORKERS=shared``): which processes serve
which models' replicas, and how a host is replaced when the registry changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clipstream.up import Pipeline, _hosted_versions, wanted_stages
from registry.topic import ModelConfig
from tests.unit.test_up_stages import SPEC, FakeSupervisor, view

HOST = "workers-a-v1+b-v3-0"


def test_replica_r_of_every_model_shares_a_process_and_a_lone_replica_keeps_its_own() -> None:
    w = wanted_stages(view(b="3", a="1"), shared_workers=True)
    assert w[HOST] == ["worker", "--model", "a", "--model", "b", "--replica", "0"]
    # only b has a second replica: a process of its own, as without hosts
    assert w["worker-b-v3-1"] == ["worker", "--model", "b", "--version", "3", "--replica", "1", "--replicas", "2"]
    assert not any(k.startswith("worker-") and k.endswith("-0") for k in w)
    assert not any("broken" in k for k in w)
    assert "batchers-a+b" in w  # batchers as before
    alone = wanted_stages(view(a="1"), shared_workers=True)
    assert "worker-a-v1-0" in alone and not any(k.startswith("workers-") for k in alone)


def test_a_hosts_name_reads_back_as_its_models_versions() -> None:
    assert _hosted_versions(HOST, view(a="1", b="3")) == {"a": "1", "b": "3"}
    assert _hosted_versions("workers-a-v1+a-b-v2.1-0", view(**{"a": "1", "a-b": "2.1"})) == {"a": "1", "a-b": "2.1"}


def test_a_host_whose_model_moved_serves_on_until_the_handover_then_leaves_by_itself() -> None:
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_workers=True)  # type: ignore[arg-type]
    pipe.sync(view(a="1", b="3"))
    old = sup.stages[HOST]
    pipe.sync(view(a="1", b="4"))  # deploy-model b 4: a host with b's new version beside the old one
    assert "workers-a-v1+b-v4-0" in sup.stages and sup.removed == []
    assert HOST in pipe.leaving and old.removed and pipe.leaving[HOST].model is None
    pipe.sync(view(a="1", b="3"))  # rolled back before version 4 took over: the old host serves on
    assert sup.stages[HOST] is old and not old.removed and "workers-a-v1+b-v4-0" in pipe.leaving
    pipe.sync(view(a="1", b="4"))
    assert HOST in pipe.leaving
    old.proc.returncode = 0  # the batcher handed b over: the old host stopped by itself
    pipe.retire()
    assert HOST not in pipe.leaving and sup.removed == []


def test_a_leaving_host_never_handed_over_is_stopped_after_its_successor_was_ready_a_grace(monkeypatch: Any) -> None:
    import signal

    import clipstream.up as up

    sent: list[signal.Signals] = []
    monkeypatch.setattr(up, "_killpg", lambda pid, sig: sent.append(sig))
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_workers=True)  # type: ignore[arg-type]
    pipe.sync(view(a="1", b="3"))
    pipe.sync(view(a="2", b="3"))
    pipe._see_out(0.0)
    assert sent == []  # the new host is still loading
    sup.stages["workers-a-v2+b-v3-0"].ready.set()
    pipe._see_out(100.0)
    pipe._see_out(100.0 + up.LEAVE_GRACE_S + 1)
    assert sent == [signal.SIGTERM]


def test_a_host_replaced_for_another_set_of_models_stops_once_its_successor_is_ready() -> None:
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_workers=True)  # type: ignore[arg-type]
    pipe.sync(view(a="1", b="3"))
    pipe.sync(view(a="1", b="3", c="1"))  # a model came: one host for the three
    host = "workers-a-v1+b-v3+c-v1-0"
    assert HOST in sup.stages and host in sup.stages and not pipe.leaving
    for name, stage in sup.stages.items():
        if name != host:
            stage.ready.set()
    pipe.retire()
    assert HOST in sup.stages  # its successor is not ready: the old host keeps serving
    sup.stages[host].ready.set()
    pipe.retire()
    assert HOST in sup.removed and HOST not in sup.stages


def test_a_lone_worker_whose_model_joins_a_host_serves_until_the_host_is_ready() -> None:
    sup = FakeSupervisor()
    pipe = Pipeline(sup, {}, shared_workers=True)  # type: ignore[arg-type]
    pipe.sync(view(b="3"))
    assert {"worker-b-v3-0", "worker-b-v3-1"} <= set(sup.stages)
    more = view(b="3", a="1")
    pipe.sync(more)  # b's replica 0 joins a's in a host; replica 1 stays alone
    assert {HOST, "worker-b-v3-0", "worker-b-v3-1"} <= set(sup.stages) and sup.removed == []
    sup.stages["worker-b-v3-1"].ready.set()
    pipe.retire()
    assert sup.removed == []  # the host is not ready yet
    sup.stages[HOST].ready.set()
    pipe.retire()
    assert sup.removed == ["worker-b-v3-0"] and "worker-b-v3-1" in sup.stages
    fewer = view(b="3", a="1")
    fewer.models["b"] = ModelConfig("b", "3", Path("/m"), replicas=1, spec=SPEC)
    pipe.sync(fewer)
    assert sup.removed == ["worker-b-v3-0", "worker-b-v3-1"]  # fewer replicas: stopped at once
