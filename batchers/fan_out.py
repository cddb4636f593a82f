"""An ensemble's request inside a batcher process: one record names all its models (docs/design/0082).

The models this process serves take their part of it at once; each other one is passed on to
its own ``requests.<model>`` topic for the batcher that serves it, and the record is done once
every part is.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial
from typing import Any

from confluent_kafka import Producer

from batchers.offsets import RequestOffsets, Where
from batchers.outputs import Out
from schemas import ModelRequest, encode
from topics.catalogue import Catalogue, valid_name


class FanOut:
    """The fan-out half of ``BatcherService``, which sets these attributes and provides
    ``_take`` (queue one model's request) and, through ``Outputs``, ``_deadletter_record`` and
    ``_delivered``."""

    model: Any  # ModelSetup: its ``name`` is what this service serves
    siblings: dict[str, "FanOut"]
    producer: Producer
    cat: Catalogue
    counts: dict[str, int]
    offsets: RequestOffsets | None
    outbox: list[Out]
    arrived_event: asyncio.Event

    def _others(self, request: ModelRequest) -> list[str]:
        """The models a request names that this service does not serve."""
        return [name for name in request.also if name != self.model.name]

    def _fan_out(self, request: ModelRequest, names: list[str], arrival: int, where: Where,
                 value: bytes | None) -> None:
        """An ensemble's query asks its other models in the same record (docs/design/0082): the
        ones this process serves take their part here (a group all of its members' in one
        part); each other one goes on to its own topic, at the same partition, for the batcher
        that serves it. The record is done once every part is."""
        bad: list[str] = []
        parts: dict[int, tuple[FanOut, list[str]]] = {}
        for name in dict.fromkeys(names):  # each part counted once handed on: a failure leaves none open
            sibling = self.siblings.get(name)
            if sibling is not None:
                parts.setdefault(id(sibling), (sibling, []))[1].append(name)
            elif not valid_name(name):
                bad.append(name)
            else:
                part = replace(request, model=name, also=[], trace=dict(request.trace))
                self.producer.produce(self.cat.requests(name).name, encode(part), partition=where[1],
                                      on_delivery=partial(self._forwarded, where))
                self.counts["forwarded"] += 1
                if self.offsets is not None:
                    self.offsets.more(where, 1)
        for sibling, asked in parts.values():
            sibling._take(replace(request, model=asked[0], also=asked[1:], trace=dict(request.trace)),
                          arrival, where, value)
            sibling.arrived_event.set()
            if self.offsets is not None:
                self.offsets.more(where, 1)
        if bad:
            self.outbox.append(self._deadletter_record(
                f"bad request: model names {bad!r} are not allowed", value, where, request.query_id))

    def _forwarded(self, where: Where, err: Any, msg: Any) -> None:
        """A part passed on to its model's topic was delivered, or never will be (no such
        topic, say): a dead letter says so, and either way the record's part is done. Delivery
        reports run on the loop (``Emitter.serve_reports``, ``_send_all``)."""
        if err is not None:
            self.outbox.append(self._deadletter_record(
                f"could not pass the request on to {msg.topic()}: {err}", msg.value(), where))
            self.arrived_event.set()
        self._delivered(err, msg)
        if self.offsets is not None:
            self.offsets.done([where])
