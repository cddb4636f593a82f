"""The bench's topic tap and its handlers, with typed records (pure: a fake consumer, no broker)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from bench import breakdown, load
from bench.batching.runner import _observer
from bench.efficiency import BatchStatsTap
from bench.join import JoinTap
from bench.tap import Tap
from schemas import BatchStats, Prediction, Predictions, QueryEvent, Response, Tensor, encode

T = Tensor.of(np.array([0.1, 0.9], np.float32))


def _prediction(qid: str, model: str = "m", **trace: int) -> Prediction:
    return Prediction(query_id=qid, model=model, version="1", status="ok", output=T, trace=dict(trace))


def _response(qid: str, **trace: int) -> Response:
    return Response(query_id=qid, app="a", output=1, scores=None, labels=None, confidence=0.9, is_default=False,
                    default_reason=None, answered=["m"], missing=["n"], created_us=1, deadline_us=50,
                    trace=dict(trace))


def _stats(model: str = "m") -> BatchStats:
    return BatchStats(batch_id="b", model=model, replica=0, batch_size=4, service_us=900, queue_wait_us=10,
                      errors=0, worker_id="w", created_us=123)


class _Msg:
    def __init__(self, value: bytes, error: Any = None, ts: tuple[int, int] = (2, 7)) -> None:
        self._value, self._error, self._ts = value, error, ts

    def value(self) -> bytes:
        return self._value

    def error(self) -> Any:
        return self._error

    def timestamp(self) -> tuple[int, int]:
        return self._ts


class _Consumer:
    """One fetch: ``poll`` hands the first message, ``consume`` the rest; then nothing."""

    def __init__(self, msgs: list[_Msg]) -> None:
        self.msgs = list(msgs)

    def poll(self, timeout: float) -> _Msg | None:
        return self.msgs.pop(0) if self.msgs else None

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        rest, self.msgs = self.msgs[:n], self.msgs[n:]
        return rest


def test_the_tap_hands_typed_records_and_skips_errors_and_foreign_bytes() -> None:
    tap = Tap.__new__(Tap)
    good = [_prediction("q1"), _response("q1", joined=5)]
    tap.consumer = _Consumer([_Msg(encode(good[0])), _Msg(b"not avro"), _Msg(encode(_stats()), error="boom"),
                              _Msg(encode(good[1]))])
    tap._stop, tap._thread = threading.Event(), None
    got: list[tuple[Any, Any, int]] = []
    done = threading.Event()

    def on(rec: Any, msg: Any, arrived: int) -> None:
        got.append((rec, msg, arrived))
        if len(got) == 2:
            done.set()

    tap.start(on)
    assert done.wait(5)
    tap.stop()
    assert [r for r, _, _ in got] == good
    assert isinstance(got[0][0], Prediction) and isinstance(got[1][0], Response)
    assert got[0][2] == got[1][2] > 0  # one fetch: one arrival time


def test_the_batching_observer_takes_its_models_predictions_and_batch_stats() -> None:
    obs: list[Any] = []
    batches: list[tuple[int, int, int]] = []
    on = _observer("m", obs, batches)
    preds = Predictions(selector_partition=0, items=[
        _prediction("q1", produced=10, batcher_in=11, batched=12, worker_in=13, worker_out=14),
        _prediction("q2", model="other", produced=10)])
    on(preds, _Msg(b""), 100)
    on(_stats(), _Msg(b""), 100)
    on(_stats("other"), _Msg(b""), 100)
    on(_response("q1"), _Msg(b""), 100)
    assert len(obs) == 1
    o = obs[0]
    assert (o.status, o.produced_us, o.out_us, o.consume_us, o.kafka_ts_us) == ("ok", 10, 14, 100, 7000)
    assert batches == [(123, 4, 900)]


def test_the_join_tap_collects_worker_out_stamps_and_responses() -> None:
    jt = JoinTap.__new__(JoinTap)
    jt.worker_out, jt.responses = {}, {}
    jt._on(Predictions(0, [_prediction("q1", worker_out=7), _prediction("q1", worker_out=9),
                           _prediction("q2")]), None, 0)
    resp = _response("q1", joined=20)
    jt._on(resp, None, 0)
    jt._on(_stats(), None, 0)
    assert jt.worker_out == {"q1": [7, 9]}
    assert jt.responses == {"q1": resp}


def test_the_efficiency_tap_keeps_batch_stats_rows() -> None:
    bt = BatchStatsTap.__new__(BatchStatsTap)
    bt.rows = []
    bt._on(_stats(), None, 0)
    bt._on(_response("q1"), None, 0)
    assert bt.rows == [(123, 900, 4)]


def test_the_breakdown_reply_tap_copies_each_responses_trace(monkeypatch: Any) -> None:
    handlers: list[Any] = []

    class FakeTap:
        def __init__(self, *a: Any, **k: Any) -> None:
            pass

        def start(self, on: Any) -> "FakeTap":
            handlers.append(on)
            return self

    monkeypatch.setattr(breakdown, "Tap", FakeTap)
    traces: dict[str, dict[str, int]] = {}
    breakdown.reply_tap(_settings(), "gw0", traces)
    resp = _response("q1", joined=20)
    handlers[0](resp, None, 0)
    handlers[0](_stats(), None, 0)
    # a one-model app's predictions come to the same topic, one trace per query
    handlers[0](Predictions(0, [Prediction("q2", "m", "1", "ok", None, None, {"worker_out": 9})]), None, 0)
    assert traces == {"q1": {"joined": 20}, "q2": {"worker_out": 9}}
    traces["q1"]["_x"] = 1
    assert "_x" not in resp.trace  # a copy: the bench adds its own keys


def test_load_tensors_are_tensor_records_that_a_query_event_carries() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ts = load.tensors(x)
    assert all(isinstance(t, Tensor) for t in ts)
    np.testing.assert_array_equal(ts[1].array(), x[1])
    ev = QueryEvent(query_id="q", app="a", context=None, input=ts[0], created_us=1, deadline_us=2)
    assert encode(ev)[:2] == b"\xc3\x01"


def _settings() -> Any:
    from clipstream.settings import Settings

    return Settings()
