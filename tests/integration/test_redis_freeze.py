"""Redis frozen (SIGSTOP) under steady load through the real selector, batcher and workers.

Redis is a cache of the weights, not a single point of failure: while it is stopped, every
query still gets a combined prediction made with the weights the selector read before the
freeze (not a default, and not the initial weights), and the feedback sent during the freeze
reaches the weights once Redis is back. The Redis here is a private redis-server, so stopping
it cannot disturb another test.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from clipstream.clock import now_us
from clipstream.infra.redis import redis_answers, redis_url, start_redis
from clipstream.settings import Settings
from clipstream.testing.models import make_python_model
from clipstream.testing.procs import stop_process, wait_until
from schemas import Response, decode_as
from selector.policies import Exp4
from selector.settings import SelectorSettings
from selector.types import Output, Query
from tests.integration.test_selector_service import Client, process, publish_app, state
from topics.admin import ensure_core_topics, ensure_topics
from topics.catalogue import Catalogue
from topics.client import consumer_config

pytestmark = pytest.mark.integration

# m1 leans to label 1, m2 is sure of label 0: with equal weights the ensemble says 0, and only
# once feedback has taught it that m2 is wrong (m2's weight a fifth of m1's or less) does it say 1
MODEL_SRC = """
import numpy as np

class Model:
    def __init__(self, path, config):
        self.row = np.array(config["row"], dtype=np.float32)

    def predict_batch(self, x):
        return np.tile(self.row, (len(x), 1))
"""
ROWS = {"m1": [0.4, 0.6], "m2": [0.9, 0.1]}
ETA = 0.5
FREEZE_S = 4.0
FEEDBACK_IN_FREEZE = 6
# generous: the point is that a frozen Redis costs no answer; the first command each stage sends
# into the freeze waits out CLIPSTREAM_REDIS_TIMEOUT_MS, and the 2-core test machine is shared
SLO_MS = 1000.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensemble_says(log_w: list[float]) -> Any:
    """What Exp4 answers with these weights for the two models' fixed outputs."""
    policy = Exp4({"eta": ETA, "kind": "class_scores", "labels": [0, 1]})
    st = {"policy": "exp4", "models": list(ROWS), "log_w": log_w, "n_observed": 0}
    preds = {m: Output(int(row[1] > row[0]), tuple(row)) for m, row in ROWS.items()}
    return policy.combine(st, Query("q", "a", None), preds)[0].value


def test_answers_and_learning_survive_a_frozen_redis(settings: Settings, tmp_path: Path) -> None:
    assert ensemble_says([0.0, 0.0]) == 0 and ensemble_says([0.0, -2.0]) == 1  # the premise above
    port = _free_port()
    server = start_redis(port, tmp_path / "redis", die_with_parent=True)
    settings = settings.model_copy(update={"redis_url": redis_url(port)})
    wait_until(lambda: redis_answers(settings.redis_url), 20, "the private redis-server")
    r = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
    ensure_core_topics(settings)
    sfx = uuid.uuid4().hex[:6]
    models = {f"{m}-{sfx}": make_python_model(tmp_path, f"{m}-{sfx}", MODEL_SRC, labels=[0, 1], shape=(2,),
                                              extra={"row": row}) for m, row in ROWS.items()}
    names = list(models)
    for m in models:
        ensure_topics(settings, Catalogue.from_settings(settings).for_model(m))
    app = f"app{sfx}"
    publish_app(settings, models, app, slo_ms=SLO_MS, config={"eta": ETA})
    client = Client(settings)
    key = f"cs:state:{app}:__global__"
    fresh = lambda: [random.random(), random.random()]  # noqa: E731 - no two queries share a cache entry

    sent_at: dict[str, float] = {}

    def ask() -> str:
        qid = client.query(fresh(), app, slo_ms=SLO_MS).query_id
        sent_at[qid] = now_us()
        return qid

    def collect(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            msg = client.consumer.poll(0.01)
            if msg is not None and not msg.error():
                rec = decode_as(Response, msg.value())
                client.answers[rec.query_id] = (rec, now_us())  # as Client.answer keeps them

    try:
        with ExitStack() as stack:
            for m, folder in models.items():
                stack.enter_context(process(["worker", "--model", m, "--path", str(folder)], settings, 60))
            stack.enter_context(process(["batcher", *[a for m in names for a in ("--model", m)]], settings, 60))
            stack.enter_context(process(["selector"], settings, 60))
            client.warm_up(app, fresh, slo_ms=5000)

            # teach it that m2 is wrong, and wait until the selector answers with those weights
            taught = [ask() for _ in range(4)]
            for qid in taught:
                client.answer(qid)
                client.feedback(qid, 1, app)
            client.producer.flush(5)
            wait_until(lambda: (s := state(r, key)) and s["n_observed"] >= 4, 20, "the first feedback")
            learned = state(r, key)
            assert ensemble_says(learned["log_w"]) == 1
            wait_until(lambda: client.answer(ask())[0].output == 1, 20, "an answer made with the learned weights")

            sent: list[str] = []
            fed: list[str] = []
            os.kill(server.pid, signal.SIGSTOP)
            try:
                with pytest.raises(redis.TimeoutError):  # it really is frozen
                    redis.Redis.from_url(settings.redis_url, socket_timeout=0.2).ping()
                end = time.monotonic() + FREEZE_S
                while time.monotonic() < end:  # 20 queries a second, feedback on the first answers
                    sent.append(ask())
                    collect(0.05)
                    for qid in sent:
                        if len(fed) < FEEDBACK_IN_FREEZE and qid in client.answers and qid not in fed:
                            client.feedback(qid, 1, app)
                            fed.append(qid)
                client.producer.flush(5)
                answered_in_freeze = sum(1 for q in sent if q in client.answers)
            finally:
                os.kill(server.pid, signal.SIGCONT)

            for qid in sent:
                client.answer(qid, timeout_s=SLO_MS / 1000 + 10)
            answers = [client.answers[q][0] for q in sent]
            defaults = [a.default_reason for a in answers if a.is_default]
            assert not defaults, f"{len(defaults)} of {len(answers)} answers were defaults: {defaults[:3]}"
            assert all(sorted(a.answered) == sorted(names) for a in answers), "a model's prediction was missing"
            assert all(a.output == 1 for a in answers), "answered with other weights than the learned ones"
            assert answered_in_freeze >= len(sent) - 5, "answers stopped while Redis was frozen"
            waits = sorted(client.answers[q][1] - sent_at[q] for q in sent if client.answers[q][1] > sent_at[q])
            print(f"frozen {FREEZE_S:g} s: {len(sent)} queries, {answered_in_freeze} answered during the freeze, "
                  f"0 defaults; answer waits median {waits[len(waits) // 2] / 1000:.0f} ms, "
                  f"max {waits[-1] / 1000:.0f} ms")
            assert len(fed) == FEEDBACK_IN_FREEZE

            # the feedback sent during the freeze is applied once Redis is back: each exactly once
            n = learned["n_observed"] + FEEDBACK_IN_FREEZE
            after = wait_until(lambda: (s := state(r, key)) and s["n_observed"] >= n and s, 30,
                               "the feedback sent during the freeze to be applied")
            assert after["n_observed"] == n
            # once the learner has committed past every feedback record, none is left to retry:
            # a feedback applied twice would show by then
            wait_until(lambda: _learner_done(settings), 30, "the learner to commit past every feedback record")
            assert state(r, key)["n_observed"] == n
            assert after["log_w"] == pytest.approx([0.0, learned["log_w"][1] - ETA * FEEDBACK_IN_FREEZE])
    finally:
        client.close()
        os.kill(server.pid, signal.SIGCONT)  # never leave it stopped, whatever failed
        stop_process(server, 10)


def _learner_done(settings: Settings) -> bool:
    """The selector's learner has committed offsets at the end of every feedback partition."""
    feedback = Catalogue.from_settings(settings).feedback
    consumer = Consumer(consumer_config(settings, f"{SelectorSettings().join_group(settings)}.learn"))
    try:
        committed = consumer.committed([TopicPartition(feedback.name, p) for p in range(feedback.partitions)], timeout=5)
        ends = [consumer.get_watermark_offsets(tp, timeout=5)[1] for tp in committed]
        return all(end == 0 or tp.offset >= end for tp, end in zip(committed, ends))
    finally:
        consumer.close()
