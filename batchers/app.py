"""The batcher process: a thin faust-streaming shell around ``BatcherCore``.

Faust runs the process: its lifecycle, signals and logging, and its tasks (intake, cache
lookups, the batching loop, delivery reports, readiness). Its own Kafka consumer and
producer are switched off (faust's ``BootStrategy``): the batcher's Kafka I/O is one record
per query at batch size 1, and librdkafka does it for a fraction of the CPU. Both topics it
reads, ``requests.<model>`` and ``batch-stats.<model>`` (one record per batch), come in
through librdkafka consumer threads (``intake.py`` says why: a fifth of a faust agent's CPU
per record); what it writes goes out through a librdkafka producer (a third of faust's or less).
Every decision lives in ``core.py`` and the modules under it, so it is tested without a broker.

Latency choices: a group of requests that arrived together is looked up in Redis with one
MGET (whatever arrives while a lookup is on the wire forms the next group, so nothing waits
for a timer); hits are produced at once to ``predictions`` at the request's selector
partition; the batching loop sleeps exactly until the next thing is due (delayed-batching
deadline, a request's deadline, a credit timeout) or until new work wakes it.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import faust
from faust.app.base import BootStrategy
import redis.asyncio as aioredis
from confluent_kafka import Producer

from batchers.aimd import AIMD
from batchers.cache import cache_key
from batchers.core import BatcherCore, Pending, by_partition, prediction
from batchers.dispatch import Dispatcher
from batchers.intake import Intake, Record
from batchers.settings import BatcherSettings
from clipstream.clock import now_us
from clipstream.errors import ClipstreamError, DecodeError
from clipstream.heap import freeze_startup_heap
from clipstream.settings import Settings
from schemas import decode_as, encode, from_tensor
from topics.catalogue import Catalogue
from topics.client import aiokafka_kwargs, producer_config

log = logging.getLogger("clipstream.batcher")


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
    spec: Any = None  # workers.spec.ModelSpec when the registry knows it


class BatcherService:
    """Decode, look up, queue, batch, produce: the I/O around one model's ``BatcherCore``."""

    def __init__(self, settings: Settings, bs: BatcherSettings, model: ModelSetup) -> None:
        self.settings = settings
        self.model = model
        self.cat = Catalogue.from_settings(settings)
        self.topic_predictions = self.cat.predictions.name
        self.topic_batches = self.cat.batches(model.name, model.replicas).name
        self.topic_deadletter = self.cat.deadletter.name
        objective_us = int(model.latency_objective_ms * 1000)
        dispatcher = Dispatcher(
            model.replicas,
            lambda: AIMD(objective_us, bs.aimd_step, model.max_batch_size, bs.aimd_start, fill=bs.aimd_fill),
            max_in_flight=bs.max_in_flight,
            batch_delay_us=int(model.batch_delay_ms * 1000),
            credit_timeout_us=int(bs.credit_timeout_ms * 1000),
            credit_lead_us=int(bs.credit_lead_ms * 1000) if bs.just_in_time else None,
        )
        self.core = BatcherCore(model.name, model.version, dispatcher, coalesce=model.cache,
                                drop_hopeless=bs.drop_hopeless, hopeless_margin_us=int(bs.hopeless_margin_ms * 1000))
        self.redis = aioredis.from_url(settings.redis_url) if model.cache else None
        self.wake = asyncio.Event()
        self.arrived: list[tuple[dict[str, Any], int]] = []
        self.arrived_event = asyncio.Event()
        self.outbox: list[tuple[str, bytes, int | None]] = []  # dead letters from ``accept``
        self.failed: list[tuple[int, dict[str, Any]]] = []  # error predictions from ``accept``
        self._tasks: set[asyncio.Task[None]] = set()  # coalesced requests being served
        self.counts = {"requests": 0, "cached": 0, "batched": 0, "batches": 0, "expired": 0, "errors": 0,
                       "send_errors": 0}
        self.producer = Producer(producer_config(settings))

    # -- producing --------------------------------------------------------------------
    # librdkafka, not faust's aiokafka producer: a record sent one at a time cost ~260–430 µs of
    # CPU through faust against ~70–110 µs through librdkafka, whose own thread does the I/O
    # (``python -m bench.intake``), and at batch size 1 the batcher sends one record per
    # query. ``produce`` only queues the record (acks=1); ``serve_deliveries`` reports failures.
    def _send_all(self, records: list[tuple[str, bytes, int | None]]) -> None:
        produce = self.producer.produce
        for topic, value, partition in records:
            if partition is None:
                produce(topic, value, on_delivery=self._delivered)
            else:
                produce(topic, value, partition=partition, on_delivery=self._delivered)
        self.producer.poll(0)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.counts["send_errors"] += 1
            log.warning("a record for %s was not delivered: %s", msg.topic(), err)

    async def serve_deliveries(self) -> None:
        """Delivery reports while nothing else polls the producer; at the end, wait for what is queued."""
        try:
            while True:
                self.producer.poll(0)
                await asyncio.sleep(0.1)
        finally:
            left = self.producer.flush(5)
            if left:
                log.warning("batcher %s stopped with %d records undelivered", self.model.name, left)

    def _emit(self, preds: list[tuple[int, dict[str, Any]]]) -> None:
        """One ``Predictions`` record per selector partition."""
        topic = self.topic_predictions
        self._send_all([(topic, encode("Predictions", record), partition)
                        for partition, record in by_partition(preds).items()])

    def _deadletter_record(self, reason: str, payload: bytes | None, where: tuple[str, int, int] | None,
                           query_id: str | None = None) -> tuple[str, bytes, int | None]:
        record = {
            "stage": "batcher",
            "reason": reason,
            "source_topic": where[0] if where else None,
            "source_partition": where[1] if where else None,
            "source_offset": where[2] if where else None,
            "query_id": query_id,
            "payload": payload,
            "created_us": now_us(),
        }
        return self.topic_deadletter, encode("DeadLetter", record), None

    # -- requests -----------------------------------------------------------------------
    def accept_group(self, records: list[Record]) -> None:
        """Records of ``requests.<model>`` as one fetch brought them: validate each, then wake
        the lookup task once. Synchronous (called on the loop by ``Intake``); what a bad record
        produces (dead letter, error prediction) goes out with the lookup task's next group."""
        for value, where in records:
            self._accept(value, where)
        self.arrived_event.set()

    def _accept(self, value: bytes | None, where: tuple[str, int, int]) -> None:
        arrival = now_us()
        try:
            request = decode_as("ModelRequest", value)  # type: ignore[arg-type]  # None: DecodeError
        except DecodeError as exc:
            self.outbox.append(self._deadletter_record(str(exc), value, where))
            return
        request["trace"]["batcher_in"] = arrival
        try:
            array = from_tensor(request["input"])
            if self.model.spec is not None:
                self.model.spec.input.check(array)
        except ClipstreamError as exc:
            self.counts["errors"] += 1
            self.outbox.append(self._deadletter_record(f"bad input: {exc}", value, where, request["query_id"]))
            p = Pending(request, None, arrival)
            self.failed.append((p.partition, prediction(p, self.model.name, self.core.version, "error", arrival,
                                                        error=f"bad input: {exc}")))
            return
        self.counts["requests"] += 1
        self.arrived.append((request, arrival))

    async def lookup_loop(self) -> None:
        """Group whatever arrived, look it up with one MGET, answer hits, queue misses."""
        while True:
            await self.arrived_event.wait()
            self.arrived_event.clear()
            group, self.arrived = self.arrived, []
            if self.outbox or self.failed:
                outbox, self.outbox = self.outbox, []
                failed, self.failed = self.failed, []
                self._send_all(outbox)
                if failed:
                    self._emit(failed)
            if not group:
                continue
            version = self.core.version
            pendings = [
                Pending(r, cache_key(self.model.name, version, r["input"]) if self.redis else None, t)
                for r, t in group
            ]
            values: list[bytes | None] = [None] * len(pendings)
            if self.redis is not None:
                try:
                    values = await self.redis.mget([p.key for p in pendings])
                except Exception as exc:  # Redis down: serve from the models, not from nothing
                    log.warning("cache lookup failed (%s); treating %d requests as misses", exc, len(pendings))
            hits: list[tuple[int, dict[str, Any]]] = []
            now = now_us()
            for p, raw in zip(pendings, values):
                output = self._decode_cached(raw)
                if output is not None:
                    hits.append((p.partition, prediction(p, self.model.name, version, "cached", now, output)))
                else:
                    self.core.admit(p)
            if hits:
                self.counts["cached"] += len(hits)
                self._emit(hits)
            if len(hits) < len(pendings):
                self.wake.set()

    @staticmethod
    def _decode_cached(raw: bytes | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        try:
            return decode_as("Tensor", raw)
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
                stats = decode_as("BatchStats", value)  # type: ignore[arg-type]  # None: DecodeError
            except DecodeError as exc:
                self.outbox.append(self._deadletter_record(str(exc), value, where))
                self.arrived_event.set()  # the lookup task sends the outbox
                continue
            keys += self.core.on_stats(stats, now)
        self.wake.set()  # credit is back
        if keys:
            task = asyncio.get_running_loop().create_task(self._serve_coalesced(keys))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _serve_coalesced(self, keys: list[str]) -> None:
        values: list[bytes | None] = [None] * len(keys)
        if self.redis is not None:
            try:
                values = await self.redis.mget(keys)
            except Exception as exc:
                log.warning("cache fetch for coalesced requests failed: %s", exc)
        now = now_us()
        out: list[tuple[int, dict[str, Any]]] = []
        for key, raw in zip(keys, values):
            output = self._decode_cached(raw)
            served, expired = self.core.deliver(key, output, now)
            out += [(p.partition, prediction(p, self.model.name, self.core.version, "cached", now, output))
                    for p in served]
            out += self._expired(expired, now)
        if out:
            self.counts["cached"] += sum(1 for _, p in out if p["status"] == "cached")
            self._emit(out)
        self.wake.set()  # requests sent back to the queue

    def _expired(self, pendings: list[Pending], now: int) -> list[tuple[int, dict[str, Any]]]:
        self.counts["expired"] += len(pendings)
        return [
            (p.partition, prediction(p, self.model.name, self.core.version, "expired", now,
                                     error="deadline passed while queued in the batcher"))
            for p in pendings
        ]

    # -- batching ---------------------------------------------------------------------------
    async def batch_loop(self) -> None:
        """Form every batch that is due, report expired requests, sleep until the next event."""
        while True:
            now = now_us()
            step = self.core.poll(now)
            out = []
            for sent in step.batches:
                self.counts["batches"] += 1
                self.counts["batched"] += len(sent.record["items"])
                out.append((self.topic_batches, encode("Batch", sent.record), sent.replica))
            if step.expired:
                topic = self.topic_predictions
                out += [(topic, encode("Predictions", record), partition)
                        for partition, record in by_partition(self._expired(step.expired, now)).items()]
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

    def stats_line(self) -> str:
        return json.dumps({"model": self.model.name, **self.counts, "queued": len(self.core.queue),
                           "replicas": self.core.dispatcher.stats()})

    def resize(self, replicas: int, version: str | None) -> None:
        """Follow the registry: a new replica count or a new version (new cache keys)."""
        if replicas != len(self.core.dispatcher.replicas):
            self.core.dispatcher.resize(replicas)
            log.warning("batcher %s: now %d replicas", self.model.name, replicas)
        self.core.version = version
        self.wake.set()


def faust_app(settings: Settings, app_id: str, datadir: str, consumer: bool = True, producer: bool = True,
              **overrides: Any) -> faust.App:
    """A faust app as clipstream runs one: raw bytes (our Avro codec decodes), no tables, no web
    server, topics created by ``topics.admin`` rather than by faust, records sent at once.
    ``consumer``/``producer`` False: faust does not start its own (the app's tasks do that I/O)."""
    options: dict[str, Any] = {
        "broker": "kafka://" + aiokafka_kwargs(settings)["bootstrap_servers"],
        "value_serializer": "raw",
        "key_serializer": "raw",
        "store": "memory://",
        "web_enabled": False,
        "topic_disable_leader": True,
        "topic_allow_declare": False,
        "datadir": datadir,
        "consumer_auto_offset_reset": "latest",
        "producer_linger": 0.0,
        "producer_acks": 1,
    }
    options.update(overrides)
    app = faust.App(app_id, **options)
    if not (consumer and producer):
        app.boot_strategy = BootStrategy(app, enable_kafka_consumer=consumer, enable_kafka_producer=producer)
    return app


def create_app(settings: Settings, bs: BatcherSettings, model: ModelSetup, follower: Any = None) -> faust.App:
    """The faust app of one model's batcher (run it with ``serve``)."""
    cat = Catalogue.from_settings(settings)
    group = f"{settings.topic_prefix}batcher.{model.name}"
    app = faust_app(settings, group, _datadir(model.name), consumer=False, producer=False)
    holder: dict[str, Any] = {}

    def service() -> BatcherService:
        # created inside the running loop (asyncio primitives and the Redis pool bind to it)
        if "s" not in holder:
            holder["s"] = BatcherService(settings, bs, model)
        return holder["s"]

    @app.task
    async def read_topics() -> None:
        svc = service()
        intakes = [
            Intake(settings, cat.requests(model.name).name, f"{group}.requests", svc.accept_group,
                   fetch_max_wait_ms=bs.fetch_max_wait_ms),
            Intake(settings, cat.batch_stats(model.name).name, group, svc.accept_stats,
                   fetch_max_wait_ms=bs.fetch_max_wait_ms),
        ]
        holder["intakes"] = intakes
        for intake in intakes:
            intake.start(asyncio.get_running_loop())
        try:
            await asyncio.Event().wait()
        finally:
            for intake in intakes:
                intake.stop()

    @app.task
    async def deliveries() -> None:
        await service().serve_deliveries()

    @app.task
    async def run_lookups() -> None:
        await service().lookup_loop()

    @app.task
    async def run_batches() -> None:
        await service().batch_loop()

    @app.task
    async def announce() -> None:
        while "intakes" not in holder or not all(i.ready.is_set() for i in holder["intakes"]):
            await asyncio.sleep(0.05)
        freeze_startup_heap()
        print(f"ready: batcher {model.name}", flush=True)
        svc = service()
        last = None
        while True:
            await asyncio.sleep(max(0.2, min(1.0, bs.stats_log_interval_s or 1.0)))
            if follower is not None:
                await _follow(svc, follower)
            if bs.stats_log_interval_s:
                line = svc.stats_line()
                if line != last:
                    print(f"stats: {line}", flush=True)
                    last = line

    return app


def _datadir(model: str) -> str:
    """Faust insists on a data dir; with no tables it stays empty, so a temporary one, removed at exit."""
    path = tempfile.mkdtemp(prefix=f"faust-batcher-{model}-")
    atexit.register(shutil.rmtree, path, True)
    return path


async def _wait_assigned(app: faust.App, topics: list[str]) -> None:
    """Until our partitions are assigned and their start offsets resolved (nothing is missed)."""
    while True:
        assigned = app.consumer.assignment()
        tps = [tp for tp in assigned if tp.topic in topics]
        if {tp.topic for tp in tps} >= set(topics):
            for tp in tps:
                try:
                    await app.consumer.position(tp)
                except Exception:  # a rebalance in between: try again
                    break
            else:
                return
        await asyncio.sleep(0.05)


async def _follow(svc: BatcherService, follower: Any) -> None:
    try:
        cfg = follower.view().model(svc.model.name)
    except Exception:  # the registry is only advice here; keep serving
        return
    if cfg is not None and (cfg.replicas != len(svc.core.dispatcher.replicas) or cfg.version != svc.core.version):
        replicas = max(1, int(cfg.replicas))
        if replicas > len(svc.core.dispatcher.replicas):
            from topics.admin import ensure_model_topics

            # topic creation blocks: keep it off the event loop
            await asyncio.get_running_loop().run_in_executor(
                None, ensure_model_topics, svc.settings, svc.model.name, replicas
            )
        svc.resize(replicas, cfg.version)


def _use_uvloop() -> None:
    """libuv's event loop (what ``faust -L uvloop`` picks): every request costs the batcher
    several loop wake-ups and socket calls, and uvloop makes each cheaper. Also the loop of
    faust's consumer thread, which is made from the same policy."""
    try:
        import uvloop
    except ImportError:  # an optional speed-up; asyncio's own loop works the same
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run(settings: Settings, bs: BatcherSettings, model: ModelSetup, follower: Any = None) -> None:
    """Run the batcher until SIGINT/SIGTERM."""
    from topics.admin import ensure_core_topics, ensure_model_topics

    ensure_core_topics(settings)
    ensure_model_topics(settings, model.name, model.replicas)
    if bs.uvloop:
        _use_uvloop()
    serve(create_app(settings, bs, model, follower))


def serve(app: faust.App) -> None:
    """Run a faust app until SIGINT/SIGTERM. Faust's own output (banner, spinner, logs) goes
    to stderr and stdout is not redirected into logging, so stdout carries only our lines
    ("ready: ...", "stats: ...")."""
    worker = faust.Worker(app, loglevel="WARNING", quiet=True, stdout=sys.stderr, redirect_stdouts=False)
    worker.spinner = None
    worker.execute_from_commandline()
