"""The batcher process: asyncio tasks around one ``BatcherService`` per model.

The tasks are the intake, delivery reports, each model's cache lookups and batching loop, and
readiness; ``topics.stage.run_tasks`` runs them until SIGTERM and cancels them so each closes
what it opened. The batcher's Kafka I/O is one record per query at batch size 1, and
librdkafka's own threads do it with far less Python per record than an asyncio Kafka client
(docs/design/0009). Both kinds of topic it reads, ``requests.<model>`` and
``batch-stats.<model>`` (one record per batch), come in through ``topics.intake`` consumer
threads; what it writes goes out through a ``topics.emitter`` producer. No stream framework
runs the process: a restarted member is back in its group sooner without one to import and
boot (docs/design/0046).
One process may serve several models (``create_tasks``); every decision lives in ``core.py``
and the modules under it, and the I/O of one model in ``service.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

from confluent_kafka import TopicPartition

from batchers.group import GroupService
from batchers.metrics import batcher_registry
from batchers.offsets import Part, RequestHandover, RequestOffsets
from batchers.service import BatcherService, ModelSetup
from batchers.settings import BatcherSettings
from clipstream.errors import ConfigError
from clipstream.redisclient import RedisGuard, async_client, sync_client
from clipstream.settings import Settings
from registry.groups import GroupConfig
from topics.admin import ensure_model_topics, ensure_stage_topics, partition_count
from topics.catalogue import Catalogue
from topics.emitter import Emitter
from topics.intake import Intake, Record
from topics.membership import member_name, membership_config
from topics.metrics import LAG, expose, serve_metrics
from topics.saturation import Saturation
from topics.stage import CAPACITY_ADVICE, Task, alert, announce_ready, beat_on_loop, note, run_tasks

log = logging.getLogger("clipstream.batcher")

__all__ = ["BatcherProcess", "create_tasks", "deliver_by_topic", "group_name", "run"]


# a group new with its models reads the requests sent this long before its process started:
# the selector sends a model requests from the moment the registry names it, and ``up`` starts
# the batcher that serves it (or the shared one that now does) at about the same time
NEW_GROUP_LOOKBACK_S = 10.0


def group_name(settings: Settings, models: list[ModelSetup]) -> str:
    """The consumer group of a batcher process: one model keeps ``batcher.<model>``, so its
    offsets carry over between runs; several models share one group named after them all."""
    names = "+".join(sorted(m.name for m in models))
    if len(names) > 180:  # keep group ids short; the names stay in the log lines
        names = "shared-" + hashlib.sha1(names.encode()).hexdigest()[:12]
    return f"{settings.topic_prefix}batcher.{names}"


def deliver_by_topic(records: list[Record], services: dict[str, Any],
                     accept: Callable[[Any, list[Record]], None]) -> None:
    """One fetch's records, split by topic, each part to the service of its topic's model; one
    model's failure must not cost the others their records."""
    parts: dict[str, list[Record]] = {}
    for record in records:
        parts.setdefault(record[1][0], []).append(record)
    for topic, part in parts.items():
        try:
            accept(services[topic], part)
        except Exception:
            log.exception("batcher: %d records of %s failed", len(part), topic)


def create_tasks(settings: Settings, bs: BatcherSettings, models: list[ModelSetup],
                 follower: Any = None, member: str | None = None) -> list[Task]:
    """The tasks of a batcher process serving one or several models (run them with ``run_tasks``).

    Every model keeps its own queue, AIMD state and credit (its own ``BatcherService``); what
    the models share is the process: one consumer for all their request topics, one for all
    their worker reports, one producer, one Redis client. On a small machine that is the
    point: one process per model would wake every one of them for each query of an ensemble;
    one batcher for all of them is woken once (docs/design/0010).

    Several processes for the same models are members of one group that share the models'
    request partitions (docs/design/0024); ``member`` (else ``CLIPSTREAM_MEMBER``) makes this
    one a static member, so a restart gets its partitions back at once."""
    return BatcherProcess(settings, bs, models, follower, member).tasks()


class BatcherProcess:
    """What a batcher process's tasks share: its models' services, built lazily on the running
    loop, and the intakes that feed them."""

    def __init__(self, settings: Settings, bs: BatcherSettings, models: list[ModelSetup],
                 follower: Any = None, member: str | None = None) -> None:
        if not models or len({m.name for m in models}) != len(models):
            raise ConfigError(f"a batcher needs distinct models, got {[m.name for m in models]}")
        self.settings, self.bs, self.models, self.follower = settings, bs, models, follower
        self.cat = Catalogue.from_settings(settings)
        self.group = group_name(settings, models)
        self.member = _member(member or member_name())
        self.label = ",".join(m.name for m in models)
        self.offsets = RequestOffsets()  # what this member may commit (docs/design/0024)
        self.started = time.time()
        self._services: dict[str, BatcherService] = {}
        self._emitter: Emitter | None = None
        self._intakes: list[Intake] = []
        expose(batcher_registry(lambda: self._services))

    def tasks(self) -> list[Task]:
        loops = [loop for m in self.models for loop in self._model_loops(m.name)]  # each model's own
        return [self.read_topics, self.deliveries, *loops, self.announce]

    def services(self) -> dict[str, BatcherService]:
        """Created inside the running loop: asyncio primitives and the Redis pool bind to it."""
        if not self._services:
            self._emitter = Emitter(self.settings, name=f"batcher {self.label}")
            redis = async_client(self.settings)  # bounded waits (CLIPSTREAM_REDIS_TIMEOUT_MS)
            guard = RedisGuard(sync_client(self.settings).ping, name="batcher")
            services = {m.name: (GroupService if m.members else BatcherService)(
                self.settings, self.bs, m, self._emitter.producer, redis, guard, self.offsets)
                for m in self.models}
            # an ensemble's request record names them all; a group takes its members' requests
            siblings = {**{member: services[m.name] for m in self.models for member in m.members}, **services}
            # a request asking for a partition ``predictions`` lacks is refused, not held for good
            partitions = partition_count(self.settings, self.cat.predictions.name)
            for service in services.values():
                service.siblings = siblings
                service.predictions_partitions = partitions
            self._services = services
        return self._services

    def _route(self, accept: Callable[[BatcherService, list[Record]], None],
               topic_model: dict[str, str]) -> Callable[[list[Record]], None]:
        by_topic = {topic: self.services()[model] for topic, model in topic_model.items()}  # once, not per fetch
        return lambda records: deliver_by_topic(records, by_topic, accept)

    def _open_intakes(self, loop: asyncio.AbstractEventLoop) -> list[Intake]:
        """Requests: a consumer group whose members share each model's partitions and store
        only what is done. Worker reports: every member reads them all, with no group (a
        member's own batches' reports give its credit back; the others' are ignored)."""
        cat, bs, models = self.cat, self.bs, self.models
        requests = {cat.requests(n).name: m.name for m in models for n in (m.members or [m.name])}
        stats = {cat.batch_stats(m.name).name: m.name for m in models}

        def shares(owned: set[Part]) -> None:  # on the loop: each model's share of its replicas' credit
            for m in models:
                topics = [t for t, name in requests.items() if name == m.name]
                self.services()[m.name].share(sum(1 for t, _ in owned if t in topics),
                                              sum(cat.requests(n).partitions for n in (m.members or [m.name])))

        handover = RequestHandover(self.offsets, lambda owned: loop.call_soon_threadsafe(shares, owned),
                                   since_ms=int((self.started - NEW_GROUP_LOOKBACK_S) * 1000))
        return [
            Intake(self.settings, list(requests), f"{self.group}.requests",
                   self._route(BatcherService.accept_group, requests),
                   fetch_max_wait_ms=bs.fetch_max_wait_ms, rebalance=handover,
                   **{"enable.auto.offset.store": False, "auto.commit.interval.ms": bs.commit_interval_ms,
                      "client.id": f"batcher-{socket.gethostname()}-{os.getpid()}"},  # names it in the group
                   **LAG.config(f"{self.group}.requests"),
                   **membership_config(self.settings, self.member, session_timeout_ms=bs.session_timeout_ms,
                                       heartbeat_interval_ms=bs.heartbeat_interval_ms)),
            Intake(self.settings, list(stats), self.group, self._route(BatcherService.accept_stats, stats),
                   fetch_max_wait_ms=bs.fetch_max_wait_ms, assign=[TopicPartition(t, 0) for t in stats],
                   **LAG.config(self.group)),
        ]

    async def read_topics(self) -> None:
        loop = asyncio.get_running_loop()
        intakes = self._open_intakes(loop)
        self._intakes = intakes
        for intake in intakes:
            intake.start(loop)
        try:
            while True:  # the offsets of requests done, for the next auto-commit
                await asyncio.sleep(0.1)
                done = self.offsets.take()
                if done:
                    intakes[0].store(done)
        finally:
            for intake in intakes:
                intake.stop()

    async def deliveries(self) -> None:
        self.services()
        assert self._emitter is not None
        await self._emitter.serve_reports()

    def _model_loops(self, name: str) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        async def lookups() -> None:
            await self.services()[name].lookup_loop()

        async def batches() -> None:
            await self.services()[name].batch_loop()

        for loop in (lookups, batches):
            loop.__qualname__ = loop.__name__ = f"{loop.__name__}_{name}"
        return [lookups, batches]

    async def announce(self) -> None:
        """Ready once every intake is; then the loop's heartbeat, the registry's replicas and
        versions followed, and a stats line whenever it changes."""
        while not self._intakes or not all(i.ready.is_set() for i in self._intakes):
            await asyncio.sleep(0.05)
        announce_ready("batcher", self.label)
        beat_on_loop("batcher")  # the event loop's proof of life for `up`
        last: dict[str, str] = {}
        interval = self.bs.stats_log_interval_s
        saturation = Saturation()
        while True:
            await asyncio.sleep(max(0.2, min(1.0, interval or 1.0)))
            for name, svc in self.services().items():
                if self.follower is not None:
                    await _follow(svc, self.follower)
                _say_if_saturated(saturation, name, svc)
                if interval:
                    line = svc.stats_line()
                    if line != last.get(name):
                        print(f"stats: {line}", flush=True)
                        last[name] = line


def _member(name: str | None) -> str | None:
    """A member name as a group instance id allows it (a shared batcher's stage name has '+')."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) if name else None


async def _follow(svc: BatcherService, follower: Any) -> None:
    try:
        cfg = follower.view().served().get(svc.model.name)
    except Exception:  # the registry is only advice here; keep serving
        return
    if isinstance(svc, GroupService) and isinstance(cfg, GroupConfig):
        svc.follow(cfg.version, cfg.member_versions)
    if cfg is not None:
        bs = svc.bs
        knobs = (_or(cfg.latency_objective_ms, bs.latency_objective_ms), _or(cfg.max_batch_size, bs.max_batch_size),
                 _or(cfg.batch_delay_ms, bs.batch_delay_ms))
        if svc.retune(*knobs):
            m = svc.model
            note("batcher", f"model {m.name}: batching now latency_objective_ms={m.latency_objective_ms:g} "
                            f"max_batch_size={m.max_batch_size} batch_delay_ms={m.batch_delay_ms:g} (from the registry)")
    if cfg is not None and (cfg.replicas != len(svc.core.dispatcher.replicas) or cfg.version != svc.core.version):
        replicas = max(1, int(cfg.replicas))
        if replicas > len(svc.core.dispatcher.replicas):
            # topic creation and the metadata round trip block: keep them off the event loop
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, ensure_model_topics, svc.settings, svc.model.name, replicas)
            # a new replica gets batches only once the producer knows its partition: librdkafka
            # refuses a record for one beyond its cached partition count
            if not await loop.run_in_executor(None, svc.knows_partitions, svc.topic_batches, replicas):
                log.warning("batcher %s: the producer does not know %d partitions of %s yet; "
                            "trying again", svc.model.name, replicas, svc.topic_batches)
                return
        svc.resize(replicas, cfg.version, cfg.spec)


def _say_if_saturated(saturation: Saturation, name: str, svc: BatcherService) -> None:
    """An alert (``up`` prints it) when many of a model's requests are given up or expire."""
    share = saturation.check(name, time.monotonic(), svc.counts["requests"], svc.counts["expired"])
    if share is not None:
        # how long one call takes, to weigh the advice below against the SLO
        took = [r.service_us for r in svc.core.dispatcher.replicas if r.service_us > 0]
        pace = f" (its batches took {max(took) / 1000:.1f} ms lately, the median on its slowest replica)" if took else ""
        alert("batcher", f"model {name}: {share:.0%} of its requests were given up or expired before their deadline "
                         f"over the last {saturation.window_s:g} s: its replicas cannot serve them in time{pace}; "
                         f"{CAPACITY_ADVICE} (clipstream set-replicas {name} N), or let its batches grow "
                         "(latency_objective_ms, max_batch_size); if one call of the model takes longer than "
                         "an app's SLO, neither helps: raise it (clipstream register-app APP --slo-ms N); "
                         "unless no worker has the model loaded: `clipstream inspect` then says NOT LOADED, and why")


def _or(value: Any, default: Any) -> Any:
    """The registry's value, or the batcher's default where the registry has none."""
    return default if value is None else value


def _use_uvloop() -> None:
    """libuv's event loop: every request costs the batcher several loop wake-ups and socket
    calls, and uvloop makes each cheaper."""
    try:
        import uvloop
    except ImportError:  # an optional speed-up; asyncio's own loop works the same
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run(settings: Settings, bs: BatcherSettings, models: list[ModelSetup], follower: Any = None,
        member: str | None = None) -> None:
    """Run the batcher until SIGINT/SIGTERM."""
    ensure_stage_topics(settings, {m.name: m.replicas for m in models})
    if bs.uvloop:
        _use_uvloop()
    serve_metrics("batcher")
    raise SystemExit(run_tasks(create_tasks(settings, bs, models, follower, member)))
