"""What `up` tells the operator about Kafka's brokers and Redis while it serves.

Every stage rides out a broker's loss or a Redis outage on its own (docs/design/0016, 0017), so
nothing of it reached `up`'s output but librdkafka's own lines: a broker of three killed left
every answer a default for seconds, and a broker that stayed down left its partitions a copy
short, with no word of what to do. The watch compares the brokers Kafka lists with those it
listed before, and pings Redis, and says each change once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

Report = Callable[[str], None]

EVERY_S = 2.0


class InfraWatch:
    """``check`` reports each change: a broker gone or back, Kafka or Redis not answering or
    answering again. ``brokers`` returns {node id: "host:port"} (raises when Kafka does not
    answer); ``redis_ok`` whether Redis answers a PING. ``restart_hint``: how the brokers are
    restarted here."""

    def __init__(self, brokers: Callable[[], dict[int, str]], redis_ok: Callable[[], bool], report: Report,
                 restart_hint: str) -> None:
        self.brokers, self.redis_ok, self.report, self.restart_hint = brokers, redis_ok, report, restart_hint
        self.known: dict[int, str] = {}  # every broker listed since the start
        self.gone: set[int] = set()
        self.kafka_away = False
        self.redis_away = False

    def check(self) -> None:
        try:
            listed = self.brokers()
        except Exception as exc:  # every broker away, or the metadata request timed out
            if not self.kafka_away:
                self.kafka_away = True
                self.report(f"alert: kafka: no broker answers ({_first_line(exc)}); the stages wait for it and "
                            f"queries get the default meanwhile. {self.restart_hint}")
        else:
            if self.kafka_away:
                self.kafka_away = False
                self.report("kafka: answers again")
            self._brokers(listed)
        redis_ok = _safe(self.redis_ok)
        if not redis_ok and not self.redis_away:
            self.redis_away = True
            self.report("alert: redis: does not answer; queries are answered without the prediction cache, "
                        "and feedback is not applied until it does. Check the Redis at CLIPSTREAM_REDIS_URL "
                        "(`clipstream infra status` for a local one)")
        elif redis_ok and self.redis_away:
            self.redis_away = False
            self.report("redis: answers again")

    def _brokers(self, listed: dict[int, str]) -> None:
        self.known.update(listed)
        for node in sorted(set(self.known) - set(listed) - self.gone):
            self.gone.add(node)
            self.report(f"alert: kafka: broker {node} ({self.known[node]}) left the cluster; its partitions "
                        f"have a copy fewer until it is back, and a model's topics cannot be made meanwhile. "
                        f"{self.restart_hint}")
        for node in sorted(self.gone & set(listed)):
            self.gone.discard(node)
            self.report(f"kafka: broker {node} ({listed[node]}) is back")

    def run(self, stop: threading.Event, every_s: float = EVERY_S) -> threading.Thread:
        """Check every ``every_s`` on a thread of its own until ``stop``."""
        def loop() -> None:
            while not stop.wait(every_s):
                self.check()

        thread = threading.Thread(target=loop, name="infra-watch", daemon=True)
        thread.start()
        return thread


def _safe(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:  # a check that fails is a no
        return False


def _first_line(exc: Exception) -> str:
    """The first line of what went wrong: a KafkaError's own words, not its repr."""
    first = exc.args[0] if exc.args else exc
    text = first.str() if hasattr(first, "str") else str(first)
    return text.splitlines()[0] if text else type(exc).__name__


def kafka_brokers(admin: Any, topic: str, timeout_s: float = 5.0) -> dict[int, str]:
    """{node id: "host:port"} of the brokers the cluster lists now (asked with one topic's
    metadata, the smallest answer that lists them)."""
    metadata = admin.list_topics(topic=topic, timeout=timeout_s)
    return {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
