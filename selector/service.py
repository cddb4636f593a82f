"""The selector's Kafka/Redis adapter: dispatch (select), join (combine at all-arrived or at the
deadline), and learn (observe, in ``selector.learn``).

One consumer reads ``queries`` and ``predictions`` with the range assignor, so partition i of
both topics belongs to one member: a request carries the queries partition it came from, the
worker writes its prediction to that partition, and the join state for it is in this process.
A query's offset is committed only once its Response is acknowledged (``selector.handover``);
the process around this (clients, loops, group membership) is ``selector.process``.
The poll timeout is the time to the next deadline, so a deadline fires as a timer, not when
the next message happens to arrive.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError, InputError
from clipstream.redisclient import RedisGuard
from clipstream.settings import Settings
from registry.outputs import stored_answer
from schemas import ModelRequest, Predictions, QueryEvent, decode_as, encode
from schemas.reasons import EXPIRED_ON_ARRIVAL, OK_STATUSES, refused_input
from selector.checks import EMPTY_QUERY_ID, deadline_problem, reply_problem
from selector.handover import Handover, QueryOffsets
from selector.join import NOT_ASKED, Asked, JoinState, Pending, gave_nothing, why_default
from selector.kafka import Apps, log
from selector.metrics import SelectorMetrics
from selector.outputs import response_record, to_output
from selector.policies import align_state, as_versions, is_stateless
from selector.policy_states import STATE_WAIT_S, PolicyStates
from selector.replies import Replies
from selector.reply_budget import ReplyBudget
from selector.store import StateStore
from selector.trips import ModelTrips
from selector.types import Query, State
from topics.admin import ensure_topics
from topics.catalogue import Catalogue
from topics.deadletters import DeadLetters
from topics.emitter import Emitter
from topics.sizes import input_limit, too_large_input
from topics.stage import IDLE_POLL_S, fail_if_fatal, heartbeat


class Selector(PolicyStates, Replies):
    """Dispatch and join for the partitions this member owns."""

    def __init__(self, consumer: Consumer, producer: Emitter, store: StateStore, apps: Apps,
                 dead: DeadLetters, catalogue: Catalogue, settings: Settings, answered_capacity: int = 100_000,
                 reply_budget: ReplyBudget | int = 0, reply_producer: Emitter | None = None,
                 guard: RedisGuard | None = None, save: Callable[[str, dict[str, Any]], None] | None = None,
                 answered_window_s: float = 60.0, state_fresh_s: float = 0.0,
                 trips: ModelTrips | None = None, grouped: bool = True) -> None:
        # the straggler cutoff fires this much before the deadline, so that the answer's own
        # trip back to the caller fits inside the caller's SLO (an int: a fixed budget)
        self.reply_budget = reply_budget if isinstance(reply_budget, ReplyBudget) else ReplyBudget(reply_budget, 0)
        self.consumer, self.producer, self.store, self.apps, self.dead = consumer, producer, store, apps, dead
        # answers leave on a connection of their own: the broker serves one connection's
        # requests in order, so on the shared one a Response queued behind the fan-out of
        # ModelRequests just sent for newer queries
        self.reply_producer = reply_producer or producer
        self.catalogue, self.settings = catalogue, settings
        self.max_input_bytes = input_limit(settings.max_record_bytes) if settings is not None else sys.maxsize
        self.join = JoinState(answered_capacity, int(answered_window_s * 1e6))
        # what may be committed: a query's offset once its Response is acknowledged; ``serve``
        # adds the rebalance side (``selector.handover``)
        self.offsets = QueryOffsets()
        self.handover: Handover | None = None
        self._model_topics: set[str] = set()
        # an ensemble's requests for a query go as one record (``ModelRequest.also``), or one
        # per model where a batcher process serves each model alone (docs/design/0082)
        self.grouped = grouped
        self.stats = {"queries": 0, "responses": 0, "defaults": 0, "stragglers": 0, "recalled_states": 0,
                      "not_asked": 0}
        # each model's recent trips: a model that cannot answer in the time a query has
        # left is not asked (ModelTrips(0) asks every model)
        self.trips = trips if trips is not None else ModelTrips(0.0)
        # while Redis is away, states come from the store's memory (no wait on Redis per group);
        # ``save`` stores what the join combined (``serve`` gives a PredictionSaver's: off the
        # answer path)
        self.guard = guard or RedisGuard(lambda: store.redis.ping(), name="selector")
        # the join thread waits this long at most for a group's states; a slower read (Redis
        # frozen, up to its socket timeout) finishes off the thread into the store's memory,
        # and the group is served from memory (docs/design/0023)
        self.state_wait_s = STATE_WAIT_S
        # states read this recently are used from the store's memory, with no round trip
        # (0: every poll group asks Redis)
        self.state_fresh_s = state_fresh_s
        self._state_reader = None
        self._state_read = None  # a read still out: no second one meanwhile
        self.save = save or store.save_predictions
        self.metrics = SelectorMetrics()
        self.metrics.reply_budget(lambda: self.reply_budget.us)
        self.metrics.global_state = self._global_state

    def _global_state(self, name: str) -> State | None:
        """The app's global weights as its next query with no context is selected with: what
        the learner (sharing the store) has taught since, over the app's models and versions
        now (a stored state may predate a link, an unlink or a rollout). ``{}`` for an app that
        selects nothing now (removed, or with no model linked): it has no weights to show."""
        try:
            app, policy, _ = self.apps.get(name)
        except ClipstreamError:
            return {}
        state = self.store.recall([(name, None)])[(name, None)]
        return None if state is None else align_state(policy, state, app.models, self.apps.versions(name))

    # -- dispatch: select -----------------------------------------------------------
    def dispatch(self, msg: Any, ev: QueryEvent | None = None,
                 states: dict[tuple[str, str | None], State | None] | None = None, poll: bool = True) -> None:
        """Select models for one query and send its requests.

        ``ev`` is the decoded QueryEvent when the caller already has it; ``states`` holds the
        policy states ``StateStore.load_many`` fetched for the whole poll group."""
        if ev is None:
            try:
                ev = decode_as(QueryEvent, msg.value())
            except ClipstreamError as exc:
                self.dead.send(reason=f"undecodable query: {exc}", msg=msg)
                return
        self.stats["queries"] += 1
        qid, now = ev.query_id, now_us()
        if not qid:  # no Response: nobody could match one keyed b''
            self.dead.send(reason=EMPTY_QUERY_ID, msg=msg)
            return
        nowhere = reply_problem(ev, self.catalogue)
        if nowhere is not None:  # answered where every caller may read, never where it asked
            self._refuse(msg, dataclasses.replace(ev, reply_topic=None, reply_partition=None), nowhere)
            return
        try:
            app, policy, outputs = self.apps.get(ev.app)
            too_long = deadline_problem(ev, app, now)
            if too_long is not None:
                raise InputError(too_long)
            if len(ev.input.data) > self.max_input_bytes:  # no request could carry it
                raise InputError(too_large_input(len(ev.input.data), self.settings.max_record_bytes))
        except ClipstreamError as exc:
            self._refuse(msg, ev, str(exc))
            return
        if ev.deadline_us <= now:  # out of time before any model could be asked: none is
            self.metrics.arrived_expired(app.name)
            self._reply_default(ev, msg.partition(), EXPIRED_ON_ARRIVAL)
            return
        try:
            query = Query(qid, app.name, ev.context, ev.input.array(), ev.deadline_us)
            stored = None if is_stateless(policy) else self._stored_state(app.name, query.context, states)
            state = align_state(policy, stored, app.models, self.apps.versions(app.name))
            chosen = [m for m in policy.select(state, query) if m in app.models]
            self.metrics.dispatched(app.name, state, query.context or None)
        except ClipstreamError as exc:
            self._refuse(msg, ev, str(exc))
            return
        trace = dict(ev.trace)
        trace.setdefault("produced", ev.created_us)  # a Kafka client's query with no stamp: timed from its making
        trace["dispatched"] = now
        asked = Asked(ev.app, ev.deadline_us, ev.reply_topic, ev.reply_partition, query.context, trace,
                      query=query, state=state, partition=msg.partition())
        # the join's cutoff leaves the reply its budget; a query with no prediction by then
        # waits to the budget's floor (its last resort) rather than take the default at once.
        # The models' deadline is that last resort: a prediction later than it is never used.
        cutoff_us = ev.deadline_us - self.reply_budget.for_slo(ev.deadline_us - ev.created_us)
        last_resort_us = ev.deadline_us - self.reply_budget.floor_us
        self.join.register(qid, chosen, cutoff_us, last_resort_us=last_resort_us if chosen else None, asked=asked)
        if not chosen:
            return  # answered by the timer with the default
        asked_models = self._not_hopeless(qid, app.name, chosen, last_resort_us - now, now)
        if asked_models is None:
            return
        self._ask(ev, app.name, asked_models, last_resort_us, msg.partition(), trace)
        if poll:
            self.producer.poll(0)

    def _not_hopeless(self, qid: str, app: str, chosen: list[str], left_us: int, now: int) -> list[str] | None:
        """The chosen models worth asking: a model that cannot answer in the time ``left_us`` is
        reported failed at once (the straggler it would be). None when that answered the query."""
        hopeless = [m for m in chosen if self.trips.hopeless(m, left_us, now)]
        if not hopeless:
            return chosen
        self.stats["not_asked"] += len(hopeless)
        self.metrics.not_asked(app, hopeless)
        for model in hopeless:  # a query with no model left is answered now
            done = self.join.add(qid, model, "expired", error=NOT_ASKED)
            if done is not None:
                self._answer_safely(done)
                return None
        return [m for m in chosen if m not in hopeless]

    def _ask(self, ev: QueryEvent, app: str, models: list[str], deadline_us: int, partition: int,
             trace: dict[str, int]) -> None:
        """Send the query's requests to ``models``: one record naming them all where one batcher
        serves the app's models (docs/design/0082), else one record per model."""
        if not self._model_topics.issuperset(models):
            self.prepare_model_topics(models)
        groups = [models] if self.grouped and models else [[m] for m in models]
        for model, *also in groups:
            request = ModelRequest(query_id=ev.query_id, app=app, model=model, input=ev.input,
                                   deadline_us=deadline_us, selector_partition=partition, trace=trace, also=also)
            self.producer.produce(self.catalogue.requests(model).name, encode(request), key=ev.query_id.encode())

    def prepare_model_topics(self, models: Iterable[str]) -> None:
        """Make sure the topics of ``models`` exist, with one admin client and one metadata
        request, before the member joins its group. Otherwise the first query to each model
        waits on the join thread for an admin client of its own, and the queries behind it
        miss their deadlines. A model linked later is made sure of at its first query
        (``dispatch``), the same way."""
        todo = sorted(set(models) - self._model_topics)
        if todo:
            ensure_topics(self.settings, [spec for m in todo for spec in self.catalogue.for_model(m, 1)])
            self._model_topics.update(todo)

    # -- join: combine ----------------------------------------------------------------
    def collect(self, msg: Any, received_us: int | None = None) -> None:
        """Join one ``Predictions`` record; ``received_us`` is when its poll returned (the
        ``selector_in`` stamp, so the join's own time is told apart from the Kafka hop)."""
        received_us = received_us or now_us()
        try:
            batch = decode_as(Predictions, msg.value())
        except ClipstreamError as exc:
            self.dead.send(reason=f"undecodable predictions: {exc}", msg=msg)
            return
        for item in batch.items:
            if item.status in OK_STATUSES and "dispatched" in item.trace:
                self.trips.observe(item.model, received_us - item.trace["dispatched"], received_us)
            pending = self.join.get(item.query_id)
            if pending is not None:  # the last prediction's stage stamps ride on the Response
                trace = pending.asked.trace
                trace.update(item.trace)
                trace["selector_in"] = received_us
            output, status, error = None, item.status, item.error
            if pending is not None and status in ("ok", "cached") and item.output is not None:
                try:
                    _, _, outs = self.apps.get(pending.asked.app)
                    spec = self.apps.view().models.get(item.model)
                    own = spec.spec.output if spec and spec.spec else None
                    output = to_output(item.output, own.kind if own else outs.kind, outs.labels,
                                       tuple(own.labels) if own and own.labels else None)
                except ClipstreamError as exc:
                    status, error = "error", f"output not used: {exc}"
            done = self.join.add(item.query_id, item.model, status, output, error, item.version)
            if done is not None:
                self._answer_safely(done)

    def answer(self, pending: Pending, late_us: int | None = None) -> None:
        """combine with what arrived; the stragglers are named and lower the confidence.
        ``late_us``: for a query answered by the cutoff timer, how long after it was due."""
        asked, now = pending.asked, now_us()
        missing = pending.missing
        # a straggler did not answer in time: cut off here, or given up by its batcher as late
        stragglers = [m for m in missing if (m not in pending.failed or m in pending.expired)
                      and pending.failed.get(m) != NOT_ASKED]  # those are counted when skipped
        self.stats["stragglers"] += len(stragglers)
        if stragglers:
            self.metrics.stragglers(asked.app, stragglers)
        failed = [m for m, e in pending.failed.items() if m not in pending.expired and refused_input(m, e) is None]
        if failed:  # a refused input is the caller's, not the model's
            self.metrics.failed(asked.app, failed)
        try:
            app, policy, outputs = self.apps.get(asked.app)
            default = app.default_output
        except ClipstreamError:
            app, policy, outputs, default = None, None, None, None
        if not pending.arrived or policy is None:
            self.stats["defaults"] += 1
            reason = why_default(pending)
            record = response_record(pending.query_id, asked, None, 0.0, [], missing, None, now, default, reason)
            self._reply(asked, record, late_us)
            if policy is not None:  # feedback teaches who gave nothing, or finds nothing to learn
                self.save(pending.query_id, stored_answer(asked.app, asked.context, None, {}, None,
                                                          gave_nothing(pending)))
            return
        # each model weighed as the version that answered (a version change may be under way)
        answer, confidence = policy.combine(as_versions(asked.state, pending.versions), asked.query,
                                            dict(pending.arrived))
        record = response_record(pending.query_id, asked, answer, confidence, list(pending.arrived), missing,
                                 outputs.labels, now)
        self._reply(asked, record, late_us)  # the caller first; learn waits for the stored predictions if need be
        self.save(pending.query_id, stored_answer(asked.app, asked.context, answer.to_json(),
                                                  {m: o.to_json() for m, o in pending.arrived.items()},
                                                  confidence, gave_nothing(pending), pending.versions))

    def _answer_safely(self, pending: Pending, late_us: int | None = None) -> None:
        """``answer``, and if it fails before a Response went out, a default naming why: the
        query's offset is committed only once it is answered."""
        sent = self.stats["responses"]
        try:
            self.answer(pending, late_us)
        except Exception as exc:
            log.exception("answering %s failed", pending.query_id)
            self.dead.send(reason=f"the selector could not combine: {type(exc).__name__}: {exc}",
                           query_id=pending.query_id, payload=b"")
            if self.stats["responses"] == sent:
                self._reply(pending.asked, response_record(pending.query_id, pending.asked, None, 0.0, [],
                                                           pending.missing, None, now_us(), None,
                                                           f"the selector could not combine: {exc}"))

    # -- the loop -----------------------------------------------------------------------
    def handle(self, msgs: list[Any], queries: str | None = None, received_us: int | None = None) -> None:
        """One poll group, in order: the policy states of all its queries come from one MGET
        (none at all for stateless policies), and the producer is polled once at the end."""
        queries = queries or self.catalogue.queries.name
        received_us = received_us or now_us()
        events: list[QueryEvent | None] = [None] * len(msgs)
        pairs: list[tuple[str, str | None]] = []
        for i, m in enumerate(msgs):
            if m.error() or m.topic() != queries:
                continue
            try:
                ev = events[i] = decode_as(QueryEvent, m.value())
                # the caller's half of the reply's trip, the other way; a query read past its
                # deadline (replayed after a member died, or a backlog) says nothing of the trip
                if "produced" in ev.trace and received_us < ev.deadline_us:
                    self.reply_budget.observe_crossing(received_us - ev.trace["produced"])
                _, policy, _ = self.apps.get(ev.app)
                if not is_stateless(policy):
                    pairs.append((ev.app, ev.context or None))
            except Exception:  # dispatch reports it (dead letter or default answer)
                continue
        states = self.states(pairs) if pairs else {}
        # predictions first, then the answers now due, then the new queries: a group can hold
        # many queries, each a fan-out of requests, and a straggler cutoff that waits behind
        # them fires late (the predictions in the group arrived before it, so they still count)
        for m in msgs:
            if m.error():
                log.warning("consumer: %s", m.error())
                fail_if_fatal(m.error(), "the join's consumer")
            elif m.topic() != queries:
                if self.handover is not None:
                    self.handover.read_predictions(m.partition(), m.offset())
                self._guarded(m, self.collect, m, received_us)
        self.answer_expired()
        for i, m in enumerate(msgs):
            if not m.error() and m.topic() == queries:
                ev = events[i]
                # no query id (or an empty one): no Response will come, nothing to wait for
                self.offsets.read(m.partition(), m.offset(), ev.query_id or None if ev is not None else None)
                self._dispatch_guarded(m, ev, states)
        self.producer.poll(0)

    def _dispatch_guarded(self, m: Any, ev: QueryEvent | None, states: dict[tuple[str, str | None], State | None]) -> None:
        """``dispatch``; a query it failed on before registering gets a default naming why."""
        try:
            self.dispatch(m, ev, states, False)  # poll=False: once, at the end of the group
        except Exception as exc:  # one bad record must not stop the selector
            log.exception("query %s[%s]@%s failed", m.topic(), m.partition(), m.offset())
            self.dead.send(reason=f"the selector could not dispatch: {type(exc).__name__}: {exc}", msg=m,
                           query_id=ev.query_id if ev is not None else None)
            if ev is not None and ev.query_id not in self.join:
                self._reply_default(ev, m.partition(), f"the selector could not dispatch: {exc}")

    def _refuse(self, msg: Any, ev: QueryEvent, reason: str) -> None:
        """A query the selector will not serve: a dead letter, and a default naming ``reason``."""
        self.dead.send(reason=reason, msg=msg, query_id=ev.query_id)
        self._reply_default(ev, msg.partition(), reason)

    def _reply_default(self, ev: QueryEvent, partition: int, reason: str) -> None:
        """Answer a query that never reached the join with a default naming ``reason``."""
        asked = Asked(ev.app, ev.deadline_us, ev.reply_topic, ev.reply_partition, ev.context, ev.trace,
                      partition=partition)
        app = self.apps.view().apps.get(ev.app)
        default = app.default_output if app is not None else None
        self._reply(asked, response_record(ev.query_id, asked, None, 0.0, [], [], None, now_us(), default, reason))
        if app is not None and ev.query_id:  # no model asked: a feedback on it finds nothing to learn
            self.save(ev.query_id, stored_answer(ev.app, ev.context, None, {}))

    def _guarded(self, m: Any, work: Callable[..., None], *args: Any) -> None:
        try:
            work(*args)
        except Exception as exc:  # one bad record must not stop the selector
            log.exception("record %s[%s]@%s failed", m.topic(), m.partition(), m.offset())
            self.dead.send(reason=f"the selector failed on this record: {type(exc).__name__}: {exc}", msg=m)

    def answer_expired(self) -> None:
        """The straggler cutoff: answer every query whose deadline has come with what arrived."""
        for pending in self.join.expired(now_us()):
            # the cutoff was due at ``deadline_us``: the reply's budget must cover how late
            # this loop got to it (the CPU was elsewhere) as well as the trip to the broker
            self._answer_safely(pending, late_us=max(0, now_us() - pending.deadline_us))

    def run(self, stop: threading.Event, max_poll_s: float = IDLE_POLL_S, drain_max: int = 500) -> None:
        queries = self.catalogue.queries.name
        # a delivery report marks a query answered (its offset may be committed), and its
        # latency runs until the report is served: the reply producer is polled by a thread of
        # its own, which serves each one as it comes (until the reply producer is closed)
        self.reply_producer.start_polling()
        while not stop.is_set():
            heartbeat("join")  # proof of life for `up`: a wedged join loop stops it
            due = self.join.next_deadline()
            timeout = max_poll_s if due is None else min(max_poll_s, max(0.0, (due - now_us()) / 1e6))
            msg = self.consumer.poll(timeout)
            received = now_us()
            msgs = [msg, *self.consumer.consume(drain_max, 0)] if msg is not None else []
            if msgs:
                self.handle(msgs, queries, received)
            self.answer_expired()
            if self.handover is not None:
                self.handover.store(self.consumer)
