"""The selector process: its Kafka and Redis clients, the join and learn loops, and the join
group's membership (``clipstream selector``; any number of members share the partitions).

The join consumer reads ``queries`` and ``predictions`` with the range assignor, which gives
partition i of both topics to one member (the join needs a query and its predictions in one
process). Its offsets are stored by hand, once answered (``selector.handover``), and its
session is short, so a killed member's partitions move to the others within seconds.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer

from clipstream.redisclient import RedisGuard, sync_client
from clipstream.saver import PredictionSaver
from clipstream.settings import Settings
from registry.topic import RegistryFollower
from selector.handover import Handover
from selector.kafka import Apps
from selector.learn import Learner
from selector.reply_budget import ReplyBudget
from selector.service import Selector
from selector.settings import SelectorSettings
from selector.store import StateStore
from selector.trips import ModelTrips
from topics.catalogue import Catalogue
from topics.client import consumer_config
from topics.deadletters import DeadLetters
from topics.emitter import Emitter
from topics.membership import member_name, membership_config
from topics.metrics import LAG, expose, serve_metrics
from topics.offsets import pin_and_assign
from topics.stage import announce_ready


def join_consumer_config(settings: Settings, ss: SelectorSettings) -> dict[str, Any]:
    """The join group's consumer: offsets stored once answered, a short session, static
    membership when ``up`` named the member (a restart gets its partitions back without a
    rebalance), and a client id naming the process (``kafka-consumer-groups --describe``)."""
    return consumer_config(settings, ss.join_group(settings), **{
        "enable.auto.offset.store": False,
        "auto.commit.interval.ms": ss.commit_interval_ms,
        **membership_config(settings, member_name(), session_timeout_ms=ss.session_timeout_ms,
                            heartbeat_interval_ms=ss.heartbeat_interval_ms),
        "client.id": f"selector-{socket.gethostname()}-{os.getpid()}",
    })


class _Readiness:
    """Prints ``ready: selector`` once every loop asked for has its partitions: the join and
    learn consumers are assigned on their own threads, in either order."""

    def __init__(self, learn: bool, join: bool) -> None:
        self._waiting = {"join"} if join else set()
        self._waiting |= {"learn"} if learn else set()
        self._lock = threading.Lock()

    def assigned(self, part: str) -> None:
        with self._lock:
            if part in self._waiting:
                self._waiting.discard(part)
                if not self._waiting:
                    announce_ready("selector")

    def on_assign(self, name: str) -> Callable[[Consumer, list[Any]], None]:
        """A consumer's assignment callback: pin the offsets, then count this loop as ready."""
        def assign(consumer: Consumer, partitions: list[Any]) -> None:
            pin_and_assign(consumer, partitions)
            self.assigned(name)
        return assign


@dataclass
class _Clients:
    """What the join and learn loops share, gathered in one place so that shutdown closes
    exactly what setup opened, in its order."""

    catalogue: Catalogue
    follower: RegistryFollower
    producer: Emitter
    reply_producer: Emitter
    store: StateStore
    guard: RedisGuard
    saver: PredictionSaver | None
    apps: Apps
    dead: DeadLetters
    consumers: list[Consumer] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)


def _open_clients(settings: Settings, ss: SelectorSettings, join: bool) -> _Clients:
    """Connect to the registry, Kafka and Redis before either loop starts, so that a missing
    dependency fails the start rather than the first query."""
    catalogue = Catalogue.from_settings(settings)
    follower = RegistryFollower(settings).start()  # it ensures the core topics first: once is enough for a restart
    follower.wait_ready(ss.registry_timeout_s)
    producer = Emitter(settings, name="selector")
    reply_producer = Emitter(settings, name="selector replies")
    store = StateStore(sync_client(settings), settings.stored_predictions_ttl_s,
                       context_ttl_s=ss.context_state_ttl_s, max_contexts=ss.max_contexts)
    store.redis.ping()
    guard = RedisGuard(store.redis.ping, name="selector")  # join and learn share what they find
    saver = PredictionSaver(store.redis, store.ttl_s, guard, gather_s=ss.save_gather_ms / 1000.0).start() if join else None
    apps = Apps(follower.view, ss.policy_imports)
    dead = DeadLetters(producer, catalogue.deadletter.name, stage="selector", max_payload=65536)
    return _Clients(catalogue, follower, producer, reply_producer, store, guard, saver, apps, dead)


def _start_learner(settings: Settings, ss: SelectorSettings, clients: _Clients, ready: _Readiness,
                   stop: threading.Event) -> None:
    """Run the learn loop on its own thread, since the join loop (when there is one) keeps the
    main thread."""
    # offsets are stored by the learner as feedback is done with: never past one that
    # waits for Redis (``selector.learn``)
    group = f"{ss.join_group(settings)}.learn"
    member = membership_config(settings, member_name(), session_timeout_ms=ss.session_timeout_ms,
                               heartbeat_interval_ms=ss.heartbeat_interval_ms)  # a restart: no rebalance
    lc = Consumer(consumer_config(settings, group, **{"enable.auto.offset.store": False}, **LAG.config(group), **member))
    clients.consumers.append(lc)
    lc.subscribe([clients.catalogue.feedback.name], on_assign=ready.on_assign("learn"))
    learner = Learner(lc, clients.store, clients.apps, clients.dead, ss.learn_global, guard=clients.guard)
    expose(learner.metrics.registry)  # a --learn-only process serves these alone
    thread = threading.Thread(target=learner.run, args=(stop, ss.max_poll_s, ss.drain_max), name="learn", daemon=True)
    clients.threads.append(thread)
    thread.start()


def _run_join(settings: Settings, ss: SelectorSettings, clients: _Clients, ready: _Readiness,
              stop: threading.Event) -> None:
    """Build the dispatch+join selector and run it on this thread until ``stop``; its
    partitions move through the handover, which stores offsets only once answered."""
    jc = Consumer({**join_consumer_config(settings, ss), **LAG.config(ss.join_group(settings))})
    clients.consumers.append(jc)
    budget = ReplyBudget(int(ss.reply_budget_ms * 1000), int(ss.reply_budget_max_ms * 1000),
                         ss.reply_budget_quantile, max_share=ss.reply_budget_max_share)
    saver = clients.saver
    sel = Selector(jc, clients.producer, clients.store, clients.apps, clients.dead, clients.catalogue, settings,
                   ss.answered_capacity, budget, clients.reply_producer, guard=clients.guard,
                   save=saver.put if saver else None,
                   answered_window_s=ss.answered_window_s, state_fresh_s=ss.state_fresh_ms / 1000.0,
                   trips=ModelTrips(ss.hopeless_quantile), grouped=ss.fan_out == "grouped")
    # the apps' models' topics, before the first query needs them (``up`` applied its
    # app file before starting the selector, so the registry view has them)
    sel.prepare_model_topics(m for app in clients.follower.view().apps.values() for m in app.models)
    queries, predictions = clients.catalogue.queries.name, clients.catalogue.predictions.name
    sel.handover = handover = Handover(queries, predictions, sel.offsets, sel.join.drop_partitions,
                                       on_assigned=lambda: ready.assigned("join"))
    expose(sel.metrics.registry)
    jc.subscribe([queries, predictions], on_assign=handover.on_assign,
                 on_revoke=handover.on_revoke, on_lost=handover.on_lost)
    sel.run(stop, ss.max_poll_s, ss.drain_max)


def _close(clients: _Clients, stop: threading.Event) -> None:
    """Stop the loops and close every client in the one order that loses the least on a
    restart (see the reply producer below)."""
    stop.set()
    for t in clients.threads:
        t.join(timeout=5)
    if clients.saver is not None:
        clients.saver.close()
    clients.guard.close()
    # the reply producer first: its last acknowledgements store the last answered offsets,
    # which closing the consumer commits (its revoke callback), so a restart replays less
    clients.reply_producer.close(5)
    for c in clients.consumers:
        c.close()
    clients.producer.close(5)
    clients.follower.stop()
    print("selector stopped", file=sys.stderr, flush=True)


def serve(settings: Settings, ss: SelectorSettings, learn: bool = True, join: bool = True,
          stop: threading.Event | None = None) -> None:
    """Run dispatch+join and/or learn until ``stop``; print ``ready: selector`` once serving."""
    stop = stop or threading.Event()
    clients = _open_clients(settings, ss, join)
    ready = _Readiness(learn, join)
    serve_metrics("selector")
    try:
        if learn:
            _start_learner(settings, ss, clients, ready, stop)
        if join:
            _run_join(settings, ss, clients, ready, stop)
        else:
            stop.wait()
    finally:
        _close(clients, stop)
