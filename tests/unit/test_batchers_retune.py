"""A model's batching knobs changed in the registry (``apply``) reach a running batcher: before,
they waited for its next start, while ``read_view`` showed them as in force."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest

from batchers.aimd import AIMD
from batchers.app import _follow
from registry.topic import ModelConfig
from tests.unit.test_batchers_version import service


def test_aimd_keeps_what_it_learnt_within_a_new_cap() -> None:
    a = AIMD(20_000, cap=16, start=12)
    a.retune(80_000, 8)
    assert (a.objective_us, a.cap, a.max_batch_size) == (80_000, 8, 8)
    a.retune(80_000, 32)
    assert a.max_batch_size == 8  # grows again by its reports, not by the new cap alone
    with pytest.raises(ValueError):
        a.retune(0, 8)


def _follower(cfg: ModelConfig) -> SimpleNamespace:
    return SimpleNamespace(view=lambda: SimpleNamespace(served=lambda: {"m": cfg}))


def test_the_batcher_takes_the_registrys_knobs_while_it_serves(capsys: pytest.CaptureFixture[str]) -> None:
    svc, _ = service("1", 2)
    cfg = ModelConfig(name="m", version="1", path="/models/m/1", replicas=2, latency_objective_ms=80.0,
                      max_batch_size=4, batch_delay_ms=30.0)
    asyncio.run(_follow(svc, _follower(cfg)))
    d = svc.core.dispatcher
    assert d.batch_delay_us == 30_000
    assert all((r.aimd.objective_us, r.aimd.cap) == (80_000, 4) for r in d.replicas)
    said = capsys.readouterr().out
    assert said.startswith("note: batcher: model m: batching now latency_objective_ms=80 max_batch_size=4 "
                           "batch_delay_ms=30"), said
    d.resize(3)  # a replica added later is made with the new knobs
    assert (d.replicas[2].aimd.objective_us, d.replicas[2].aimd.cap) == (80_000, 4)
    asyncio.run(_follow(svc, _follower(cfg)))  # read again: nothing changes, nothing is said
    assert capsys.readouterr().out == ""
    # knobs the registry no longer sets go back to the batcher's defaults
    asyncio.run(_follow(svc, _follower(replace(cfg, latency_objective_ms=None, max_batch_size=None,
                                                   batch_delay_ms=None))))
    assert svc.model.max_batch_size == svc.bs.max_batch_size and d.batch_delay_us == int(svc.bs.batch_delay_ms * 1000)


def test_knobs_set_on_the_command_line_stay() -> None:
    svc, _ = service("1", 1)
    svc.model = replace(svc.model, pinned=("max_batch_size",))
    assert svc.retune(80.0, 64, 2.0) is True
    assert svc.model.max_batch_size == 8 and svc.model.latency_objective_ms == 80.0
    assert svc.core.dispatcher.replicas[0].aimd.cap == 8
