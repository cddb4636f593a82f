"""What a batcher service writes, and when the requests it serves are done.

A request read from ``requests.<model>`` may be committed only once the broker took what
answers it: its batch, its prediction or its dead letter (``batchers.offsets``). Every record a
service produces therefore carries the requests it serves, and its delivery report marks them
done.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from confluent_kafka import Producer

from batchers.core import Pending, by_route
from batchers.offsets import RequestOffsets, Where
from schemas import Prediction, Route, encode
from topics.deadletters import dead_letter_value

log = logging.getLogger("clipstream.batcher")

Out = tuple[str, bytes, int | None, list[Where | None] | None]  # topic, value, partition, requests it serves


class Outputs:
    """The producing half of ``BatcherService``, which sets these attributes."""

    producer: Producer
    offsets: RequestOffsets | None
    counts: dict[str, int]
    topic_predictions: str
    topic_deadletter: str

    # -- producing --------------------------------------------------------------------
    # librdkafka, not an aiokafka producer: at batch size 1 the batcher sends one record per
    # query, and librdkafka's own thread does the I/O with far less Python per record
    # (docs/design/0009). ``produce`` only queues the record (acks=all); ``Emitter.serve_reports``
    # polls for the delivery reports.
    def _send_all(self, records: list[Out]) -> None:
        produce = self.producer.produce
        for topic, value, partition, wheres in records:
            report = self._delivered if not wheres or self.offsets is None else partial(self._done, wheres)
            if partition is None:
                produce(topic, value, on_delivery=report)
            else:
                produce(topic, value, partition=partition, on_delivery=report)
        self.producer.poll(0)

    def _done(self, wheres: list[Where | None], err: Any, msg: Any) -> None:
        """The record that serves these requests was delivered: they may be committed. One the
        broker refused for good is let go too (the selector answers its query at the deadline),
        as holding it would hold back every commit of its partition until the next rebalance."""
        self._delivered(err, msg)
        assert self.offsets is not None
        self.offsets.done(wheres)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.counts["send_errors"] += 1
            log.warning("a record for %s was not delivered: %s", msg.topic(), err)

    def _predictions(self, preds: list[tuple[Pending, Prediction]]) -> list[Out]:
        """One ``Predictions`` record per destination, with the requests it serves (each once,
        though a group's request has a prediction per member)."""
        wheres: dict[Route, list[Where | None]] = {}
        seen: set[int] = set()
        for p, _ in preds:
            if id(p) not in seen:
                seen.add(id(p))
                wheres.setdefault(p.route, []).append(p.where)
        return [(route[0] or self.topic_predictions, encode(record), route[1], wheres[route])
                for route, record in by_route((p.route, pred) for p, pred in preds).items()]

    def _emit(self, preds: list[tuple[Pending, Prediction]]) -> None:
        self._send_all(self._predictions(preds))

    def _deadletter_record(self, reason: str, payload: bytes | None, where: Where | None,
                           query_id: str | None = None, serves: bool = False) -> Out:
        """``serves``: the dead letter is all that answers the request at ``where``."""
        value = dead_letter_value(stage="batcher", reason=reason, source=where, query_id=query_id, payload=payload)
        return self.topic_deadletter, value, None, [where] if serves else None
