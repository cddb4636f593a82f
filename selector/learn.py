"""selector.learn: join feedback with the stored predictions and ``observe`` (Clipper 5.1-5.3).

Runs in its own consumer group (``<group>.learn``) so learners scale apart from the join, and
a ``--learn-only`` process shares the feedback partitions with the full selectors.

Feedback is read at least once and applied once per (query_id, model), in the context stored
with the query (``StateStore.observe_once``, docs/design/0031): the consumer's offsets are stored by hand
(``enable.auto.offset.store`` off), one past each record done with, and never past a record
parked for a retry. When Redis is away the learner stores nothing more, pauses its
partitions, and once Redis answers again seeks each back to its first record not applied
and goes on from there, so feedback sent during an outage is applied after it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from clipstream.errors import ClipstreamError
from clipstream.redisclient import REDIS_AWAY, RedisGuard
from registry.labels import label_problem, reward_problem
from schemas import Feedback as FeedbackRecord
from schemas import decode_as
from selector.checks import app_problem
from selector.kafka import Apps, log
from selector.metrics import FeedbackMetrics
from selector.policies import align_state
from selector.store import StateStore
from selector.types import Feedback, Output, Query
from topics.deadletters import DeadLetters
from topics.stage import IDLE_POLL_S, fail_if_fatal, heartbeat


# feedback whose query has no stored predictions, after the wait for them
UNKNOWN_QUERY = ("unknown query id: no stored predictions for the feedback's query: never answered, older than "
                 "their time to live (CLIPSTREAM_STORED_PREDICTIONS_TTL_S), or answered by a selector that stopped "
                 "before storing them")

# what ``observe`` is given for a model that was asked and gave no answer by the deadline (a
# straggler, a failure, or one not asked for lack of time): a label or value no feedback matches
NO_ANSWER = Output(None)


class Learner:
    # feedback can overtake its own answer (a caller may send it as soon as the gateway gave up
    # at the deadline, before the join stored the predictions): wait this long before giving up
    UNKNOWN_RETRY_S = 5.0
    RETRY_EVERY_S = 0.25

    def __init__(self, consumer: Consumer, store: StateStore, apps: Apps, dead: DeadLetters, learn_global: bool = True,
                 guard: RedisGuard | None = None, metrics: FeedbackMetrics | None = None) -> None:
        self.retry: deque[tuple[float, float, Any]] = deque()  # (next try, give up at, message)
        self.guard = guard or RedisGuard(lambda: store.redis.ping(), name="learn")
        self.offsets = FeedbackOffsets()
        self._rewind: dict[tuple[str, int], int] = {}  # while paused: where each partition resumes
        self.consumer = consumer
        self.store = store
        self.apps = apps
        self.dead = dead
        self.learn_global = learn_global
        # what became of each record, for Prometheus (``stats`` is the same, per process)
        self.metrics = metrics or FeedbackMetrics()
        self.stats = {"observed": 0, "unknown_query": 0, "bad_feedback": 0, "held_for_redis": 0, "repeated": 0,
                      "nothing_to_learn": 0}

    def handle(self, msg: Any, give_up_at: float | None = None) -> bool:
        """Apply one feedback record: True when done with it (applied or dead-lettered), False
        when parked in ``retry``. A Redis that is away raises (one of ``REDIS_AWAY``)."""
        try:
            fb = decode_as(FeedbackRecord, msg.value())
        except ClipstreamError as exc:
            return self._refuse(msg, f"undecodable feedback: {exc}")
        qid = fb.query_id
        if not qid:
            return self._refuse(msg, "feedback with an empty query_id: it names no query", None, fb.app)
        if fb.label is None and fb.reward is None:
            return self._refuse(msg, "feedback has neither a label nor a reward", qid, fb.app)
        problem = reward_problem(fb.reward)  # checked before Redis is asked anything
        if problem is not None:
            return self._refuse(msg, problem, qid, fb.app)
        stored = self.store.load_predictions(qid)
        if stored is None:
            now = time.monotonic()
            give_up_at = give_up_at if give_up_at is not None else now + self.UNKNOWN_RETRY_S
            if now < give_up_at:
                self.retry.append((now + self.RETRY_EVERY_S, give_up_at, msg))
                return False
            self.stats["unknown_query"] += 1
            self.metrics.count(self._known(fb.app), "unknown_query")
            self.dead.send(reason=UNKNOWN_QUERY, msg=msg, query_id=qid)
            return True
        # the app the query was answered for, never the one the feedback claims: a key allowed
        # one app must not teach another through a query id of that app's
        problem = app_problem(qid, fb.app, stored.get("app"))
        if problem is not None:
            return self._refuse(msg, problem, qid, stored.get("app"))
        app_name = stored.get("app") or fb.app
        try:
            app, policy, outputs = self.apps.get(app_name)
        except ClipstreamError as exc:
            return self._refuse(msg, f"feedback for {app_name}: {exc}", qid, app_name)
        problem = label_problem(fb.label, outputs.kind, outputs.labels)
        if problem is not None:
            return self._refuse(msg, f"feedback label refused: {problem}", qid, app_name)
        # the context the query was answered in, never the one the feedback claims: a caller
        # cannot aim a query's feedback at another context's weights, nor make new ones
        context = stored.get("context") or None
        preds = {m: Output.from_json(o) for m, o in stored["predictions"].items()}
        # a model asked that gave no answer in time had nothing in the answer: it learns as wrong
        preds.update((m, NO_ANSWER) for m in stored.get("missing") or () if m not in preds)
        if not preds:  # answered with the default before any model was asked: a fine feedback, no lesson
            self.stats["nothing_to_learn"] += 1
            self.metrics.count(app_name, "nothing_to_learn")
            return True
        versions = stored.get("versions") or None  # each answer teaches the version that gave it
        answer = Output.from_json(stored["answer"]) if stored.get("answer") else None
        feedback = Feedback(qid, label=fb.label, reward=fb.reward, answer=answer, confidence=stored.get("confidence"))
        query = Query(qid, app_name, context)

        def observe(state: dict | None, models: list[str]) -> dict:
            return policy.observe(align_state(policy, state, app.models, versions), query, feedback,
                                  {m: preds[m] for m in models})

        # once per (query, model) and state: the same feedback sent again changes nothing
        applied = self.store.observe_once(app_name, context, qid, preds, observe)
        if context and self.learn_global:
            applied += self.store.observe_once(app_name, None, qid, preds, observe)
        outcome = "observed" if applied else "repeated"
        self.stats[outcome] += 1
        self.metrics.count(app_name, "applied" if outcome == "observed" else outcome)
        return True

    def _refuse(self, msg: Any, reason: str, query_id: str | None = None, app: str | None = None) -> bool:
        """Dead-letter a feedback record that changes nothing; done with it (True)."""
        self.stats["bad_feedback"] += 1
        self.metrics.count(self._known(app), "refused")
        self.dead.send(reason=reason, msg=msg, query_id=query_id)
        return True

    def _known(self, app: str | None) -> str | None:
        """``app`` when the registry holds it, else None: a label a caller's record cannot grow."""
        return app if app is not None and app in self.apps.view().apps else None

    def run(self, stop: threading.Event, max_poll_s: float = IDLE_POLL_S, drain_max: int = 500) -> None:
        while not stop.is_set():
            heartbeat("learn")  # proof of life for `up`: a wedged learn loop stops it
            if self._rewind:  # Redis was away: keep the group alive, resume once it answers
                if self.guard.wait_available(max_poll_s):
                    self._resume()
                else:
                    self._hold(self.consumer.consume(drain_max, 0))
                continue
            self._retry_due()
            msg = self.consumer.poll(max_poll_s if not self.retry else min(max_poll_s, self.RETRY_EVERY_S))
            if msg is None:
                continue
            self._apply([msg, *self.consumer.consume(drain_max, 0)])

    def _apply(self, msgs: list[Any]) -> None:
        for i, m in enumerate(msgs):
            if m.error():
                log.warning("feedback consumer: %s", m.error())
                fail_if_fatal(m.error(), "the learner's consumer")
                continue
            try:
                done = self.handle(m)
            except REDIS_AWAY as exc:
                self.guard.failed(exc)
                self._hold(msgs[i:])
                return
            except Exception as exc:  # a learner must outlive one bad record; it would fail again
                log.exception("feedback at offset %s failed", m.offset())
                self._dead_letter(m, exc)
                done = True
            self._store(self.offsets.done(m) if done else self.offsets.park(m))

    def _dead_letter(self, msg: Any, exc: Exception) -> None:
        self.stats["bad_feedback"] += 1
        self.metrics.count(None, "failed")
        try:
            self.dead.send(reason=f"the learner failed on this feedback: {type(exc).__name__}: {exc}", msg=msg)
        except Exception:  # the dead letter is a report: losing it must not stop the learner
            log.exception("dead letter for feedback at offset %s not sent", msg.offset())

    def _hold(self, msgs: list[Any]) -> None:
        """Keep ``msgs`` for after the outage: pause every partition and remember, for each, the
        first record not applied (fetched records of paused partitions are dropped)."""
        for m in msgs:
            if not m.error():
                self._rewind.setdefault((m.topic(), m.partition()), m.offset())
                self.stats["held_for_redis"] += 1
        if not self._rewind:
            return
        try:
            self.consumer.pause(self.consumer.assignment())
        except KafkaException as exc:
            log.warning("pausing the feedback partitions: %s", exc)

    def _resume(self) -> None:
        """Redis answers again: seek each held partition back to its first record not applied."""
        assignment = self.consumer.assignment()
        owned = {(tp.topic, tp.partition) for tp in assignment}
        for (topic, partition), offset in self._rewind.items():
            if (topic, partition) not in owned:
                continue  # revoked meanwhile: its new owner starts at the committed offset
            try:
                self.consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                log.warning("rewinding %s[%s] to %s: %s", topic, partition, offset, exc)
        self._rewind.clear()
        self.consumer.resume(assignment)

    def _store(self, tp: TopicPartition | None) -> None:
        if tp is None:
            return
        try:
            self.consumer.store_offsets(offsets=[tp])
        except KafkaException as exc:  # not assigned any more: its new owner redoes it
            log.debug("storing the offset %s: %s", tp, exc)

    def _retry_due(self) -> None:
        now = time.monotonic()
        for _ in range(len(self.retry)):
            if self.retry[0][0] > now or not self.guard.available():
                break
            _, give_up_at, msg = self.retry.popleft()
            try:
                done = self.handle(msg, give_up_at)
            except REDIS_AWAY as exc:  # still parked; its wait for the join starts again after
                self.guard.failed(exc)
                self.retry.appendleft((now + self.RETRY_EVERY_S, now + self.UNKNOWN_RETRY_S, msg))
                break
            except Exception as exc:
                log.exception("feedback retry for offset %s failed", msg.offset())
                self._dead_letter(msg, exc)
                done = True
            if done:
                self._store(self.offsets.finish_parked(msg))


class FeedbackOffsets:
    """The offset each feedback partition may commit: one past the last record done with, but
    never past a record parked for a retry (a crash then redoes it, not loses it)."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, int], int] = {}  # one past the last record seen
        self._parked: dict[tuple[str, int], set[int]] = {}

    def done(self, msg: Any) -> TopicPartition | None:
        key = (msg.topic(), msg.partition())
        self._next[key] = max(self._next.get(key, 0), msg.offset() + 1)
        return self._commit(key)

    def park(self, msg: Any) -> TopicPartition | None:
        key = (msg.topic(), msg.partition())
        self._parked.setdefault(key, set()).add(msg.offset())
        self._next[key] = max(self._next.get(key, 0), msg.offset() + 1)
        return self._commit(key)

    def finish_parked(self, msg: Any) -> TopicPartition | None:
        key = (msg.topic(), msg.partition())
        self._parked.get(key, set()).discard(msg.offset())
        return self._commit(key)

    def _commit(self, key: tuple[str, int]) -> TopicPartition | None:
        parked = self._parked.get(key)
        offset = min(parked) if parked else self._next.get(key)
        return None if offset is None else TopicPartition(key[0], key[1], offset)
