"""What a batcher service writes, and when the requests it serves are done.

A request read from ``requests.<model>`` may be committed only once the broker took what
answers it: its batch, its prediction or its dead letter (``batchers.offsets``). Every record a
service produces therefore carries the requests it serves, and its delivery report marks them
done.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from batchers.core import Pending, by_route
from batchers.offsets import RequestOffsets, Where
from schemas import Prediction, Route
from topics.deadletters import dead_letter_value
from topics.sizes import fitted, too_large

log = logging.getLogger("clipstream.batcher")

Out = tuple[str, bytes, int | None, list[Where | None] | None]  # topic, value, partition, requests it serves

METADATA_TIMEOUT_S = 5.0  # one metadata round trip for a topic's partitions
HELD_RETRY_S = 0.5  # between metadata refreshes while a held record's partition is still unknown


class Outputs:
    """The producing half of ``BatcherService``, which sets these attributes."""

    producer: Producer
    record_bytes: int  # CLIPSTREAM_MAX_RECORD_BYTES
    offsets: RequestOffsets | None
    counts: dict[str, int]
    topic_predictions: str
    topic_deadletter: str
    held: list[Out]  # records for a partition the producer did not know yet, in order
    _resending: asyncio.Task[None] | None

    # -- producing --------------------------------------------------------------------
    # librdkafka, not an aiokafka producer: at batch size 1 the batcher sends one record per
    # query, and librdkafka's own thread does the I/O with far less Python per record
    # (docs/design/0009). ``produce`` only queues the record (acks=all); ``Emitter.serve_reports``
    # polls for the delivery reports.
    def _send_all(self, records: list[Out]) -> None:
        produce = self.producer.produce
        for record in records:
            topic, value, partition, wheres = record
            report = self._delivered if not wheres or self.offsets is None else partial(self._done, wheres)
            if partition is not None and self.held and self._held_back(record):
                continue
            try:
                if partition is None:
                    produce(topic, value, on_delivery=report)
                else:
                    produce(topic, value, partition=partition, on_delivery=report)
            except KafkaException as exc:
                if too_large(exc):  # as if the broker had refused it: its requests are let go
                    log.error("a record of %d bytes for %s is over the producer's limit: %s", len(value), topic, exc)
                    self.counts["send_errors"] += 1
                    if wheres and self.offsets is not None:
                        self.offsets.done(wheres)
                elif partition is not None and exc.args[0].code() == KafkaError._UNKNOWN_PARTITION:
                    self._hold(record)
                else:
                    raise
        self.producer.poll(0)

    # -- a partition the producer does not know yet ------------------------------------------
    # librdkafka refuses a record for a partition beyond the count in its cached metadata at
    # once, and refreshes that only every few minutes: a replica added live (``set-replicas``)
    # is such a partition until then. ``knows_partitions`` tells the producer before a new
    # replica gets batches (``app._follow``); a record refused anyway is held and sent once the
    # partition is known, never dropped, as it carries requests.
    def knows_partitions(self, topic: str, count: int) -> bool:
        """Refresh the producer's metadata of ``topic`` (blocking: run it off the loop); whether
        it now knows at least ``count`` partitions."""
        try:
            meta = self.producer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
        except KafkaException as exc:
            log.warning("no metadata for %s: %s", topic, exc)
            return False
        return meta is not None and meta.error is None and len(meta.partitions) >= count

    def _held_back(self, record: Out) -> bool:
        """Hold ``record`` too if an earlier one for its partition is held: each partition's
        records stay in order (a handover must follow the batches before it)."""
        if any(h[0] == record[0] and h[2] == record[2] for h in self.held):
            self.held.append(record)
            return True
        return False

    def _hold(self, record: Out) -> None:
        self.held.append(record)
        if self._resending is None or self._resending.done():
            log.warning("partition %s of %s is not known to the producer yet; its records wait until it is",
                        record[2], record[0])
            self._resending = asyncio.get_running_loop().create_task(self._resend_held())

    async def _resend_held(self) -> None:
        """Refresh the held records' topics' metadata, then send them again; those whose
        partition is still unknown are held again, for the next round. They stay in ``held``
        while the refresh runs, so records sent meanwhile queue behind them."""
        loop = asyncio.get_running_loop()
        while self.held:
            for topic in dict.fromkeys(r[0] for r in self.held):
                await loop.run_in_executor(None, self.knows_partitions, topic, 0)
            held, self.held = self.held, []
            self._send_all(held)
            if self.held:
                await asyncio.sleep(HELD_RETRY_S)

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
        out: list[Out] = []
        for route, record in by_route((p.route, pred) for p, pred in preds).items():
            *parts, last = fitted(record, self.record_bytes)  # in order: the last one's report serves them all
            out += [(route[0] or self.topic_predictions, value, route[1], None) for value in parts]
            out.append((route[0] or self.topic_predictions, last, route[1], wheres[route]))
        return out

    def _emit(self, preds: list[tuple[Pending, Prediction]]) -> None:
        self._send_all(self._predictions(preds))

    def _deadletter_record(self, reason: str, payload: bytes | None, where: Where | None,
                           query_id: str | None = None, serves: bool = False) -> Out:
        """``serves``: the dead letter is all that answers the request at ``where``."""
        value = dead_letter_value(stage="batcher", reason=reason, source=where, query_id=query_id, payload=payload)
        return self.topic_deadletter, value, None, [where] if serves else None
