"""Where a selector may answer: a query naming a topic that takes no Responses is a dead letter
answered on ``responses``; a Response its topic keeps refusing is given up, so that the
commits of its partition move on; an empty output tensor fails its model alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

from clipstream.clock import now_us
from schemas import ModelRequest, Prediction, Predictions, QueryEvent, Response, Tensor, decode_as, encode
from selector.replies import REPLY_SENDS
from selector.service import Selector
from tests.fakes import FakeMsg as Msg
from tests.unit.test_selector_hopeless import _selector
from topics.catalogue import Catalogue
from topics.metrics import render


def _recording() -> tuple[Selector, Any, Any, Catalogue, list[dict[str, Any]]]:
    sel, requests, replies, cat = _selector()
    dead: list[dict[str, Any]] = []
    sel.dead = SimpleNamespace(send=lambda **kw: dead.append(kw))  # type: ignore[assignment]
    return sel, requests, replies, cat, dead


def _query(cat: Catalogue, qid: str, reply_topic: str | None, reply_partition: int | None = 0,
           offset: int = 0) -> Msg:
    ev = QueryEvent(query_id=qid, app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                    created_us=now_us(), deadline_us=now_us() + 1_000_000, reply_topic=reply_topic,
                    reply_partition=reply_partition)
    return Msg(encode(ev), cat.queries.name, offset=offset)


@pytest.mark.parametrize("where", ["registry", "requests.m1", "elsewhere"])
def test_a_query_naming_a_topic_that_takes_no_responses_is_a_dead_letter_answered_on_responses(where: str) -> None:
    sel, requests, replies, cat, dead = _recording()
    topic = cat.registry.name if where == "registry" else cat.prefix + where
    sel.dispatch(_query(cat, "q", topic))
    assert requests.sent == []  # no model is asked for an answer that could not be delivered
    ((to, value),) = replies.sent
    r = decode_as(Response, value)
    assert to == cat.responses.name and "partition" not in replies.options[0]
    assert r.is_default and r.output == -1 and repr(topic) in (r.default_reason or "")
    (letter,) = dead
    assert letter["query_id"] == "q" and "reply_topic" in letter["reason"] and repr(topic) in letter["reason"]


def test_a_negative_reply_partition_is_refused_too() -> None:
    sel, requests, replies, cat, dead = _recording()
    sel.dispatch(_query(cat, "q", cat.replies("gw1").name, reply_partition=-3))
    assert requests.sent == [] and [t for t, _ in replies.sent] == [cat.responses.name]
    assert "reply_partition -3" in dead[0]["reason"]


@pytest.mark.parametrize("reply", ["gateway", "responses", None])
def test_a_reply_topic_or_responses_is_served(reply: str | None) -> None:
    sel, requests, replies, cat, dead = _recording()
    topic = {"gateway": cat.replies("gw1").name, "responses": cat.responses.name, None: None}[reply]
    sel.dispatch(_query(cat, "q", topic))
    (request,) = [decode_as(ModelRequest, v) for _, v in requests.sent]
    assert request.query_id == "q" and dead == [] and replies.sent == []


def _refused(sel: Selector, replies: Any, i: int) -> None:
    """The delivery report of the ``i``-th Response produced: not taken."""
    report = replies.options[i]["on_delivery"]
    report(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), None)


def test_a_response_its_topic_keeps_refusing_is_given_up_and_its_offset_may_be_committed() -> None:
    sel, _, replies, cat, dead = _recording()
    gone = cat.replies("gone").name
    sel.offsets.read(0, 7, "q")
    sel.dispatch(_query(cat, "q", gone, offset=7))
    sel.answer(sel.join.get("q"))  # nothing arrived: a default, to the gateway's topic
    assert [t for t, _ in replies.sent] == [gone]
    for i in range(REPLY_SENDS - 1):
        _refused(sel, replies, i)
        assert len(replies.sent) == i + 2 and sel.offsets.take() == {}  # sent again, still open
    assert dead == []
    _refused(sel, replies, REPLY_SENDS - 1)
    assert len(replies.sent) == REPLY_SENDS  # not sent a fourth time
    assert sel.offsets.take() == {0: 8}  # the partition's commits move past it
    (letter,) = dead
    assert letter["query_id"] == "q" and gone in letter["reason"]
    assert decode_as(Response, letter["payload"]).query_id == "q"


def test_a_response_to_a_partition_its_topic_lacks_is_given_up_at_once_naming_its_querys_record() -> None:
    sel, _, _, cat, dead = _recording()

    class NoSuchPartition:
        def produce(self, topic: str, value: bytes, **kw: Any) -> None:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))

        def poll(self, timeout: float) -> None:
            return None

    sel.reply_producer = NoSuchPartition()  # type: ignore[assignment]
    sel.offsets.read(0, 0, "q")
    sel.dispatch(_query(cat, "q", cat.replies("gw1").name, reply_partition=5))
    sel.answer(sel.join.get("q"))
    assert sel.offsets.take() == {0: 1} and dead[0]["query_id"] == "q"
    assert dead[0]["source"] == (cat.queries.name, 0, 0)  # the query's own record, to look into


def test_an_empty_output_fails_its_model_and_the_rest_of_the_record_is_joined() -> None:
    sel, _, replies, cat, _ = _recording()
    for qid in ("q1", "q2"):
        sel.dispatch(_query(cat, qid, None))
    items = [Prediction(q, m, None, "ok", Tensor.of(out), None, {})
             for q, outs in (("q1", (np.zeros(0, np.float32), np.array(1, np.int64))),
                             ("q2", (np.array(2, np.int64), np.array(2, np.int64))))
             for m, out in zip(("m1", "m2"), outs)]
    sel.collect(Msg(encode(Predictions(0, items)), cat.predictions.name))
    answers = {r.query_id: r for r in (decode_as(Response, v) for _, v in replies.sent)}
    assert set(answers) == {"q1", "q2"}  # one bad tensor lost neither query
    assert answers["q2"].answered == ["m1", "m2"] and not answers["q2"].is_default
    assert answers["q1"].answered == ["m2"] and answers["q1"].missing == ["m1"]
    # a model missing from an answer that no default shows: counted as failed, not as a straggler
    shown = render(sel.metrics.registry).decode()
    assert 'clipstream_selector_failed_total{app="app",model="m1"} 1.0' in shown, shown
    assert "clipstream_selector_stragglers_total{" not in shown


def test_a_request_its_batcher_gave_up_counts_as_a_straggler_not_a_failure() -> None:
    sel, _, replies, cat, _ = _recording()
    sel.dispatch(_query(cat, "q", None))
    items = [Prediction("q", "m1", None, "expired", None, "given up before its deadline", {}),
             Prediction("q", "m2", None, "ok", Tensor.of(np.array(2, np.int64)), None, {})]
    sel.collect(Msg(encode(Predictions(0, items)), cat.predictions.name))
    answer = decode_as(Response, replies.sent[0][1])
    assert answer.answered == ["m2"] and answer.missing == ["m1"]
    shown = render(sel.metrics.registry).decode()
    assert 'clipstream_selector_stragglers_total{app="app",model="m1"} 1.0' in shown, shown
    assert "clipstream_selector_failed_total{" not in shown
