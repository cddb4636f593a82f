"""``topics.kafkalog``: librdkafka's lines folded by kind, and every client configured to use
it (no broker)."""

from __future__ import annotations

import logging

import pytest

from clipstream.settings import Settings
from topics.client import admin_config, consumer_config, producer_config
from topics.kafkalog import KAFKA_LOG, KAFKA_LOGGER_NAME, RepeatFold, fold_key

REFUSED = ("[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: "
           "Connection refused (after {ms}ms in state CONNECT)")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def line(client: str = "rdkafka#producer-1", ms: int = 0, level: int = logging.ERROR,
         text: str = REFUSED) -> logging.LogRecord:
    """A record as confluent-kafka logs one: ``"%s [%s] %s"`` with facility, client, text."""
    return logging.LogRecord(KAFKA_LOGGER_NAME, level, __file__, 0, "%s [%s] %s",
                             ("FAIL", client, text.format(ms=ms)), None)


def test_the_first_line_passes_and_its_repeats_fold_until_the_window_ends() -> None:
    clock = Clock()
    fold = RepeatFold(window_s=60.0, clock=clock)
    assert fold.filter(line())
    shown = [fold.filter(line(ms=i % 3)) for i in range(500)]  # retries, "after 0ms" or "after 2ms"
    assert not any(shown) and fold.folded() == 500
    clock.now += 61.0
    record = line()
    assert fold.filter(record)
    assert record.getMessage().endswith("(repeated 500 times in 61s)")
    assert "Connection refused" in record.getMessage()
    assert fold.folded() == 0 and not fold.filter(line())


def test_the_same_failure_in_another_client_is_one_kind() -> None:
    fold = RepeatFold(clock=Clock())
    assert fold.filter(line("rdkafka#producer-1"))
    assert not fold.filter(line("rdkafka#consumer-7"))
    assert not fold.filter(line("gateway#producer-12"))


def test_another_broker_another_message_or_level_is_let_through() -> None:
    fold = RepeatFold(clock=Clock())
    assert fold.filter(line())
    assert fold.filter(line(text=REFUSED.replace("127.0.0.1:1", "127.0.0.1:2")))  # a failover is seen
    assert fold.filter(line(text="[thrd:b:9092/2]: b:9092/2: Disconnected (after {ms}ms in state UP)"))
    assert fold.filter(line(level=logging.WARNING))


def test_a_line_with_nothing_folded_is_left_as_it_was() -> None:
    clock = Clock()
    fold = RepeatFold(window_s=1.0, clock=clock)
    assert fold.filter(line())
    clock.now += 5.0
    record = line()
    assert fold.filter(record) and "repeated" not in record.getMessage()


def test_fold_key_drops_durations_counts_in_parentheses_and_the_client() -> None:
    a = fold_key(40, "FAIL [rdkafka#producer-1] b:9092/1: Disconnected (after 6007ms in state UP, 3 requests in flight)")
    b = fold_key(40, "FAIL [rdkafka#consumer-4] b:9092/1: Disconnected (after 12ms in state UP, 1 requests in flight)")
    assert a == b
    assert a != fold_key(40, "FAIL [rdkafka#consumer-4] b:9092/2: Disconnected (after 12ms in state UP)")


def test_kinds_are_bounded_and_the_oldest_forgotten_first() -> None:
    fold = RepeatFold(max_kinds=2, clock=Clock())
    texts = ["first {ms}", "second {ms}", "third {ms}"]
    assert all(fold.filter(line(text=t)) for t in texts)
    assert not fold.filter(line(text="third {ms}")) and not fold.filter(line(text="second {ms}"))
    assert fold.filter(line(text="first {ms}"))  # forgotten: shown again


def test_a_fold_refuses_a_window_of_nothing() -> None:
    with pytest.raises(ValueError):
        RepeatFold(window_s=0)


def test_every_client_logs_through_the_folding_logger() -> None:
    s = Settings(kafka_bootstrap="127.0.0.1:1")
    for conf in (producer_config(s), consumer_config(s, "g"), admin_config(s)):
        assert conf["logger"] is KAFKA_LOG
    assert KAFKA_LOG.name == KAFKA_LOGGER_NAME
    assert any(isinstance(f, RepeatFold) for f in KAFKA_LOG.filters)


def test_a_client_with_no_broker_logs_one_line_per_kind(caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A real librdkafka client on a closed port: its many retries come out as one line."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    monkeypatch.setattr(KAFKA_LOG, "filters", [RepeatFold()])  # none of the kinds other tests saw
    caplog.set_level(logging.WARNING, logger=KAFKA_LOGGER_NAME)
    admin = AdminClient(admin_config(Settings(kafka_bootstrap="127.0.0.1:1")))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=1.0)  # retries many times a second meanwhile
    admin.poll(0)
    refused = [r for r in caplog.records if "Connection refused" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in caplog.records]


def test_a_settling_broker_is_seen_only_when_it_settles_for_a_whole_window() -> None:
    clock = Clock()
    fold = RepeatFold(window_s=60.0, clock=clock)
    pid = ("[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:9092/1: Broker: Coordinator load "
           "in progress: retrying")
    assert not fold.filter(line(text=pid)) and not fold.filter(line(text=pid))  # a broker just started
    clock.now += 61.0
    record = line(text=pid)
    assert fold.filter(record) and record.getMessage().endswith("(repeated 2 times in 61s)")  # still, a minute on
