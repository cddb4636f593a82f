"""librdkafka's log lines through Python ``logging``, with repeats folded.

Left to itself librdkafka writes every line to stderr from its own threads, and a client that
cannot reach a broker retries many times a second, each retry a line: a stage started with no
Kafka printed hundreds of identical lines before its one ``error:`` line. Every clipstream client
is given ``KAFKA_LOG`` (the ``logger`` setting of ``topics.client.common_config``) instead, so its
lines take the stage's log format and level, and ``RepeatFold`` lets the first line of each kind
through and folds the repeats: a broker failover still shows in a stage's log at once, and an
outage that goes on shows as one line per ``window_s`` with the count of the lines folded.

confluent-kafka hands a client's lines to the logger only when the client is served (``poll``,
``consume``, ``flush``): a client that is never polled keeps its lines queued, and they go with
it. ``topics.admin`` polls its admin client after a failed metadata request so that what
librdkafka saw of the failure is shown before the error that ends the stage.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# the logger every clipstream Kafka client writes to (it propagates: a stage's handlers print it)
KAFKA_LOGGER_NAME = "clipstream.kafka"

# one line per kind per this many seconds while a condition lasts: long enough that an outage
# costs a handful of lines, short enough that one that goes on is seen to go on
FOLD_WINDOW_S = 60.0

# kinds remembered at most: the oldest are forgotten first (a forgotten kind shows again)
FOLD_MAX_KINDS = 512

# lines of a broker still settling after its start, which librdkafka retries by itself: the first
# is held back as if already shown, so only one that lasts a whole window is seen
SETTLING = ("Coordinator load in progress",)

# librdkafka names the client in each line ("rdkafka#producer-3"); every client of a stage sees
# the same broker go away, and one line says so
_CLIENT = re.compile(r"\[[^\]\s]*#(?:producer|consumer)-\d+\] ?")
# what changes from one retry to the next without changing what happened: durations, and the
# counts librdkafka puts in parentheses ("after 0ms in state CONNECT", "3 requests in flight")
_DURATION = re.compile(r"\b\d+(?:\.\d+)?ms\b")
_PARENS = re.compile(r"\([^()]*\)")
_NUMBER = re.compile(r"\d+")


def fold_key(level: int, text: str) -> str:
    """The kind of a line: its level and text less the client's name, durations and the
    numbers in parentheses, so retries of one failure share a kind while a line about another
    broker (its address, its id) does not."""
    text = _CLIENT.sub("", text)
    text = _DURATION.sub("Nms", text)
    text = _PARENS.sub(lambda m: _NUMBER.sub("N", m.group()), text)
    return f"{level}:{text}"


@dataclass
class _Kind:
    shown_at: float  # when a line of this kind was last let through
    folded: int = 0  # lines of this kind held back since


class RepeatFold(logging.Filter):
    """Lets the first line of each kind through (``fold_key``), then at most one per
    ``window_s``; a line let through after some were held back says how many, as
    ``(repeated K times in Ts)``. A ``SETTLING`` line is held back from the first. Thread-safe:
    each client's lines come on the thread that serves it."""

    def __init__(self, window_s: float = FOLD_WINDOW_S, max_kinds: int = FOLD_MAX_KINDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        if window_s <= 0 or max_kinds < 1:
            raise ValueError(f"a fold needs window_s > 0 and max_kinds >= 1, not {window_s}, {max_kinds}")
        self.window_s = window_s
        self.max_kinds = max_kinds
        self._clock = clock
        self._kinds: dict[str, _Kind] = {}  # oldest shown first: the first to forget
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        key = fold_key(record.levelno, text)
        now = self._clock()
        with self._lock:
            kind = self._kinds.get(key)
            if kind is None and any(s in text for s in SETTLING):
                self._kinds[key] = _Kind(now, folded=1)
                return False
            if kind is not None and now - kind.shown_at < self.window_s:
                kind.folded += 1
                return False
            self._kinds.pop(key, None)  # shown again: it moves to the end, the last to forget
            self._kinds[key] = _Kind(now)
            while len(self._kinds) > self.max_kinds:
                del self._kinds[next(iter(self._kinds))]
        if kind is not None and kind.folded:
            record.msg = f"{text} (repeated {kind.folded} times in {now - kind.shown_at:.0f}s)"
            record.args = None
        return True

    def folded(self) -> int:
        """Lines held back and not yet counted on a line let through (for tests, mostly)."""
        with self._lock:
            return sum(kind.folded for kind in self._kinds.values())


def _kafka_logger() -> logging.Logger:
    logger = logging.getLogger(KAFKA_LOGGER_NAME)
    if not any(isinstance(f, RepeatFold) for f in logger.filters):
        logger.addFilter(RepeatFold())
    return logger


KAFKA_LOG = _kafka_logger()
