"""Queries the selector refuses at dispatch, as the gateway and the producer would have: no
query id, a deadline before its creation or past any SLO, a responses partition that does not
exist, a dtype nobody knows; and a query already out of time, answered with a reason of its own."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from clipstream.clock import now_us
from frontend.gateway_models import MAX_SLO_MS as GATEWAY_MAX_SLO_MS
from schemas import QueryEvent, Response, Tensor, decode_as, encode
from schemas.reasons import EXPIRED_ON_ARRIVAL, NOTHING_ARRIVED
from schemas.tensor import DTYPES
from selector.checks import MAX_SLO_MS
from selector.metrics import default_reason
from tests.fakes import FakeMsg as Msg
from tests.unit.test_selector_bad_replies import _recording
from topics.catalogue import Catalogue


def _event(qid: str = "q", slo_us: int = 1_000_000, **over: Any) -> QueryEvent:
    now = now_us()
    ev = QueryEvent(query_id=qid, app="app", context=None, input=Tensor.of(np.zeros(2, np.float32)),
                    created_us=now, deadline_us=now + slo_us)
    return dataclasses.replace(ev, **over)


def _msg(cat: Catalogue, ev: QueryEvent, offset: int = 0) -> Msg:
    return Msg(encode(ev), cat.queries.name, partition=1, offset=offset)


def _answers(replies: Any) -> list[Response]:
    return [decode_as(Response, v) for _, v in replies.sent]


def test_a_query_without_an_id_is_a_dead_letter_with_no_response_and_its_offset_moves_on() -> None:
    sel, requests, replies, cat, dead = _recording()
    sel.handle([_msg(cat, _event(""), offset=4)])
    assert requests.sent == [] and replies.sent == []  # a Response keyed b'' would reach nobody
    (letter,) = dead
    assert "empty query_id" in letter["reason"] and letter["msg"].offset() == 4
    assert sel.offsets.take() == {1: 5}  # nothing to wait for: the partition's commits go on


def test_a_deadline_past_the_longest_slo_is_a_dead_letter_and_a_default_naming_it() -> None:
    sel, requests, replies, cat, dead = _recording()
    sel.apps.get("app")[0].slo_ms = 50.0  # the app's own SLO is the usual short one
    slo_us = int(MAX_SLO_MS * 1000) + 1_000
    sel.dispatch(_msg(cat, _event(slo_us=slo_us)))
    assert requests.sent == []
    (r,) = _answers(replies)
    assert r.is_default and r.output == -1 and "longest SLO" in (r.default_reason or "")
    (letter,) = dead
    assert letter["query_id"] == "q" and letter["reason"] == r.default_reason
    assert f"{MAX_SLO_MS:g} ms" in letter["reason"]


def test_a_deadline_before_its_creation_is_a_dead_letter_not_an_expired_query() -> None:
    """A Kafka client that wrote the two stamps the wrong way round made a query no stage could
    serve: that is its mistake to hear of, not a backlog for the gateway or an operator."""
    sel, requests, replies, cat, dead = _recording()
    sel.dispatch(_msg(cat, _event(slo_us=-20_000)))
    assert requests.sent == []
    (r,) = _answers(replies)
    assert r.is_default and r.default_reason != EXPIRED_ON_ARRIVAL
    assert r.default_reason == "bad query: its deadline_us is not after its created_us (-20 ms from it)"
    (letter,) = dead
    assert letter["query_id"] == "q" and letter["reason"] == r.default_reason
    assert default_reason(r.default_reason) == "rejected"


def test_a_deadline_far_from_now_is_refused_though_near_its_creation() -> None:
    """A sender whose clock runs 70 s ahead stamps a creation still to come: the span it claims
    is short, but every stage would hold the query past the longest SLO."""
    sel, requests, replies, cat, dead = _recording()
    sel.apps.get("app")[0].slo_ms = 50.0
    ahead = now_us() + 70_000_000
    sel.dispatch(_msg(cat, _event(created_us=ahead, deadline_us=ahead + 200_000)))
    assert requests.sent == []
    (r,) = _answers(replies)
    assert r.is_default and "from now, beyond the longest SLO" in (r.default_reason or "")
    assert "sender's clock" in (r.default_reason or "")
    (letter,) = dead
    assert letter["reason"] == r.default_reason


def test_an_app_registered_with_a_longer_slo_may_use_it() -> None:
    """The gateway and the producer ask with the app's own SLO when the caller names none."""
    sel, requests, replies, cat, dead = _recording()
    app, policy, outputs = sel.apps.get("app")
    app.slo_ms = 2 * MAX_SLO_MS
    sel.dispatch(_msg(cat, _event(slo_us=int(1.5 * MAX_SLO_MS * 1000))))
    assert dead == [] and replies.sent == [] and len(requests.sent) == 1
    sel.dispatch(_msg(cat, _event("q2", slo_us=int(2.5 * MAX_SLO_MS * 1000))))
    assert len(requests.sent) == 1 and f"{2 * MAX_SLO_MS:g} ms" in dead[0]["reason"]


def test_the_selectors_slo_bound_is_the_gateways() -> None:
    assert MAX_SLO_MS == GATEWAY_MAX_SLO_MS


def test_a_query_out_of_time_on_arrival_has_its_own_reason_and_asks_no_model() -> None:
    sel, requests, replies, cat, dead = _recording()
    now = now_us()
    sel.dispatch(_msg(cat, _event(created_us=now - 1_000_000, deadline_us=now - 5_000)))
    assert requests.sent == [] and dead == [] and "q" not in sel.join
    (r,) = _answers(replies)  # at once, not at the next timer
    assert r.is_default and r.output == -1 and r.default_reason == EXPIRED_ON_ARRIVAL != NOTHING_ARRIVED
    assert default_reason(r.default_reason) == "expired_on_arrival"
    assert sel.metrics.registry.get_sample_value(
        "clipstream_selector_defaults_total", {"app": "app", "reason": "expired_on_arrival"}) == 1
    assert sel.metrics.registry.get_sample_value("clipstream_selector_queries_total", {"app": "app"}) == 1


def test_a_reply_partition_the_responses_topic_lacks_is_refused_and_answered_there() -> None:
    sel, requests, replies, cat, dead = _recording()
    parts = cat.responses.partitions
    sel.dispatch(_msg(cat, _event(reply_topic=cat.responses.name, reply_partition=parts + 95)))
    assert requests.sent == []
    (r,) = _answers(replies)
    assert replies.sent[0][0] == cat.responses.name and "partition" not in replies.options[0]
    assert r.is_default and f"reply_partition {parts + 95}" in (r.default_reason or "")
    (letter,) = dead
    assert letter["query_id"] == "q" and f"{parts} partitions" in letter["reason"]
    sel.dispatch(_msg(cat, _event("q-last", reply_topic=cat.responses.name, reply_partition=parts - 1)))
    assert len(requests.sent) == 1 and len(dead) == 1  # its last partition is served


def test_an_unknown_dtype_is_refused_with_the_names_accepted() -> None:
    sel, requests, replies, cat, dead = _recording()
    ev = _event()
    ev = dataclasses.replace(ev, input=Tensor(dtype=">f4", shape=[2], data=b"\x00" * 8))
    sel.dispatch(_msg(cat, ev))
    assert requests.sent == []
    (letter,) = dead
    assert "unknown tensor dtype '>f4'" in letter["reason"]
    assert all(repr(name) in letter["reason"] for name in DTYPES)
    (r,) = _answers(replies)
    assert r.is_default and r.default_reason == letter["reason"]
