"""One model's batching state machine: deadline queue + coalescing + per-replica dispatch.

This is everything the batcher decides, with no Kafka or Redis: the adapter (``app.py``)
feeds it decoded records and the clock, and does what it returns (produce batches, report
expired requests, look cached values up). Keeping it here lets the unit tests drive a whole
batcher with an injected clock and no broker.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from batchers.cache import Coalescer
from batchers.dispatch import Dispatcher, InFlight, Replica
from batchers.latency import LatencyModel
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


# a replica that every queued request looks hopeless for, and that was sent nothing for this
# long, gets one request anyway: its speed is learnt only from the batches it is sent, so an
# estimate made while it was slow (a slow version rolled back, a busy machine) would otherwise
# keep every request from it for good. The probe's report replaces the estimate it tested.
PROBE_AFTER_US = 1_000_000


@dataclass
class Step:
    """The result of one ``poll``: batches to produce, requests to report expired (``hopeless``:
    dropped before their deadline, which no batch could make) or too large, next wake."""

    batches: list[SentBatch] = field(default_factory=list)
    expired: list[Pending] = field(default_factory=list)
    hopeless: list[Pending] = field(default_factory=list)
    too_large: list[Pending] = field(default_factory=list)  # no batch record could carry them
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
        weigh: Callable[[Pending], int] | None = None,
        batch_bytes: int | None = None,
    ) -> None:
        # a batch's items ``weigh`` at most ``batch_bytes`` together, so its record fits the
        # topic's limit; one over it alone goes in ``Step.too_large``
        self.weigh, self.batch_bytes = weigh, batch_bytes
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
        self._probes: dict[str, int] = {}  # batch id -> replica, of batches sent to measure it again
        self._other_version: set[str] = set()  # batches sent before the version served now

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
            probe = False
            if self.drop_hopeless and replica.latency.known:
                size, cutoff, none_fits = self._fit_to_deadlines(replica, size, now_us)
                probe = none_fits and self._probe_due(replica, now_us)
                if probe:
                    size, cutoff = 1, now_us  # one request, to measure the replica again
                elif (due := self.queue.next_deadline) is not None and due <= cutoff:
                    replica, size, cutoff = self._faster(replica, size, cutoff, none_fits, now_us)
                if self._expire(cutoff, now_us, step, hopeless=True):
                    continue
            items, late = self.queue.take(size, now_us, self.weigh, self.batch_bytes)
            step.expired.extend(late)  # empty: expire() ran above with the same clock
            if not items:
                break
            if self.weigh is not None and self.batch_bytes is not None and self.weigh(items[0]) > self.batch_bytes:
                step.too_large.extend(items)  # alone, as ``take`` takes no more after it
                if self.coalesce and items[0].key is not None:  # the same input waits on it
                    step.too_large.extend(self.coalescer.resolve(items[0].key))
                continue
            step.batches.append(self._batch(replica.index, items, now_us))
            if probe:
                self._probes[step.batches[-1].record.batch_id] = replica.index
                while len(self._probes) > 64:  # probes whose report never came
                    del self._probes[next(iter(self._probes))]
        for t in (self.queue.next_deadline, self.dispatcher.next_reclaim_us()):
            if t is not None and (step.wake_us is None or t < step.wake_us):
                step.wake_us = t
        return step

    def _fit_to_deadlines(self, replica: Replica, limit: int, now_us: int) -> tuple[int, int, bool]:
        """The largest batch, up to ``limit``, that as many queued requests can make in time,
        its cutoff (requests due by then cannot make it in that batch), and whether none can
        make it, even alone.

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
                return size, cutoff, False
        return 1, start + int(replica.latency.service_us(1)), True

    def _faster(self, replica: Replica, size: int, cutoff: int, none_fits: bool,
                now_us: int) -> tuple[Replica, int, int]:
        """Another ready replica that would give up fewer requests than ``replica`` (whose batch
        would leave some behind as hopeless): the one whose batch finishes first. Replicas are
        picked by load, not speed, so a slow replica with credit to spare would otherwise give
        up requests a fast one could serve in time."""
        best = (none_fits, cutoff, replica, size)
        queued = len(self.queue)
        for other in self.dispatcher.ready(now_us, queued):
            if other is replica:
                continue
            s, c, nf = self._fit_to_deadlines(other, min(queued, other.aimd.max_batch_size), now_us)
            if (nf, c) < best[:2]:
                best = (nf, c, other, s)
        return best[2], best[3], best[1]

    @staticmethod
    def _probe_due(replica: Replica, now_us: int) -> bool:
        """Nothing in flight, and nothing sent for ``PROBE_AFTER_US``: the estimate that finds
        every request hopeless is not being corrected by any report."""
        return not replica.in_flight and now_us - replica.last_sent_us >= PROBE_AFTER_US

    def _expire(self, cutoff_us: int, now_us: int, step: Step, hopeless: bool = False) -> int:
        """Drop requests due by ``cutoff_us``; their coalesced twins get their own chance.
        ``hopeless``: the ones not yet due are reported as given up, not as expired."""
        dropped = self.queue.expire(cutoff_us)
        for p in dropped:
            (step.hopeless if hopeless and p.deadline_us > now_us else step.expired).append(p)
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

    def serve_version(self, version: str | None) -> None:
        """Batches carry ``version`` from now on. Each replica's speed is learnt again, from
        this version's batches only: another version's code (a slow one rolled back, say) says
        nothing of this one's."""
        self.version = version
        self._other_version = {b for r in self.dispatcher.replicas for b in r.in_flight}
        for replica in self.dispatcher.replicas:
            replica.latency = LatencyModel()

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
        probed = self._probes.pop(stats.batch_id, None)
        if probed is not None and probed < len(self.dispatcher.replicas):  # the estimate it tested is stale
            self.dispatcher.replicas[probed].latency = LatencyModel()
        learn = stats.batch_id not in self._other_version
        self._other_version.discard(stats.batch_id)
        flight = self.dispatcher.completed(stats.batch_id, stats.batch_size, stats.service_us, now_us, learn=learn)
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
