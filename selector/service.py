"""The selector's Kafka/Redis adapter: dispatch (select), join (combine at all-arrived or at the
deadline), and learn (observe, in ``selector.learn``).

One consumer reads ``queries`` and ``predictions`` with the range assignor, so partition i of
both topics belongs to one member: a request carries the queries partition it came from, the
worker writes its prediction to that partition, and the join state for it is in this process.
The poll timeout is the time to the next deadline, so a deadline fires as a timer, not when
the next message happens to arrive.
"""

from __future__ import annotations

import copy
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

import redis
from confluent_kafka import Consumer, Producer

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError
from clipstream.heap import freeze_startup_heap
from clipstream.settings import Settings
from registry.topic import RegistryFollower
from schemas import decode_as, encode, from_tensor
from schemas.reasons import NOTHING_ARRIVED
from selector.join import JoinState, Pending
from selector.kafka import Apps, DeadLetters, log, pin_and_assign
from selector.learn import Learner
from selector.outputs import response_record, to_output
from selector.policies import Single, align_state
from selector.reply_budget import ReplyBudget
from selector.settings import SelectorSettings
from selector.store import StateStore
from selector.types import Query
from topics.admin import ensure_core_topics, ensure_model_topics
from topics.catalogue import Catalogue
from topics.client import consumer_config, producer_config

# built-in policies whose select and combine never read learned state (``single`` counts
# feedback only); any policy may say so itself with a ``stateless`` attribute
STATELESS_POLICIES: tuple[type, ...] = (Single,)

_NOT_LOADED = object()


def is_stateless(policy: Any) -> bool:
    """True when select/combine need no stored state, so dispatch skips Redis for it.

    A policy's own ``stateless`` attribute decides; otherwise only the built-ins listed above
    are stateless (a user's policy is assumed to need its state)."""
    flag = getattr(policy, "stateless", None)
    if flag is not None:
        return bool(flag)
    return type(policy) in STATELESS_POLICIES


class Selector:
    """Dispatch and join for the partitions this member owns."""

    def __init__(self, consumer: Consumer, producer: Producer, store: StateStore, apps: Apps,
                 dead: DeadLetters, catalogue: Catalogue, settings: Settings, answered_capacity: int = 100_000,
                 reply_budget: ReplyBudget | int = 0, reply_producer: Producer | None = None) -> None:
        # the straggler cutoff fires this much before the deadline, so that the answer's own
        # trip back to the caller fits inside the caller's SLO (an int: a fixed budget)
        self.reply_budget = reply_budget if isinstance(reply_budget, ReplyBudget) else ReplyBudget(reply_budget, 0)
        self.consumer, self.producer, self.store, self.apps, self.dead = consumer, producer, store, apps, dead
        # answers leave on a connection of their own: the broker serves one connection's
        # requests in order, so on the shared one a Response queued behind the fan-out of
        # ModelRequests just sent for newer queries
        self.reply_producer = reply_producer or producer
        self.catalogue, self.settings = catalogue, settings
        self.join = JoinState(answered_capacity)
        self._model_topics: set[str] = set()
        self.stats = {"queries": 0, "responses": 0, "defaults": 0, "stragglers": 0}

    # -- dispatch: select -----------------------------------------------------------
    def dispatch(self, msg: Any, ev: dict[str, Any] | None = None,
                 states: dict[tuple[str, str | None], Any] | None = None, poll: bool = True) -> None:
        """Select models for one query and send its requests.

        ``ev`` is the decoded QueryEvent when the caller already has it; ``states`` holds the
        policy states ``StateStore.load_many`` fetched for the whole poll group."""
        if ev is None:
            try:
                ev = decode_as("QueryEvent", msg.value())
            except ClipstreamError as exc:
                self.dead.send(f"undecodable query: {exc}", msg)
                return
        self.stats["queries"] += 1
        qid, now = ev["query_id"], now_us()
        try:
            app, policy, outputs = self.apps.get(ev["app"])
            query = Query(qid, app.name, ev.get("context"), from_tensor(ev["input"]), ev["deadline_us"])
            if is_stateless(policy):
                stored = None
            else:
                stored = _NOT_LOADED if states is None else states.get((app.name, query.context or None), _NOT_LOADED)
                if stored is _NOT_LOADED:
                    stored = self.store.load(app.name, query.context)
                elif stored is not None:
                    stored = copy.deepcopy(stored)  # each query its own dict, as a load gives it
            state = align_state(policy, stored, app.models)
            chosen = [m for m in policy.select(state, query) if m in app.models]
        except ClipstreamError as exc:
            self.dead.send(str(exc), msg, qid)
            self._reply(ev, response_record(ev, None, 0.0, [], [], None, now_us(), None, str(exc)))
            return
        trace = dict(ev.get("trace") or {})
        trace["dispatched"] = now
        meta = {"event": {k: ev.get(k) for k in ("query_id", "app", "deadline_us", "reply_topic", "reply_partition")},
                "trace": trace, "context": query.context, "state": state, "query": query}
        # the join's cutoff leaves the reply its budget; a query with no prediction by then
        # waits to the budget's floor (its last resort) rather than take the default at once.
        # The models' deadline is that last resort: a prediction later than it is never used.
        cutoff_us = ev["deadline_us"] - self.reply_budget.us
        last_resort_us = ev["deadline_us"] - self.reply_budget.floor_us
        self.join.register(qid, chosen, cutoff_us, last_resort_us=last_resort_us if chosen else None, **meta)
        if not chosen or ev["deadline_us"] <= now:
            return  # answered by the timer with the default
        for model in chosen:
            self._ensure_model_topic(model)
            request = {"query_id": qid, "app": app.name, "model": model, "input": ev["input"],
                       "deadline_us": last_resort_us, "selector_partition": msg.partition(), "trace": trace}
            self.producer.produce(self.catalogue.requests(model).name, encode("ModelRequest", request), key=qid.encode())
        if poll:
            self.producer.poll(0)

    def _ensure_model_topic(self, model: str) -> None:
        if model not in self._model_topics:
            ensure_model_topics(self.settings, model)
            self._model_topics.add(model)

    # -- join: combine ----------------------------------------------------------------
    def collect(self, msg: Any, received_us: int | None = None) -> None:
        """Join one ``Predictions`` record; ``received_us`` is when its poll returned (the
        ``selector_in`` stamp, so the join's own time is told apart from the Kafka hop)."""
        received_us = received_us or now_us()
        try:
            batch = decode_as("Predictions", msg.value())
        except ClipstreamError as exc:
            self.dead.send(f"undecodable predictions: {exc}", msg)
            return
        for item in batch["items"]:
            pending = self.join.get(item["query_id"])
            if pending is not None:  # the last prediction's stage stamps ride on the Response
                pending.meta["trace"].update(item.get("trace") or {})
                pending.meta["trace"]["selector_in"] = received_us
            output = None
            if pending is not None and item["status"] in ("ok", "cached") and item.get("output") is not None:
                try:
                    _, _, outs = self.apps.get(pending.meta["event"]["app"])
                    spec = self.apps.view().models.get(item["model"])
                    kind = spec.spec.output.kind if spec and spec.spec else outs.kind
                    output = to_output(item["output"], kind, outs.labels)
                except ClipstreamError as exc:
                    item = dict(item, status="error", error=f"undecodable output: {exc}")
            done = self.join.add(item["query_id"], item["model"], item["status"], output, item.get("error"))
            if done is not None:
                self.answer(done)

    def answer(self, pending: Pending, late_us: int | None = None) -> None:
        """combine with what arrived; the stragglers are named and lower the confidence.
        ``late_us``: for a query answered by the cutoff timer, how long after it was due."""
        ev, now = pending.meta["event"], now_us()
        ev = dict(ev, trace=pending.meta["trace"])
        missing = pending.missing
        self.stats["stragglers"] += sum(1 for m in missing if m not in pending.failed)
        try:
            app, policy, outputs = self.apps.get(ev["app"])
            default = app.default_output
        except ClipstreamError:
            app, policy, outputs, default = None, None, None, None
        if not pending.arrived or policy is None:
            reason = ("every model failed: " + "; ".join(f"{m}: {e}" for m, e in pending.failed.items())
                      if pending.failed and len(pending.failed) == len(pending.expected)
                      else NOTHING_ARRIVED)
            if not pending.expected:
                reason = "the policy selected no model"
            self.stats["defaults"] += 1
            record = response_record(ev, None, 0.0, [], missing, None, now, default, reason)
            self._reply(ev, record, late_us)
            return
        answer, confidence = policy.combine(pending.meta["state"], pending.meta["query"], dict(pending.arrived))
        record = response_record(ev, answer, confidence, list(pending.arrived), missing, outputs.labels, now)
        self._reply(ev, record, late_us)  # the caller first; learn waits for the stored predictions if need be
        self.store.save_predictions(pending.query_id, {
            "app": ev["app"], "context": pending.meta["context"], "answer": answer.to_json(),
            "predictions": {m: o.to_json() for m, o in pending.arrived.items()}})

    def _reply(self, ev: dict[str, Any], record: dict[str, Any], late_us: int | None = None) -> None:
        topic = ev.get("reply_topic") or self.catalogue.responses.name
        kwargs: dict[str, Any] = {"key": ev["query_id"].encode()}
        if ev.get("reply_topic") and ev.get("reply_partition") is not None:
            kwargs["partition"] = int(ev["reply_partition"])
        # only answers made at the cutoff teach the budget: it is for them (an answer complete
        # earlier has time to spare), and their trips come when every stage is busy with newer
        # queries. Reports are served by ``run``'s reply-acks thread.
        if self.reply_budget.adaptive and late_us is not None:
            kwargs["on_delivery"] = functools.partial(self._reply_acked, late_us=late_us)
        self.reply_producer.produce(topic, encode("Response", record), **kwargs)
        if not self.reply_budget.adaptive:
            self.reply_producer.poll(0)
        self.stats["responses"] += 1

    def _reply_acked(self, err: Any, msg: Any, *, late_us: int) -> None:
        """Delivery report of a Response: its trip to the broker and back, from when the answer
        was due, feeds the budget (``latency()`` runs to now, so this must be served as the
        report arrives)."""
        trip_s = None if err is not None else msg.latency()
        if trip_s is not None:
            self.reply_budget.observe(int(trip_s * 1e6) + late_us)

    # -- the loop -----------------------------------------------------------------------
    def handle(self, msgs: list[Any], queries: str | None = None, received_us: int | None = None) -> None:
        """One poll group, in order: the policy states of all its queries come from one MGET
        (none at all for stateless policies), and the producer is polled once at the end."""
        queries = queries or self.catalogue.queries.name
        received_us = received_us or now_us()
        events: list[Any] = [None] * len(msgs)
        pairs: list[tuple[str, str | None]] = []
        for i, m in enumerate(msgs):
            if m.error() or m.topic() != queries:
                continue
            try:
                ev = events[i] = decode_as("QueryEvent", m.value())
                _, policy, _ = self.apps.get(ev["app"])
                if not is_stateless(policy):
                    pairs.append((ev["app"], ev.get("context") or None))
            except Exception:  # dispatch reports it (dead letter or default answer)
                continue
        states: dict[tuple[str, str | None], Any] = {}
        if pairs:
            try:
                states = self.store.load_many(pairs)
            except Exception:  # Redis hiccup: each query tries on its own and reports its error
                log.exception("loading policy states for %d queries failed", len(pairs))
        # predictions first, then the answers now due, then the new queries: a group can hold
        # many queries, each a fan-out of requests, and a straggler cutoff that waits behind
        # them fires late (the predictions in the group arrived before it, so they still count)
        for m in msgs:
            if m.error():
                log.warning("consumer: %s", m.error())
            elif m.topic() != queries:
                self._guarded(m, self.collect, m, received_us)
        self.answer_expired()
        for i, m in enumerate(msgs):
            if not m.error() and m.topic() == queries:
                self._guarded(m, self.dispatch, m, events[i], states, False)  # poll=False: once below
        self.producer.poll(0)

    def _guarded(self, m: Any, work: Callable[..., None], *args: Any) -> None:
        try:
            work(*args)
        except Exception:  # one bad record must not stop the selector
            log.exception("record %s[%s]@%s failed", m.topic(), m.partition(), m.offset())

    def answer_expired(self) -> None:
        """The straggler cutoff: answer every query whose deadline has come with what arrived."""
        for pending in self.join.expired(now_us()):
            try:
                # the cutoff was due at ``deadline_us``: the reply's budget must cover how late
                # this loop got to it (the CPU was elsewhere) as well as the trip to the broker
                self.answer(pending, late_us=max(0, now_us() - pending.deadline_us))
            except Exception:
                log.exception("answering %s failed", pending.query_id)

    def run(self, stop: threading.Event, max_poll_s: float = 0.1, drain_max: int = 500) -> None:
        queries = self.catalogue.queries.name
        acks: threading.Thread | None = None
        if self.reply_budget.adaptive:
            # a delivery report's latency runs until the report is served, so the reply
            # producer is polled by a thread of its own, which serves each one as it comes
            acks = threading.Thread(target=_serve_reports, args=(self.reply_producer, stop),
                                    name="reply-acks", daemon=True)
            acks.start()
        while not stop.is_set():
            due = self.join.next_deadline()
            timeout = max_poll_s if due is None else min(max_poll_s, max(0.0, (due - now_us()) / 1e6))
            msg = self.consumer.poll(timeout)
            received = now_us()
            msgs = [msg, *self.consumer.consume(drain_max, 0)] if msg is not None else []
            if msgs:
                self.handle(msgs, queries, received)
            self.answer_expired()
        if acks is not None:
            acks.join(timeout=1)  # before the caller flushes the reply producer on this thread


def _serve_reports(producer: Producer, stop: threading.Event) -> None:
    while not stop.is_set():
        producer.poll(0.05)


def serve(settings: Settings, ss: SelectorSettings, learn: bool = True, join: bool = True,
          stop: threading.Event | None = None) -> None:
    """Run dispatch+join and/or learn until ``stop``; print ``ready: selector`` once serving."""

    stop = stop or threading.Event()
    catalogue = Catalogue.from_settings(settings)
    ensure_core_topics(settings)
    follower = RegistryFollower(settings).start()
    follower.wait_ready(ss.registry_timeout_s)
    producer = Producer(producer_config(settings))
    reply_producer = Producer(producer_config(settings))
    store = StateStore(redis.Redis.from_url(settings.redis_url), settings.stored_predictions_ttl_s)
    store.redis.ping()
    apps, dead = Apps(follower.view), DeadLetters(producer, catalogue.deadletter.name)
    waiting = {"join"} if join else set()
    waiting |= {"learn"} if learn else set()
    lock = threading.Lock()

    def assigned(part: str) -> None:
        with lock:
            if part in waiting:
                waiting.discard(part)
                if not waiting:
                    freeze_startup_heap()
                    print("ready: selector", flush=True)

    def on_assign(name: str) -> Any:
        return lambda c, parts: pin_and_assign(c, parts, lambda: assigned(name))

    consumers: list[Consumer] = []
    threads: list[threading.Thread] = []
    try:
        if learn:
            lc = Consumer(consumer_config(settings, f"{ss.group}.learn"))
            consumers.append(lc)
            lc.subscribe([catalogue.feedback.name], on_assign=on_assign("learn"))
            learner = Learner(lc, store, apps, dead, ss.learn_global)
            threads.append(threading.Thread(target=learner.run, args=(stop, ss.max_poll_s, ss.drain_max),
                                            name="learn", daemon=True))
            threads[-1].start()
        if join:
            jc = Consumer(consumer_config(settings, ss.group))
            consumers.append(jc)
            jc.subscribe([catalogue.queries.name, catalogue.predictions.name], on_assign=on_assign("join"))
            budget = ReplyBudget(int(ss.reply_budget_ms * 1000), int(ss.reply_budget_max_ms * 1000),
                                 ss.reply_budget_quantile)
            sel = Selector(jc, producer, store, apps, dead, catalogue, settings, ss.answered_capacity,
                           budget, reply_producer)
            sel.run(stop, ss.max_poll_s, ss.drain_max)
        else:
            stop.wait()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        for c in consumers:
            c.close()
        producer.flush(5)
        reply_producer.flush(5)
        follower.stop()
        print("selector stopped", file=sys.stderr, flush=True)
