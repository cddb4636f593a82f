"""Readiness from the workers' word (``clipstream.loaded``): fresh words of loaded replicas make
a model ready, a failure to load says why, and stale words count for nothing."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fastapi.testclient import TestClient
from redis.exceptions import ConnectionError as RedisConnectionError

from clipstream.loaded import FRESH_S, commands, devices, key_of, rollout, unready, word
from tests.unit.test_gateway_http import FakeBus, make_app

NOW = 1_000_000.0


def test_a_fresh_loaded_replica_makes_the_model_ready_whatever_else_failed() -> None:
    fields = {b"2:0": word(False, NOW - 5, "FileNotFoundError: weights.bin"), b"1:0": word(True, NOW - 5)}
    assert unready("m", fields, NOW) is None  # version 1 serves while version 2 fails to load


def test_a_failure_to_load_is_the_reason_and_the_latest_one_is_given() -> None:
    fields = {"1:0": word(False, NOW - 50, "old reason"), "1:1": word(False, NOW - 2, "ValueError: bad shape")}
    assert unready("m", fields, NOW) == "model m version 1 replica 1 did not load: ValueError: bad shape"
    old = {"1:0": word(False, NOW - 95, "ValueError: bad shape")}  # said long ago: its age is given
    assert unready("m", old, NOW) == "model m version 1 replica 0 did not load, 95 s ago: ValueError: bad shape"
    stale = {"1:0": word(True, NOW - FRESH_S - 1)}  # a worker killed outright: its word runs out
    assert unready("m", stale, NOW) == "model m: no worker has said it has the model loaded"
    assert unready("m", {}, NOW) == "model m: no worker has said it has the model loaded"
    assert unready("m", {"1:0": b"not json"}, NOW) == "model m: no worker has said it has the model loaded"


def test_the_devices_are_those_of_the_fresh_replicas_that_have_a_version_loaded() -> None:
    fields = {b"2:0": word(True, NOW - 5, device="cuda"), b"2:1": word(True, NOW - 5, device="cpu"),
              b"2:2": word(True, NOW - 5, device="cuda"), b"2:3": word(True, NOW - FRESH_S - 1, device="tpu"),
              b"1:0": word(True, NOW - 5, device="npu"), b"2:4": word(False, NOW - 5, "OOM", device="xpu"),
              b"2:5": word(True, NOW - 5)}  # a worker that names no device
    assert devices(fields, NOW) == ["cpu", "cuda", "npu"]  # version 1 still serves beside version 2
    assert devices({"-:0": word(True, NOW, device="cpu")}, NOW) == ["cpu"]
    assert devices({"2:0": word(True, NOW - FRESH_S - 1, device="cpu")}, NOW) == []


def test_the_commands_keep_one_field_per_version_and_replica() -> None:
    said = word(True, NOW)
    assert commands("t.", "m", "3", 1, said) == [("HSET", "cs:loaded:t.m", "3:1", said),
                                                ("EXPIRE", "cs:loaded:t.m", "3600")]
    assert commands("t.", "m", None, 0, None) == [("HDEL", "cs:loaded:t.m", "-:0")]
    assert json.loads(word(False, NOW, "x" * 500))["reason"] == "x" * 500  # under REASON_CHARS: whole


@pytest.mark.parametrize("fields, status, reason", [
    ({"1:0": "loaded"}, 200, None),
    ({"1:0": "failed"}, 503, "model m1 version 1 replica 0 did not load: OSError: no GPU"),
    ({}, 503, "model m1: no worker has said it has the model loaded"),
    (None, 200, None),  # Redis away: not known, so ready
])
def test_the_apps_readiness_reads_its_models_workers(fields: dict | None, status: int, reason: str | None) -> None:
    import time

    words = {"loaded": word(True, time.time()), "failed": word(False, time.time(), "OSError: no GPU")}

    async def loaded(model: str) -> dict:
        await asyncio.sleep(0)
        if fields is None:
            raise RedisConnectionError("Redis is away")
        return {k: words[v] for k, v in fields.items()} if model == "m1" else {}

    with TestClient(make_app(FakeBus(None))) as c:
        c.app.state.gateway.loaded = loaded
        r = c.get("/v2/models/pets/ready")
    assert r.status_code == status and r.json().get("reason") == reason, r.text


def test_a_default_for_a_model_not_loaded_says_why_and_cuts_no_admission() -> None:
    import time

    async def loaded(model: str) -> dict:
        return {"1:0": word(False, time.time(), "FileNotFoundError: weights.bin")}

    with TestClient(make_app(FakeBus(None))) as c:  # nothing answers
        c.app.state.gateway.loaded = loaded
        answers = [c.post("/v1/apps/pets/predict", json={"input": [[0.0] * 3] * 2}).json() for _ in range(12)]
        metrics = c.get("/metrics").text
    # the first default does not wait on Redis: it starts the read that the next ones find
    assert {a["default_reason"] for a in answers[1:]} == {
        "no answer reached the gateway by the deadline: model m1 version 1 replica 0 did not load: "
        "FileNotFoundError: weights.bin"}
    assert 'clipstream_gateway_admission_cuts_total{cause="late"}' not in metrics
    assert 'clipstream_gateway_defaults_total{source="not_loaded"} 11.0' in metrics


def test_a_rollout_counts_the_new_versions_fresh_replicas_and_the_failures_since_it_began() -> None:
    fields = {b"2:0": word(True, NOW - 1), b"2:1": word(True, NOW - FRESH_S - 1), b"1:1": word(True, NOW - 1),
              b"2:2": word(False, NOW - 60, "an earlier attempt")}
    assert rollout(fields, "2", 3, NOW, since_s=NOW - 10) == ([0], None)  # 1 is stale, 2 failed before
    fields[b"2:1"] = word(True, NOW)
    fields[b"2:2"] = word(False, NOW - 2, "ImportError: xgb")
    assert rollout(fields, "2", 3, NOW, since_s=NOW - 10) == ([0, 1], "replica 2 did not load it: ImportError: xgb")
    fields[b"2:2"] = word(True, NOW)  # loaded after all, when its worker was restarted
    assert rollout(fields, "2", 3, NOW, since_s=NOW - 10) == ([0, 1, 2], None)
    assert rollout({"2:0": b"not json"}, "2", 1, NOW, since_s=NOW - 10) == ([], None)


def test_an_earlier_versions_failure_explains_nothing_once_the_registry_moved_on() -> None:
    fields = {"4:0": word(False, NOW - 5, "ImportError: gone"), "1:0": word(True, NOW - FRESH_S - 1)}
    assert unready("m", fields, NOW) == "model m version 4 replica 0 did not load: ImportError: gone"
    assert unready("m", fields, NOW, "1") == "model m: no worker has said it has the model loaded"
    assert unready("m", fields, NOW, "4") == "model m version 4 replica 0 did not load: ImportError: gone"


def test_a_groups_failed_worker_leaves_the_word_of_a_member_another_worker_serves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 2 of member a failed to load in the group's new worker, which also holds member
    b's unchanged version 1. The worker that serves says b 1 is loaded on replica 1: that word
    stays, or readiness would say b is down while it answers. a's failure is said."""
    import workers.loaded as worker_loaded
    from clipstream.settings import Settings

    now = time.time()
    prefix = Settings().topic_prefix
    hashes = {key_of(prefix, "b"): {"1:1": word(True, now - 2)}}

    class Pipe:
        def __init__(self) -> None:
            self.read: list[str | None] = []

        def hget(self, key: str, field: str) -> None:
            self.read.append(hashes.get(key, {}).get(field))

        def execute_command(self, *command: str) -> None:
            if command[0] == "HSET":
                hashes.setdefault(command[1], {})[command[2]] = command[3]

        def execute(self) -> list[str | None]:
            return self.read

    class Redis:
        def pipeline(self, transaction: bool = True) -> Pipe:
            return Pipe()

        def close(self) -> None:
            pass

    monkeypatch.setattr(worker_loaded, "sync_client", lambda settings: Redis())
    worker_loaded.say_not_loaded(Settings(), [("a", "2"), ("b", "1")], 1, "a: weights.bin is missing")
    assert unready("b", hashes[key_of(prefix, "b")], time.time()) is None
    assert "weights.bin" in (unready("a", hashes[key_of(prefix, "a")], time.time(), "2") or "")


def test_a_long_reason_is_cut_and_says_it_was() -> None:
    from clipstream.loaded import REASON_CHARS

    long = "model.yaml: " + "word " * 200
    said = json.loads(word(False, NOW, long))["reason"]
    assert len(said) == REASON_CHARS and said.endswith(" ...") and said.startswith("model.yaml: word")
    assert json.loads(word(False, NOW, "short"))["reason"] == "short"
