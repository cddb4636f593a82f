"""Hostile HTTP input at the gateway's ASGI app, no broker: slow and oversized bodies, per-app
keys, feedback labels of the wrong type, feedback for a query whose predictions are gone."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi.testclient import TestClient

from frontend.gateway_http import app_of_path, key_apps
from tests.unit.test_gateway_http import GOOD, FakeBus, answer, make_app


async def _call(app: Any, path: str, chunks: list[tuple[float, bytes]], headers: dict[str, str] | None = None,
                probe: Any = None) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One POST straight through ASGI: ``chunks`` are (seconds to wait first, bytes), sent as
    a body without Content-Length unless ``headers`` gives one."""
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": raw, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    pending = list(chunks)
    out: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        if not pending:
            await asyncio.sleep(3600)
        wait, data = pending.pop(0)
        await asyncio.sleep(wait)
        if probe is not None:
            probe()
        return {"type": "http.request", "body": data, "more_body": bool(pending)}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
        else:
            out["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return out["status"], out["headers"], json.loads(out["body"])


def test_a_trickled_body_is_a_408_and_holds_no_admission_slot() -> None:
    app = make_app(FakeBus(answer), body_timeout_s=0.3)
    state = app.state.gateway
    seen: list[int] = []
    body = json.dumps({"input": GOOD}).encode()
    trickle = [(0.0, body[:5])] + [(0.1, body[5 + i:6 + i]) for i in range(20)]

    async def run() -> tuple[int, dict[str, str], dict[str, Any]]:
        return await _call(app, "/v1/apps/pets/predict", trickle, probe=lambda: seen.append(state.inflight))

    status, headers, detail = asyncio.run(run())
    assert status == 408 and "0.3 s" in detail["detail"] and headers.get("connection") == "close"
    assert seen and max(seen) == 0  # no slot was taken while the body trickled in
    assert state.inflight == 0


def test_a_body_over_the_limit_is_a_413_with_or_without_content_length() -> None:
    app = make_app(FakeBus(answer), max_body_bytes=1000)
    big = b"[" + b"1," * 2000 + b"1]"
    chunked = [(0.0, big[i:i + 512]) for i in range(0, len(big), 512)]
    status, _, detail = asyncio.run(_call(app, "/v1/apps/pets/predict", chunked))
    assert status == 413 and "limit of 1000 bytes" in detail["detail"]
    declared = {"content-length": str(len(big))}
    status, _, detail = asyncio.run(_call(app, "/v1/apps/pets/feedback", chunked, declared))
    assert status == 413 and f"body of {len(big)} bytes" in detail["detail"]


def test_per_app_keys_reach_only_their_apps_and_global_keys_still_work() -> None:
    with TestClient(make_app(FakeBus(answer), api_keys=("root",), app_keys={"pk": ("pets",)})) as c:
        def post(app: str, key: str | None) -> int:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return c.post(f"/v1/apps/{app}/predict", json={"input": GOOD}, headers=headers).status_code
        assert post("pets", "pk") == 200 and post("pets", "root") == 200
        r = c.post("/v1/apps/big/predict", json={"input": GOOD}, headers={"X-API-Key": "pk"})
        assert r.status_code == 403 and "'big'" in r.json()["detail"]
        assert post("pets", "nope") == 401 and post("pets", None) == 401
        assert c.get("/metrics", headers={"X-API-Key": "pk"}).status_code == 403
        assert c.get("/readyz", headers={"X-API-Key": "pk"}).status_code == 200
        assert c.get("/healthz").status_code == 200
        # the API's two documentation pages alike: every key may read what the routes are
        assert [c.get(page, headers={"X-API-Key": "pk"}).status_code for page in ("/docs", "/redoc")] == [200, 200]


def test_key_helpers() -> None:
    assert app_of_path("/v1/apps/a-1/feedback") == "a-1" and app_of_path("/v1/apps//predict") is None
    assert app_of_path("/readyz") is None
    assert key_apps("k", {"k": ["a"], "j": ["b"]}) == frozenset({"a"}) and key_apps("x", {"k": ["a"]}) is None


def test_feedback_label_of_the_wrong_type_is_422() -> None:
    bus = FakeBus(answer)
    with TestClient(make_app(bus)) as c:
        for bad in ("horse", 3, True):  # pets answers class scores over ("cat", "dog")
            r = c.post("/v1/apps/pets/feedback", json={"query_id": "q", "label": bad})
            assert r.status_code == 422 and "not one of the app's labels" in r.json()["detail"], bad
        # big answers a regression value: text is not a number
        r = c.post("/v1/apps/big/feedback", json={"query_id": "q", "label": "seven"})
        assert r.status_code == 422 and "finite number" in r.json()["detail"]
        assert c.post("/v1/apps/big/feedback", json={"query_id": "q", "label": 7.5}).status_code == 202
        assert c.post("/v1/apps/pets/feedback", json={"query_id": "q", "label": "cat"}).status_code == 202
    assert len(bus.feedback) == 2


def test_a_misspelt_field_of_a_predict_body_is_a_422_naming_the_field_meant() -> None:
    """`slo` for `slo_ms` is refused, not dropped with the app's SLO used instead; nothing is
    sent for it, and the right body is answered."""
    bus = FakeBus(answer)
    with TestClient(make_app(bus)) as c:
        r = c.post("/v1/apps/pets/predict", json={"input": GOOD, "slo": 5})
        assert r.status_code == 422, r.text
        assert r.json()["detail"] == ("slo: not a field of this body (did you mean 'slo_ms'?); it holds input, "
                                      "context, slo_ms")
        assert bus.queries == [] and bus.requests == []
        assert c.post("/v1/apps/pets/predict", json={"input": GOOD, "slo_ms": 500}).status_code == 200
        sent = (len(bus.queries), len(bus.requests))
        raw = c.post("/v1/apps/pets/predict?slo=5", content=b"\0" * 12, headers={"content-type": "application/octet-stream"})
        assert raw.status_code == 422 and "?slo=: not a parameter of a raw-bytes predict (did you mean 'slo_ms'?)" \
            in raw.json()["detail"], raw.text
        fb = c.post("/v1/apps/pets/feedback", json={"query_id": "q", "lable": "cat"})
        assert fb.status_code == 422 and fb.json()["detail"].startswith("lable: not a field of this body (did you mean "
                                                                        "'label'?)"), fb.text
        assert (len(bus.queries), len(bus.requests)) == sent and bus.feedback == []


def test_feedback_for_a_query_with_no_stored_predictions_is_202_with_the_reason() -> None:
    app = make_app(FakeBus(answer))
    known = {"q-known"}

    async def stored(qid: str) -> bool:
        return qid in known

    app.state.gateway.stored = stored
    with TestClient(app) as c:
        r = c.post("/v1/apps/pets/feedback", json={"query_id": "q-gone", "label": "cat"})
        assert r.status_code == 202 and r.json()["applied"] is False and "dead-lettered" in r.json()["reason"]
        r = c.post("/v1/apps/pets/feedback", json={"query_id": "q-known", "label": "cat"})
        assert r.status_code == 202 and r.json() == {"accepted": True, "query_id": "q-known"}


def test_feedback_right_after_an_answer_is_not_told_the_predictions_are_missing() -> None:
    """The predictions of a query this gateway just answered are still on their way to the
    store (written every few hundred ms): its feedback finds them soon, so no `applied: false`."""
    app = make_app(FakeBus(answer))

    async def stored(qid: str) -> bool:
        return False  # not in the store yet

    app.state.gateway.stored = stored
    with TestClient(app) as c:
        qid = c.post("/v1/apps/pets/predict", json={"input": GOOD}).json()["query_id"]
        r = c.post("/v1/apps/pets/feedback", json={"query_id": qid, "label": "cat"})
        assert r.status_code == 202 and r.json() == {"accepted": True, "query_id": qid}
        r = c.post("/v1/apps/pets/feedback", json={"query_id": "q-never-answered-here", "label": "cat"})
        assert r.status_code == 202 and r.json()["applied"] is False
