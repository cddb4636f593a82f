"""selector.learn: join feedback with the stored predictions and ``observe`` (Clipper 5.1-5.3).

Runs in its own consumer group (``<group>.learn``) so learners scale apart from the join, and
a ``--learn-only`` process shares the feedback partitions with the full selectors.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from confluent_kafka import Consumer

from clipstream.errors import ClipstreamError
from schemas import Feedback as FeedbackRecord
from schemas import decode_as
from selector.kafka import Apps, log
from selector.policies import align_state
from selector.store import StateStore
from selector.types import Feedback, Output, Query
from topics.deadletters import DeadLetters


class Learner:
    # feedback can overtake its own answer (a caller may send it as soon as the gateway gave up
    # at the deadline, before the join stored the predictions): wait this long before giving up
    UNKNOWN_RETRY_S = 5.0
    RETRY_EVERY_S = 0.25

    def __init__(self, consumer: Consumer, store: StateStore, apps: Apps, dead: DeadLetters, learn_global: bool = True) -> None:
        self.retry: deque[tuple[float, float, Any]] = deque()  # (next try, give up at, message)
        self.consumer = consumer
        self.store = store
        self.apps = apps
        self.dead = dead
        self.learn_global = learn_global
        self.stats = {"observed": 0, "unknown_query": 0, "bad_feedback": 0}

    def handle(self, msg: Any, give_up_at: float | None = None) -> None:
        try:
            fb = decode_as(FeedbackRecord, msg.value())
        except ClipstreamError as exc:
            self.stats["bad_feedback"] += 1
            self.dead.send(reason=f"undecodable feedback: {exc}", msg=msg)
            return
        qid = fb.query_id
        if fb.label is None and fb.reward is None:
            self.stats["bad_feedback"] += 1
            self.dead.send(reason="feedback has neither a label nor a reward", msg=msg, query_id=qid)
            return
        stored = self.store.load_predictions(qid)
        if stored is None:
            now = time.monotonic()
            give_up_at = give_up_at if give_up_at is not None else now + self.UNKNOWN_RETRY_S
            if now < give_up_at:
                self.retry.append((now + self.RETRY_EVERY_S, give_up_at, msg))
                return
            self.stats["unknown_query"] += 1
            self.dead.send(reason="feedback for an unknown or expired query id", msg=msg, query_id=qid)
            return
        app_name = stored.get("app") or fb.app
        try:
            app, policy, _ = self.apps.get(app_name)
        except ClipstreamError as exc:
            self.stats["bad_feedback"] += 1
            self.dead.send(reason=f"feedback for {app_name}: {exc}", msg=msg, query_id=qid)
            return
        context = fb.context or stored.get("context")
        preds = {m: Output.from_json(o) for m, o in stored["predictions"].items()}
        answer = Output.from_json(stored["answer"]) if stored.get("answer") else None
        feedback = Feedback(qid, label=fb.label, reward=fb.reward, answer=answer)
        query = Query(qid, app_name, context)

        def observe(state: dict | None) -> dict:
            return policy.observe(align_state(policy, state, app.models), query, feedback, preds)

        self.store.update(app_name, context, observe)
        if context and self.learn_global:
            self.store.update(app_name, None, observe)
        self.stats["observed"] += 1

    def run(self, stop: threading.Event, max_poll_s: float = 0.1, drain_max: int = 500) -> None:
        while not stop.is_set():
            self._retry_due()
            msg = self.consumer.poll(max_poll_s if not self.retry else min(max_poll_s, self.RETRY_EVERY_S))
            if msg is None:
                continue
            for m in [msg, *self.consumer.consume(drain_max, 0)]:
                if m.error():
                    log.warning("feedback consumer: %s", m.error())
                    continue
                try:
                    self.handle(m)
                except Exception:  # a learner must outlive one bad record or a Redis hiccup
                    log.exception("feedback at offset %s failed", m.offset())

    def _retry_due(self) -> None:
        now = time.monotonic()
        for _ in range(len(self.retry)):
            if self.retry[0][0] > now:
                break
            _, give_up_at, msg = self.retry.popleft()
            try:
                self.handle(msg, give_up_at)
            except Exception:
                log.exception("feedback retry for offset %s failed", msg.offset())
