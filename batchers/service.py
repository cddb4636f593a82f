"""One model's batcher inside a batcher process: decode, look up, queue, batch, produce.

The I/O around ``BatcherCore`` (every decision lives there and is tested without a broker).
A batcher process runs one of these per model it serves (``app.py``); the services of one
process share its Kafka producer and Redis client, so serving eight models costs one set of
client threads and connections, not eight.

Latency choices: requests that arrived together are looked up in Redis with one MGET
(whatever arrives while a lookup is on the wire is looked up next, so nothing waits for a
timer); hits are produced at once to ``predictions`` at the request's selector
partition; the batching loop sleeps exactly until the next thing is due (delayed-batching
deadline, a request's deadline, a credit timeout) or until new work wakes it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import redis.asyncio as aioredis
from confluent_kafka import Producer

from batchers.aimd import AIMD
from batchers.cache import cache_key
from batchers.core import BatcherCore, Pending, prediction
from batchers.dispatch import Dispatcher
from batchers.fan_out import FanOut
from batchers.follow import Follow
from batchers.offsets import RequestOffsets, Where
from batchers.outputs import Out, Outputs
from batchers.settings import BatcherSettings
from batchers.version import VersionSwitch
from clipstream.clock import now_us
from clipstream.errors import ClipstreamError, DecodeError
from clipstream.redisclient import REDIS_AWAY, RedisGuard, async_client, sync_client
from clipstream.settings import Settings
from registry.spec import ModelSpec
from schemas import BatchStats, ModelRequest, Prediction, Tensor, decode_as, encode
from schemas.reasons import BAD_INPUT
from topics.catalogue import Catalogue
from topics.emitter import Emitter
from topics.intake import Record
from topics.markers import FAILED_PREFIX, marker_version
from topics.sizes import RECORD_ALLOWANCE, item_bytes, too_large_input

log = logging.getLogger("clipstream.batcher")

EXPIRED = "deadline passed while queued in the batcher"
# dropped before its deadline: the batches its model's replicas took lately would end after it
HOPELESS = "given up before its deadline: the model's recent batches take longer than the time it had left"


def _weigh(pending: Pending) -> int:
    """What a request adds to its batch's record (``topics.sizes``)."""
    return item_bytes(len(pending.request.input.data))


@dataclass
class ModelSetup:
    """What the batcher needs to know about its model (from the CLI or the registry)."""

    name: str
    version: str | None
    replicas: int
    latency_objective_ms: float
    max_batch_size: int
    batch_delay_ms: float
    cache: bool = True
    spec: ModelSpec | None = None  # when the registry knows it
    members: dict[str, str | None] = field(default_factory=dict)  # a group's: name -> version
    pinned: tuple[str, ...] = ()  # knobs the command line set: the registry's do not replace them


class BatcherService(Outputs, FanOut, Follow):
    """Decode, look up, queue, batch, produce: the I/O around one model's ``BatcherCore``."""

    def __init__(self, settings: Settings, bs: BatcherSettings, model: ModelSetup,
                 producer: Producer | None = None, redis: aioredis.Redis | None = None,
                 guard: RedisGuard | None = None, offsets: RequestOffsets | None = None) -> None:
        """``producer``, ``redis`` and its ``guard``: the process's shared clients (made here when
        not given). While the guard says Redis is away, every lookup is a miss: the request goes
        to the model rather than wait on the cache. ``offsets``: told which request records are
        read and which are done (acknowledged by the broker), so a member commits only those."""
        self.settings = settings
        self.model = model
        self.cat = Catalogue.from_settings(settings)
        self.topic_predictions = self.cat.predictions.name
        self.topic_batches = self.cat.batches(model.name, model.replicas).name
        self.topic_deadletter = self.cat.deadletter.name
        self.bs = bs
        dispatcher = Dispatcher(
            model.replicas,
            self._aimd_factory(model),
            max_in_flight=bs.max_in_flight,
            batch_delay_us=int(model.batch_delay_ms * 1000),
            credit_timeout_us=int(bs.credit_timeout_ms * 1000),
            credit_lead_us=int(bs.credit_lead_ms * 1000) if bs.just_in_time else None,
        )
        self.core = BatcherCore(model.name, model.version, dispatcher, coalesce=model.cache,
                                drop_hopeless=bs.drop_hopeless, hopeless_margin_us=int(bs.hopeless_margin_ms * 1000),
                                weigh=_weigh, batch_bytes=settings.max_record_bytes - RECORD_ALLOWANCE)
        self.record_bytes = settings.max_record_bytes
        self.predictions_partitions: int | None = None  # the topic's, once the app has read them
        # the version batches carry moves to the registry's once its workers are ready
        self.switch = VersionSwitch(model.version, int(bs.version_switch_timeout_s * 1e6))
        self._wanted: tuple[int, ModelSpec | None] = (model.replicas, model.spec)
        self.redis = (redis or async_client(settings)) if model.cache else None
        self.guard = guard or RedisGuard(sync_client(settings).ping, name="batcher")
        self.wake = asyncio.Event()
        self.offsets = offsets
        self.base_in_flight = bs.max_in_flight
        self.arrived: list[tuple[ModelRequest, int, Where]] = []  # (request, arrival, its record)
        self.arrived_event = asyncio.Event()
        self.outbox: list[Out] = []  # dead letters from ``accept``
        self.held: list[Out] = []  # for a partition the producer does not know yet (``Outputs._hold``)
        self._resending: asyncio.Task[None] | None = None
        self.failed: list[tuple[Pending, Prediction]] = []  # error predictions from ``accept``
        self._tasks: set[asyncio.Task[None]] = set()  # coalesced requests being served
        self.counts = {"requests": 0, "cached": 0, "batched": 0, "batches": 0, "expired": 0, "errors": 0,
                       "send_errors": 0, "forwarded": 0}
        # the other models' services in this process, by name: an ensemble's request record
        # names them all (``_fan_out``); ``app.py`` fills it
        self.siblings: dict[str, BatcherService] = {}
        self.producer = producer or Emitter(settings, name=f"batcher {model.name}").producer

    def _aimd_factory(self, model: ModelSetup) -> Callable[[], AIMD]:
        objective_us, bs = int(model.latency_objective_ms * 1000), self.bs
        return lambda: AIMD(objective_us, bs.aimd_step, model.max_batch_size, bs.aimd_start, fill=bs.aimd_fill)

    def retune(self, latency_objective_ms: float, max_batch_size: int, batch_delay_ms: float) -> bool:
        """Take the registry's batching knobs, changed by ``apply`` while serving (those the
        command line pinned stay); True when any changed."""
        m = self.model
        wanted = {"latency_objective_ms": float(latency_objective_ms), "max_batch_size": max(1, int(max_batch_size)),
                  "batch_delay_ms": max(0.0, float(batch_delay_ms))}
        changes = {k: v for k, v in wanted.items() if k not in m.pinned and getattr(m, k) != v}
        if not changes:
            return False
        self.model = m = replace(m, **changes)
        self.core.dispatcher.retune(self._aimd_factory(m), int(m.latency_objective_ms * 1000), m.max_batch_size,
                                    int(m.batch_delay_ms * 1000))
        return True

    # -- requests -----------------------------------------------------------------------
    def accept_group(self, records: list[Record]) -> None:
        """Records of ``requests.<model>`` as one fetch brought them: validate each, then wake
        the lookup task once. Synchronous (called on the loop by ``Intake``); what a bad record
        produces (dead letter, error prediction) goes out with the lookup task's next round."""
        for value, where in records:
            try:
                self._accept(value, where)
            except Exception as exc:  # one bad record must not drop the rest of the fetch
                log.exception("request %s failed", where)
                self.counts["errors"] += 1
                self.outbox.append(self._deadletter_record(
                    f"the batcher failed on this request: {type(exc).__name__}: {exc}", value, where, serves=True))
        self.arrived_event.set()

    def _accept(self, value: bytes | None, where: Where) -> None:
        arrival = now_us()
        if self.offsets is not None:
            self.offsets.read(where)
        try:
            request = decode_as(ModelRequest, value)  # type: ignore[arg-type]  # None: DecodeError
        except DecodeError as exc:
            self.outbox.append(self._deadletter_record(str(exc), value, where, serves=True))
            return
        request.trace["batcher_in"] = arrival
        nowhere = self.cat.route_problem(request.reply_topic, request.selector_partition, self.predictions_partitions)
        if nowhere is not None:
            self.outbox.append(self._deadletter_record(f"bad request: {nowhere}", value, where, request.query_id,
                                                       serves=True))
            return
        others = self._others(request)
        if others:
            self._fan_out(request, others, arrival, where, value)
        self._take(request, arrival, where, value)

    def _take(self, request: ModelRequest, arrival: int, where: Where, value: bytes | None) -> None:
        """One model's request, decoded: checked against the model's input, then queued."""
        try:
            array = request.input.array()
            if self.model.spec is not None:
                self.model.spec.input.check(array, finite=True)
        except (ClipstreamError, ValueError, TypeError) as exc:  # numpy's own errors on a hostile tensor too
            self.counts["errors"] += 1
            reason = f"{BAD_INPUT}{self.model.name}: {exc}"  # an ensemble's models each say so
            # the record is on a model's topic: the app names whose caller sent it
            self.outbox.append(self._deadletter_record(f"{reason} (a query of app {request.app!r})", value,
                                                       where, request.query_id))
            self.failed += self._answers([Pending(request, None, arrival, where, self._asked(request))],
                                         "error", arrival, error=reason)
            return
        self.counts["requests"] += 1
        self.arrived.append((request, arrival, where))

    async def lookup_loop(self) -> None:
        """Group whatever arrived, look it up with one MGET, answer hits, queue misses."""
        while True:
            await self.arrived_event.wait()
            self.arrived_event.clear()
            arrived, self.arrived = self.arrived, []
            if self.outbox or self.failed:
                outbox, self.outbox = self.outbox, []
                failed, self.failed = self.failed, []
                self._send_all(outbox)
                if failed:
                    self._emit(failed)
            if not arrived:
                continue
            hits, misses = await self._look_up(arrived)
            for p in misses:
                self.core.admit(p)
            if hits:  # a request counts once, and only when every model it asks was a hit (a group's)
                missed = {id(p.request) for p in misses}
                self.counts["cached"] += len({id(p.request) for p, _ in hits} - missed)
                self._emit(hits)
            if misses:
                self.wake.set()

    def _asked(self, request: ModelRequest) -> tuple[str, ...]:
        """The models a request asks of this service's queue: none by name, for one model."""
        return ()

    def _answers(self, pendings: list[Pending], status: str, now: int, output: Tensor | None = None,
                 error: str | None = None) -> list[tuple[Pending, Prediction]]:
        """The predictions the batcher answers these requests with itself (cached, expired, failed)."""
        return [(p, prediction(p, self.model.name, self.core.version, status, now, output, error))
                for p in pendings]

    async def _look_up(self, arrived: list[tuple[ModelRequest, int, Where]]
                       ) -> tuple[list[tuple[Pending, Prediction]], list[Pending]]:
        """(predictions of the hits, requests that missed) with one MGET."""
        version = self.core.version
        pendings = [
            Pending(r, cache_key(self.model.name, version, r.input) if self.redis else None, t, w)
            for r, t, w in arrived
        ]
        values = await self._mget([p.key for p in pendings])  # type: ignore[misc]
        hits: list[tuple[Pending, Prediction]] = []
        misses: list[Pending] = []
        now = now_us()
        for p, raw in zip(pendings, values):
            output = self._decode_cached(raw)
            if output is not None:
                hits += self._answers([p], "cached", now, output)
            else:
                misses.append(p)
        return hits, misses

    @staticmethod
    def _decode_cached(raw: bytes | None) -> Tensor | None:
        if raw is None:
            return None
        try:
            return decode_as(Tensor, raw)
        except DecodeError:
            return None  # a foreign or corrupt entry: evaluate again (the worker overwrites it)

    # -- worker reports -------------------------------------------------------------------
    def accept_stats(self, records: list[Record]) -> None:
        """Worker reports as one fetch brought them (called on the loop by ``Intake``): credit
        back and AIMD input at once; coalesced requests whose batch finished are answered from
        the cache by a task, since that needs Redis."""
        keys: list[str] = []
        now = now_us()
        for value, where in records:
            try:
                stats = decode_as(BatchStats, value)  # type: ignore[arg-type]  # None: DecodeError
                version = marker_version(stats)
                if version is not None:  # a worker of ``version`` is ready, not a batch report
                    self.switch.mark_ready(version, stats.replica, stats.created_us)
                    self._maybe_switch(now)
                    self._maybe_grow(now)
                    continue
                version = marker_version(stats, FAILED_PREFIX)
                if version is not None:  # a worker could not load ``version``: its batches stay
                    if version == self.switch.target and not self.switch.failed():
                        log.warning("batcher %s: replica %d could not load version %s; its batches stay on version "
                                    "%s (deploy a fixed version, or `clipstream rollback`)", self.model.name,
                                    stats.replica, version, self.switch.current)
                    self.switch.mark_failed(version, stats.created_us)
                    continue
                keys += self.core.on_stats(stats, now)
            except Exception as exc:  # undecodable, or one the batcher cannot use: the rest still count
                reason = str(exc) if isinstance(exc, DecodeError) else \
                    f"the batcher failed on this report: {type(exc).__name__}: {exc}"
                self.outbox.append(self._deadletter_record(reason, value, where))
                self.arrived_event.set()  # the lookup task sends the outbox
        self.wake.set()  # credit is back
        if keys:
            task = asyncio.get_running_loop().create_task(self._serve_coalesced(keys))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _mget(self, keys: list[str]) -> list[bytes | None]:
        """The cached values of ``keys``; all misses when there is no cache, when Redis is away
        (one bounded wait finds that out, then none until it answers again) or fails."""
        if self.redis is None or not self.guard.available():
            return [None] * len(keys)
        try:
            return await self.redis.mget(keys)
        except Exception as exc:  # Redis down: serve from the models, not from nothing
            if isinstance(exc, REDIS_AWAY):
                self.guard.failed(exc)
            log.warning("cache lookup failed (%s); treating %d requests as misses", exc, len(keys))
            return [None] * len(keys)

    async def _serve_coalesced(self, keys: list[str]) -> None:
        values = await self._mget(keys)
        now = now_us()
        out: list[tuple[Pending, Prediction]] = []
        for key, raw in zip(keys, values):
            output = self._decode_cached(raw)
            served, expired = self.core.deliver(key, output, now)
            out += [(p, prediction(p, self.model.name, self.core.version, "cached", now, output))
                    for p in served]
            out += self._expired(expired, now)
        if out:
            self.counts["cached"] += len({id(p.request) for p, pred in out if pred.status == "cached"})
            self._emit(out)
        self.wake.set()  # requests sent back to the queue

    def _expired(self, pendings: list[Pending], now: int, why: str = EXPIRED) -> list[tuple[Pending, Prediction]]:
        self.counts["expired"] += len(pendings)
        return self._answers(pendings, "expired", now, error=why)

    # -- batching ---------------------------------------------------------------------------
    async def batch_loop(self) -> None:
        """Form every batch that is due, report expired requests, sleep until the next event."""
        while True:
            now = now_us()
            step = self.core.poll(now)
            out: list[Out] = []
            for sent in step.batches:
                self.counts["batches"] += 1
                self.counts["batched"] += len(sent.record.items)
                out.append((self.topic_batches, encode(sent.record), sent.replica, sent.wheres))
            if step.expired:
                out += self._predictions(self._expired(step.expired, now))
            if step.hopeless:
                out += self._predictions(self._expired(step.hopeless, now, HOPELESS))
            if step.too_large:
                self.counts["errors"] += len(step.too_large)
                out += self._predictions(self._answers(step.too_large, "error", now, error=too_large_input(
                    len(step.too_large[0].request.input.data), self.record_bytes)))
            if out:
                self._send_all(out)
            timeout = None if step.wake_us is None else max(0.0, (step.wake_us - now_us()) / 1e6)
            if timeout == 0.0:
                continue
            try:
                await asyncio.wait_for(self.wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()

    def share(self, owned: int, partitions: int) -> None:
        """This member owns ``owned`` of the model's ``partitions`` request partitions: it gets
        that share of each replica's credit, at least one batch, so the members feeding one
        replica together keep about ``max_in_flight`` batches at it (docs/design/0024)."""
        fraction = owned / partitions if partitions > 0 else 1.0
        self.core.dispatcher.set_credit(max(1, math.ceil(self.base_in_flight * fraction - 1e-9)))
        self.wake.set()

    def stats_line(self) -> str:
        return json.dumps({"model": self.model.name, **self.counts, "queued": len(self.core.queue),
                           "replicas": self.core.dispatcher.stats()})
