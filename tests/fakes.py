"""Stand-ins shared by unit tests: no broker."""

from __future__ import annotations

from typing import Any


class FakeMsg:
    """A consumed Kafka record: the parts of ``confluent_kafka.Message`` the stages read."""

    def __init__(self, value: bytes | None = b"", topic: str = "t", partition: int = 0, offset: int = 0,
                 error: Any = None) -> None:
        self._v, self._t, self._p, self._o, self._e = value, topic, partition, offset, error

    def value(self) -> bytes | None:
        return self._v

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def error(self) -> Any:
        return self._e
