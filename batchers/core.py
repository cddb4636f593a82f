"""One model's batching state machine: deadline queue + coalescing + per-replica dispatch.

This is everything the batcher decides, with no Kafka or Redis: the adapter (``app.py``)
feeds it decoded records and the clock, and does what it returns (produce batches, report
expired requests, look cached values up). Keeping it here lets the unit tests drive a whole
batcher with an injected clock and no broker.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from batchers.cache import Coalescer
from batchers.dispatch import Dispatcher, InFlight, Replica
from batchers.queue import DeadlineQueue
from schemas import Batch, BatchItem, BatchStats, ModelRequest, Prediction, Predictions, Route, Tensor, route_of
from topics.markers import HANDOVER_PREFIX, RETIRE_PREFIX, handover


@dataclass
class Pending:
    """A request the batcher holds: the decoded ModelRequest and its cache key."""

    request: ModelRequest
    key: str | None
    arrival_us: int
    where: tuple[str, int, int] | None = None  # its record (topic, partition, offset): done once served
    models: tuple[str, ...] = ()  # in a group: the members it still needs (``batchers.group``)

    @property
    def deadline_us(self) -> int:
        return self.request.deadline_us

    @property
    def route(self) -> Route:
        """Where this request's prediction goes (``schemas.route_of``)."""
        return route_of(self.request)


@dataclass
class SentBatch:
    replica: int
    record: Batch
    flight: InFlight
    wheres: list[tuple[str, int, int] | None] = field(default_factory=list)  # its requests' records


@dataclass
class Step:
    """The result of one ``poll``: batches to produce, requests to report expired, next wake."""

    batches: list[SentBatch] = field(default_factory=list)
    expired: list[Pending] = field(default_factory=list)
    wake_us: int | None = None


class BatcherCore:
    """Queue, coalescer and dispatcher of one model, driven by ``admit``/``poll``/``on_stats``."""

    def __init__(
        self,
        model: str,
        version: str | None,
        dispatcher: Dispatcher,
        coalesce: bool = True,
        drop_hopeless: bool = True,
        hopeless_margin_us: int = 0,
    ) -> None:
        self.drop_hopeless = drop_hopeless
        # the prediction's trip from the worker to the selector, which must also end by the deadline
        self.hopeless_margin_us = hopeless_margin_us
        self.model = model
        self.version = version
        self.dispatcher = dispatcher
        self.coalesce = coalesce
        self.queue: DeadlineQueue[Pending] = DeadlineQueue()
        self.coalescer: Coalescer[Pending] = Coalescer()
        self._prefix = uuid.uuid4().hex[:8]
        self._count = 0

    # -- input ------------------------------------------------------------------------
    def admit(self, pending: Pending) -> bool:
        """A cache miss: queue it, or let it wait on an identical pending request.

        Returns True when it was queued, False when it joined another's evaluation.
        """
        if self.coalesce and pending.key is not None:
            if not self.coalescer.join(pending.key, pending):
                return False
        self.queue.push(pending, pending.arrival_us)
        self.dispatcher.arrived(pending.arrival_us)
        return True

    def _readmit(self, waiters: Iterable[Pending], now_us: int, expired: list[Pending]) -> None:
        for p in waiters:
            if p.deadline_us <= now_us:
                expired.append(p)
            else:
                self.admit(p)

    # -- batching ---------------------------------------------------------------------
    def poll(self, now_us: int) -> Step:
        """Reclaim lost credit, drop expired requests, and form every batch that is due."""
        step = Step()
        for flight in self.dispatcher.reclaim(now_us):
            for key in flight.keys:
                self._readmit(self.coalescer.abandon(key), now_us, step.expired)
        self._expire(now_us, now_us, step)
        while True:
            decision = self.dispatcher.decide(len(self.queue), self.queue.oldest_arrival, now_us)
            if not decision.send:
                step.wake_us = decision.wake_us
                break
            # under overload, serving a request that cannot finish in time only makes the
            # ones behind it late too: size the batch so that as many as fit make their
            # deadline, and drop those that could only make it in a smaller batch
            size = decision.size
            replica = self.dispatcher.replicas[decision.replica]  # type: ignore[index]
            if self.drop_hopeless and replica.latency.known:
                size, cutoff = self._fit_to_deadlines(replica, size, now_us)
                if self._expire(cutoff, now_us, step):
                    continue
            items, late = self.queue.take(size, now_us)
            step.expired.extend(late)  # empty: expire() ran above with the same clock
            if not items:
                break
            step.batches.append(self._batch(decision.replica, items, now_us))  # type: ignore[arg-type]
        for t in (self.queue.next_deadline, self.dispatcher.next_reclaim_us()):
            if t is not None and (step.wake_us is None or t < step.wake_us):
                step.wake_us = t
        return step

    def _fit_to_deadlines(self, replica: Replica, limit: int, now_us: int) -> tuple[int, int]:
        """The largest batch, up to ``limit``, that as many queued requests can make in time,
        and its cutoff: requests due by then cannot make it in that batch.

        The largest such batch is also the most efficient one (the device's fixed cost per
        batch is shared by more requests), so under overload the oldest requests are given
        up rather than served in small batches that leave the device short of its best
        throughput (docs/design/0004).
        """
        start = now_us + replica.wait_us(now_us) + self.hopeless_margin_us
        latest = self.queue.latest_deadlines(limit)
        for size in range(len(latest), 0, -1):
            cutoff = start + int(replica.latency.service_us(size))
            if latest[size - 1] > cutoff:
                return size, cutoff
        return 1, start + int(replica.latency.service_us(1))  # nothing makes it, even alone

    def _expire(self, cutoff_us: int, now_us: int, step: Step) -> int:
        """Drop requests due by ``cutoff_us``; their coalesced twins get their own chance."""
        dropped = self.queue.expire(cutoff_us)
        for p in dropped:
            step.expired.append(p)
            if self.coalesce and p.key is not None:
                self._readmit(self.coalescer.abandon(p.key), now_us, step.expired)
        return len(dropped)

    def _batch(self, replica: int, items: list[Pending], now_us: int) -> SentBatch:
        self._count += 1
        batch_id = f"{self._prefix}-{self._count}"
        record = Batch(
            batch_id=batch_id,
            model=self.model,
            version=self.version,
            replica=replica,
            created_us=now_us,
            items=[
                BatchItem(
                    query_id=p.request.query_id,
                    selector_partition=p.request.selector_partition,
                    deadline_us=p.request.deadline_us,
                    cache_key=p.key,
                    input=p.request.input,
                    trace={**p.request.trace, "batched": now_us},
                    reply_topic=p.request.reply_topic,
                    reply_partition=p.request.reply_partition,
                    models=list(p.models),
                )
                for p in items
            ],
        )
        keys = tuple(p.key for p in items if p.key is not None) if self.coalesce else ()
        flight = self.dispatcher.sent(replica, batch_id, len(items), now_us, keys)
        return SentBatch(replica, record, flight, [p.where for p in items])

    def handovers(self, replicas: int, now_us: int) -> list[tuple[int, Batch]]:
        """(replica, empty batch) for each replica, stamped with the version now served: read
        after every batch of the previous version on its partition, it tells that version's
        worker it may stop (docs/design/0021). No credit is taken; no worker reports on it."""
        self._count += 1
        return [(r, handover(self.model, self.version, r, f"{HANDOVER_PREFIX}{self._prefix}-{self._count}", now_us))
                for r in range(replicas)]

    def retirements(self, first: int, last: int, now_us: int) -> list[tuple[int, Batch]]:
        """(replica, empty batch) for each replica from ``first`` up to ``last`` (excluded), which
        the registry removed: its worker stops once the batches before it are served."""
        self._count += 1
        return [(r, handover(self.model, self.version, r, f"{RETIRE_PREFIX}{self._prefix}-{self._count}", now_us))
                for r in range(first, last)]

    # -- feedback from workers ----------------------------------------------------------
    def on_stats(self, stats: BatchStats, now_us: int | None = None) -> list[str]:
        """A worker's BatchStats: credit back, AIMD input. Returns keys whose waiters need values.

        Keys nobody waits on are forgotten at once; the others stay pending until
        ``deliver`` so that identical requests arriving meanwhile still coalesce.
        """
        flight = self.dispatcher.completed(stats.batch_id, stats.batch_size, stats.service_us, now_us)
        if flight is None:
            return []
        wanted = []
        for key in flight.keys:
            if self.coalescer.waiting(key):
                wanted.append(key)
            else:
                self.coalescer.resolve(key)
        return wanted

    def deliver(self, key: str, value: Tensor | None, now_us: int) -> tuple[list[Pending], list[Pending]]:
        """The cached value of ``key`` (None: not in the cache after all).

        Returns (served, expired): waiters to answer with ``value``, and waiters that could
        not be re-queued because their deadline passed. Without a value the waiters go back
        to the queue, the first of them leading a new evaluation.
        """
        waiters = self.coalescer.resolve(key)
        if value is not None:
            return waiters, []
        expired: list[Pending] = []
        self._readmit(waiters, now_us, expired)
        return [], expired


def prediction(
    pending: Pending, model: str, version: str | None, status: str, now_us: int,
    output: Tensor | None = None, error: str | None = None,
) -> Prediction:
    """A Prediction record for a request the batcher answers itself (cached or expired)."""
    return Prediction(
        query_id=pending.request.query_id,
        model=model,
        version=version,
        status=status,
        output=output,
        error=error,
        trace={**pending.request.trace, "batched": now_us},
    )


def by_route(items: Iterable[tuple[Route, Prediction]]) -> dict[Route, Predictions]:
    """Group predictions into one Predictions record per destination (``Pending.route``)."""
    groups: dict[Route, list[Prediction]] = defaultdict(list)
    for route, pred in items:
        groups[route].append(pred)
    return {r: Predictions(selector_partition=r[1], items=preds) for r, preds in groups.items()}
