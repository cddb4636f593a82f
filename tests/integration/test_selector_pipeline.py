"""The whole pipeline as real processes: selector, a batcher and a worker per model.

Three python-backend models; the third sleeps past the deadline on queries whose first feature
is large. The answer comes by the deadline, names the straggler and has lower confidence; the
feedback for it reaches the weights in Redis.
"""

from __future__ import annotations

import random
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from clipstream.settings import Settings
from tests.integration.test_selector_service import Client, process, publish_app, python_models, state, wait_until
from topics.admin import ensure_core_topics, ensure_topics
from topics.catalogue import Catalogue

pytestmark = pytest.mark.integration


def test_pipeline_answers_by_the_deadline_without_the_straggler(settings: Settings, redis_client: Any, tmp_path: Path) -> None:
    ensure_core_topics(settings)
    sfx = uuid.uuid4().hex[:6]  # unique model names: the prediction cache in Redis is shared
    models = python_models(tmp_path, f"-{sfx}", slow_s=2.0, flip=False)
    names = list(models)
    for m in models:
        ensure_topics(settings, Catalogue.from_settings(settings).for_model(m))
    app = f"app{sfx}"
    publish_app(settings, models, app, slo_ms=600)
    client = Client(settings)
    r = lambda: round(random.uniform(0.6, 0.9), 6)  # noqa: E731 - a fresh input each query (no cache hit)
    try:
        with ExitStack() as stack:
            for m, folder in models.items():
                stack.enter_context(process(["worker", "--model", m, "--path", str(folder)], settings, 60))
                stack.enter_context(process(["batcher", "--model", m, "--version", "1", "--replicas", "1"], settings, 60))
            stack.enter_context(process(["selector"], settings, 60))

            client.warm_up(app, lambda: [0.1, r()], slo_ms=5000)  # until every fresh client has joined

            fast = client.query([0.1, r()], app, slo_ms=1000)
            resp, at = client.answer(fast.query_id)
            assert resp.missing == [] and resp.output == 1 and resp.confidence == pytest.approx(1.0)
            assert at < fast.deadline_us

            slow = client.query([0.9, r()], app, slo_ms=600)
            resp, at = client.answer(slow.query_id)
            assert resp.missing == [names[2]] and sorted(resp.answered) == sorted(names[:2])
            assert resp.output == 1 and resp.confidence == pytest.approx(2 / 3)
            # cut off early by the reply budget: 3 to 40 ms by default, as the replies' trips go
            assert slow.deadline_us - 42_000 <= at <= slow.deadline_us + 150_000
            for stage in ("produced", "dispatched", "joined"):
                assert stage in resp.trace

            # m1 and m2 were right; m3 gave nothing by the deadline, which learns as a wrong answer
            client.feedback(slow.query_id, 1, app)
            key = f"cs:state:{app}:__global__"
            s = wait_until(lambda: (s := state(redis_client, key)) and s["n_observed"] >= 1 and s, 10, "feedback")
            assert s["models"] == names and s["log_w"] == pytest.approx([0.0, 0.0, -0.5])
    finally:
        client.close()
