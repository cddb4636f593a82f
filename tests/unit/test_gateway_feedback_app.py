"""Feedback for a query answered for another app is refused at the gateway (409) when the
stored predictions say whose query it is: a key allowed one app must not teach another."""

from __future__ import annotations

import asyncio
import json

from fastapi.testclient import TestClient

from clipstream.redisclient import stored_predictions_key
from frontend.feedback import STORED_HEAD_BYTES, stored_app
from registry.outputs import stored_answer
from tests.unit.test_gateway_http import GOOD, FakeBus, answer, make_app


class FakeRedis:
    """GETRANGE over stored values, as redis.asyncio answers it (bytes; b'' for a missing key)."""

    def __init__(self, values: dict[str, bytes]) -> None:
        self.values = values
        self.reads: list[tuple[str, int, int]] = []

    async def getrange(self, key: str, start: int, end: int) -> bytes:
        self.reads.append((key, start, end))
        return self.values.get(key, b"")[start:end + 1]


def _store(**apps: str) -> FakeRedis:
    many = {f"m{i}": {"value": "dog", "scores": [0.5] * 200} for i in range(8)}  # far past the head
    return FakeRedis({stored_predictions_key(qid): json.dumps(stored_answer(app, "ctx", {"value": "dog"}, many))
                      .encode() for qid, app in apps.items()})


def test_feedback_for_another_apps_query_is_409_without_naming_that_app_and_not_published() -> None:
    bus = FakeBus(answer)
    app = make_app(bus)
    redis = _store(**{"q-big": "big", "q-pets": "pets"})
    app.state.gateway.stored = lambda qid: stored_app(redis, qid)
    with TestClient(app) as c:
        r = c.post("/v1/apps/pets/feedback", json={"query_id": "q-big", "label": "dog"})
        assert r.status_code == 409 and "another app, not 'pets'" in r.json()["detail"]
        assert "app 'big'" not in r.json()["detail"]  # a key limited to pets learns nothing of the other apps
        assert bus.feedback == []
        r = c.post("/v1/apps/pets/feedback", json={"query_id": "q-pets", "label": "dog"})
        assert r.status_code == 202 and r.json() == {"accepted": True, "query_id": "q-pets"}
        r = c.post("/v1/apps/pets/feedback", json={"query_id": "q-gone", "label": "dog"})
        assert r.status_code == 202 and r.json()["applied"] is False
    assert [rec.query_id for rec, _ in bus.feedback] == ["q-pets", "q-gone"]
    assert all(end - start + 1 == STORED_HEAD_BYTES for _, start, end in redis.reads)  # never the whole record


def test_feedback_for_a_query_this_gateway_just_answered_for_another_app_is_409() -> None:
    """Its predictions may not be stored yet: the gateway's own memory of the answer says whose
    query it was, with Redis unable to say."""
    bus = FakeBus(answer)
    app = make_app(bus)
    app.state.gateway.stored = None
    with TestClient(app) as c:
        qid = c.post("/v1/apps/pets/predict", json={"input": GOOD}).json()["query_id"]
        r = c.post("/v1/apps/big/feedback", json={"query_id": qid, "label": 1})
        assert r.status_code == 409 and "another app, not 'big'" in r.json()["detail"], r.text
        r = c.post("/v1/apps/pets/feedback", json={"query_id": qid, "label": "dog"})
        assert r.status_code == 202 and r.json() == {"accepted": True, "query_id": qid}
    assert [rec.app for rec, _ in bus.feedback] == ["pets"]


def test_a_stored_record_that_does_not_say_its_app_first_counts_as_stored() -> None:
    redis = FakeRedis({stored_predictions_key("q-old"): b'{"context": null, "app": "big"}',
                       stored_predictions_key("q-cut"): b'{"app": "' + b"x" * STORED_HEAD_BYTES})
    assert asyncio.run(stored_app(redis, "q-old")) is True
    assert asyncio.run(stored_app(redis, "q-cut")) is True
    assert asyncio.run(stored_app(redis, "q-none")) is False


def test_feedback_long_after_this_gateway_answered_asks_the_store_whose_entry_may_have_expired(
        monkeypatch) -> None:
    """The gateway's memory of its answers covers the moment their predictions are being stored,
    not their time to live: later, an expired entry is told (applied: false), not a bare 202."""
    import frontend.state as gateway_state

    bus = FakeBus(answer)
    app = make_app(bus)
    redis = FakeRedis({})  # what the store holds once the entry has expired
    app.state.gateway.stored = lambda qid: stored_app(redis, qid)
    clock = [1000.0]
    monkeypatch.setattr(gateway_state, "monotonic", lambda: clock[0])
    with TestClient(app) as c:
        qid = c.post("/v1/apps/pets/predict", json={"input": GOOD}).json()["query_id"]
        r = c.post("/v1/apps/pets/feedback", json={"query_id": qid, "label": "dog"})
        assert r.status_code == 202 and "applied" not in r.json()  # just answered: on its way to the store
        assert redis.reads == []
        clock[0] += gateway_state.ANSWERED_FRESH_S + 1
        r = c.post("/v1/apps/pets/feedback", json={"query_id": qid, "label": "dog"})
        assert r.status_code == 202 and r.json()["applied"] is False and "expired" in r.json()["reason"]
        assert [key for key, _, _ in redis.reads] == [stored_predictions_key(qid)]


def test_a_stored_records_app_is_read_whatever_the_json_spacing() -> None:
    record = stored_answer("pets", None, {"value": "dog"}, {"m": {"value": "dog"}})
    redis = FakeRedis({stored_predictions_key("q-compact"): json.dumps(record, separators=(",", ":")).encode(),
                       stored_predictions_key("q-wide"): json.dumps(record, indent=2).encode()})
    assert asyncio.run(stored_app(redis, "q-compact")) == "pets"
    assert asyncio.run(stored_app(redis, "q-wide")) == "pets"


def test_a_feedback_over_the_body_limit_is_told_what_a_feedback_holds() -> None:
    bus = FakeBus(answer)
    with TestClient(make_app(bus, max_body_bytes=200)) as c:
        r = c.post("/v1/apps/pets/feedback", json={"query_id": "q" * 300, "label": "dog"})
    assert r.status_code == 413 and "a feedback is a query id and a label or a reward" in r.json()["detail"], r.text
    assert "raw bytes" not in r.json()["detail"] and bus.feedback == []
