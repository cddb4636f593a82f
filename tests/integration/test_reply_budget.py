"""The reply budget learns from real delivery reports, served as they arrive (real broker)."""

from __future__ import annotations

import time

import pytest

from clipstream.settings import Settings
from selector.reply_budget import ReplyBudget
from topics.admin import ensure_core_topics
from topics.catalogue import Catalogue
from topics.emitter import Emitter

pytestmark = pytest.mark.integration


def test_acknowledged_trips_are_measured_when_they_arrive_not_when_the_loop_next_polls(settings: Settings) -> None:
    ensure_core_topics(settings)
    topic = Catalogue.from_settings(settings).responses.name
    producer = Emitter(settings, name="replies")
    budget = ReplyBudget(0, 10_000_000, quantile=1.0, window=64, every=1)  # the longest trip seen
    trips: list[int] = []

    def acked(err: object, msg: object) -> None:
        assert err is None, err
        trips.append(int(msg.latency() * 1e6))  # type: ignore[attr-defined]
        budget.observe(trips[-1])

    producer.produce(topic, b"warm")  # the first produce also opens the connection
    producer.flush(10)
    producer.start_polling(0.05)  # as the selector serves its reply producer's reports
    try:
        for _ in range(20):
            producer.produce(topic, b"r", on_delivery=acked)
            time.sleep(0.15)  # the selector's loop is busy elsewhere: nobody else polls
        deadline = time.monotonic() + 10
        while len(trips) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        producer.close(5)
    assert len(trips) == 20
    assert 0 < budget.us == max(trips), trips
    # the reports were served long before the next produce: a trip that ran until a later
    # poll would read at least the 150 ms pause, every one of them (the median, not the
    # longest: one ack behind a broker pause on a busy machine is not what this checks)
    assert sorted(trips)[len(trips) // 2] < 100_000, trips
