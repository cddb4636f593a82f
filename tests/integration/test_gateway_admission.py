"""Admission control on the real pipeline (`clipstream up`: gateway, selector, batcher, workers):
a straggler answered by the cutoff is not overload, and requests expiring in a batcher's queue are.

An Exp4 app of three quick models and one that stalls 500 ms on the batches holding a flagged
input (30% of the calls), SLO 200 ms, called by 2 closed-loop callers. The cutoff answers the
flagged calls from the three others by the deadline; the gateway must neither refuse a caller
at its admission limit nor cut that limit towards its floor.

The load is kept well under what a slow 2-core machine serves: every call fans out to four
models, and a closed loop that nears the pipeline's capacity makes every answer late for
reasons that have nothing to do with the straggler.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from clipstream.infra.launcher import pick_free_ports
from clipstream.testing.callers import closed_loop, flagged_input, refusal_reasons, tally
from clipstream.testing.models import make_stalling_model
from clipstream.testing.procs import UpProcess, wait_until
from frontend.settings import GatewaySettings
from schemas.reasons import EXPIRED_IN_QUEUE

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
CALLERS, CALLS, SLO_MS, STALL_MS, SHARE = 2, 200, 200.0, 500.0, 0.3


def _limit(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("clipstream_gateway_admission_limit "))


def _up(settings, tmp_path: Path, app: dict, models: list[dict]) -> tuple[UpProcess, str]:
    """``clipstream up`` serving ``app``, ready; and the gateway's URL."""
    (tmp_path / "app.yaml").write_text(yaml.safe_dump({"apps": [app], "models": models}))
    port = pick_free_ports(1)[0]
    env = {**os.environ, "CLIPSTREAM_TOPIC_PREFIX": settings.topic_prefix, "CLIPSTREAM_STATE_DIR": str(tmp_path / "state"),
           "PYTHONUNBUFFERED": "1", "CLIPSTREAM_UP_WARM_UP_S": "0", "CLIPSTREAM_BATCHER_CACHE": "false",
           # the loop-lag guard answers this machine's other test runs, not the answers; it has
           # its own unit test, and here it would cut the limit these tests read
           "CLIPSTREAM_GATEWAY_MAX_LOOP_LAG_MS": "1000"}
    up = UpProcess(tmp_path / "app.yaml", port, env, ROOT)
    try:
        up.wait_ready(180)
    except BaseException:
        up.stop(90)
        raise
    return up, f"http://127.0.0.1:{port}"


def test_a_straggler_answered_by_the_cutoff_is_not_refused_as_overload(settings, tmp_path):
    models = [{"name": f"fast{k}", "path": str(make_stalling_model(tmp_path / "models", f"fast{k}")),
               "batch_delay_ms": 1} for k in range(3)]
    models.append({"name": "slow", "path": str(make_stalling_model(tmp_path / "models", "slow", STALL_MS)),
                   "batch_delay_ms": 1})
    up, url = _up(settings, tmp_path, {"name": "strag", "policy": "exp4", "slo_ms": SLO_MS, "default_output": -1,
                                       "models": [m["name"] for m in models]}, models)
    try:
        rng = np.random.default_rng(1)

        def all_four() -> bool:  # every model's worker has joined: an unflagged call answered by all
            r = httpx.post(f"{url}/v1/apps/strag/predict", json={"input": flagged_input(1, 0.0, rng)[0]}, timeout=10)
            return r.status_code == 200 and len(r.json()["models"]["answered"]) == 4

        wait_until(all_four, 120, "an answer from all four models")
        # the same load once, not counted: each selector member's and stage's first queries to
        # each model pay one-off costs (clients, metadata, topic checks) that ``up``'s warm-up
        # would have paid, and this test is about the steady state
        closed_loop(url, "strag", callers=CALLERS, calls_each=10, stall_share=SHARE, seed=2)
        calls = closed_loop(url, "strag", callers=CALLERS, calls_each=CALLS // CALLERS, stall_share=SHARE, seed=3)
        got = tally(calls, SLO_MS, "slow")
        limit = _limit(url)
    finally:
        up.stop(90)
    assert got["calls"] == CALLS and got["other_errors"] == 0, got
    # answered in time, checked first: a pipeline that cannot answer in time rightly cuts the
    # limit. Most answers here are made at the straggler cutoff, just under the deadline, so the
    # bound is the gateway's own promise to a caller, an answer within SLO + 20 ms. Answers later
    # than that, defaults and refusals may be 5% of the calls together: on 2 shared cores a
    # collection in the broker, or a stage waiting for a core, holds up every query in flight
    late = sum(1 for c in calls if c.status == 200 and float(c.body["latency_ms"]) > SLO_MS + 20)
    assert late + got["defaults"] + got["refused_503"] <= 0.05 * CALLS, (
        f"the pipeline did not answer in time (is the machine saturated?): {late} answers after "
        f"SLO + 20 ms; {got}")
    # a flagged call meets the straggler's stall: answered by the others, the straggler named missing
    assert got["flagged_answered"] >= 0.9 * CALLS * SHARE, got
    assert got["flagged_naming_straggler"] == got["flagged_answered"], got
    # never refused at the admission limit, and the limit not cut by the cutoff's answers.
    # Reading them as overload cuts the limit once per window of answers, down to its floor;
    # two callers fit under the floor, so the limit is the check that tells
    assert not [r for r in got["refusal_reasons"] if "at its limit" in r], got
    assert limit >= 2 * GatewaySettings().admission_floor, (limit, got)


def test_requests_expiring_in_the_batchers_queue_cut_the_limit_until_callers_are_refused(settings, tmp_path):
    # the one model takes 150 ms on every call; calls that allow it 100 ms cannot make their
    # deadline, and a batcher that has timed the model drops each one at once, so the selector
    # answers within milliseconds with the default. Those quick defaults are a pipeline behind,
    # as much as late answers are: the gateway must admit fewer calls
    models = [{"name": "slow", "path": str(make_stalling_model(tmp_path / "models", "slow", 150.0)),
               "batch_delay_ms": 1}]
    up, url = _up(settings, tmp_path, {"name": "queue", "policy": "single", "slo_ms": 2000.0, "default_output": -1,
                                       "models": ["slow"]}, models)
    try:
        rng = np.random.default_rng(4)

        def answered() -> bool:  # the worker has joined: a call with time enough gets the model's answer
            r = httpx.post(f"{url}/v1/apps/queue/predict", json={"input": flagged_input(1, 0.0, rng)[0]}, timeout=10)
            return r.status_code == 200 and not r.json()["default"]

        wait_until(answered, 120, "an answer from the model")
        # one caller with the app's 2 s: every call answered by the model, which the batcher times
        timed = closed_loop(url, "queue", callers=1, calls_each=8, stall_share=1.0, seed=5)
        initial = _limit(url)
        calls = closed_loop(url, "queue", callers=8, calls_each=20, stall_share=1.0, slo_ms=100.0, seed=6)
        limit = _limit(url)
    finally:
        up.stop(90)
    assert all(c.status == 200 and not c.body["default"] for c in timed), [c.body for c in timed]
    assert all(c.status in (200, 503) for c in calls), [(c.status, c.body) for c in calls if c.status not in (200, 503)]
    reasons = Counter(c.body.get("default_reason") for c in calls if c.status == 200)
    refused = refusal_reasons(c.detail for c in calls if c.status == 503)
    assert reasons[EXPIRED_IN_QUEUE] >= 20, (reasons, refused)
    # the gateway read them as overload: its limit fell below the callers, who were refused
    assert limit < min(initial, 8), (initial, limit, reasons, refused)
    assert any("at its limit" in r for r in refused), (refused, reasons)
