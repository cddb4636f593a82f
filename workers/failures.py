"""What a worker says when its model's ``predict_batch`` fails.

A failing model call is answered with ``error`` predictions and the worker serves on, so
without a log line a broken version is silent: callers see the model missing from their
answers and nothing says why. ``ModelFailures`` writes one line per kind of failure (the
model, its version, and the exception's type and the line that raised it) at once, with the traceback of its
first occurrence, then at most one line per kind every ``every_s`` seconds saying how many
were folded into it, so a model failing on every batch cannot flood the log.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from topics.stage import alert

EVERY_S = 30.0
MAX_KINDS = 32  # kinds counted apart; beyond them (messages that differ every time) one is shared
TRACEBACK_FRAMES = 5
MESSAGE_CHARS = 300
OTHER: Hashable = ("other kinds",)  # the shared kind once ``max_kinds`` are counted apart


@dataclass(frozen=True)
class Say:
    """A line is due for a kind: the first one (``first``), or one folding ``folded`` more
    occurrences seen over the last ``over_s`` seconds."""

    kind: Hashable
    first: bool
    folded: int
    over_s: float


@dataclass
class _Kind:
    said_at: float  # when its last line was due
    folded: int = 0  # occurrences since, not said yet


class Folding:
    """Rate limiting per kind, with no I/O and an injectable clock (``clock``: seconds,
    monotonic): ``offer`` says whether an occurrence of a kind is to be written now.

    Not thread-safe on its own: its caller serialises the calls.
    """

    def __init__(self, every_s: float = EVERY_S, *, clock: Callable[[], float] = time.monotonic,
                 max_kinds: int = MAX_KINDS) -> None:
        self.every_s, self.clock, self.max_kinds = every_s, clock, max_kinds
        self._kinds: dict[Hashable, _Kind] = {}
        self.folded = 0  # occurrences folded and not said yet, of every kind

    def offer(self, kind: Hashable) -> Say | None:
        """One occurrence of ``kind``: a ``Say`` when a line is due (the first of its kind, or the
        first once ``every_s`` passed since its last line), else None (it is folded)."""
        now = self.clock()
        seen = self._kinds.get(kind)
        if seen is None:
            if len(self._kinds) >= self.max_kinds:
                self._forget_quiet(now)
            if len(self._kinds) >= self.max_kinds and kind != OTHER:
                return self.offer(OTHER)
            self._kinds[kind] = _Kind(now)
            return Say(kind, True, 0, 0.0)
        if now - seen.said_at < self.every_s:
            seen.folded += 1
            self.folded += 1
            return None
        say = Say(kind, False, seen.folded, now - seen.said_at)
        self.folded -= seen.folded
        seen.said_at, seen.folded = now, 0
        return say

    def unsaid(self, older_than_s: float = 0.0) -> list[Say]:
        """The kinds with folded occurrences not said yet whose last line is at least
        ``older_than_s`` old (all: for a last word when stopping); they count as said."""
        now, due = self.clock(), []
        for kind, seen in self._kinds.items():
            if seen.folded and now - seen.said_at >= older_than_s:
                due.append(Say(kind, False, seen.folded, now - seen.said_at))
                self.folded -= seen.folded
                seen.said_at, seen.folded = now, 0
        return due

    def _forget_quiet(self, now: float) -> None:
        # a kind with nothing folded and no line for a while would get a line at once anyway
        for kind in [k for k, s in self._kinds.items() if not s.folded and now - s.said_at >= self.every_s]:
            del self._kinds[kind]


def kind_of(exc: BaseException) -> Hashable:
    """A failure's kind: the exception's type and the line that raised it, not its message,
    which may quote the input (``input too big: 202.0``) and so differ on every batch."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = (frames[-1].filename, frames[-1].lineno) if frames else None
    return type(exc).__name__, where


def short_traceback(exc: BaseException, frames: int = TRACEBACK_FRAMES) -> str:
    """``exc``'s traceback, its last ``frames`` frames only: the model's own code, where the
    fix goes, is at the end, and the worker's frames above it say nothing new."""
    depth = len(traceback.extract_tb(exc.__traceback__))
    lines = traceback.format_exception(exc, limit=-frames if depth > frames else None)
    text = "".join(lines).rstrip("\n")
    if depth > frames:
        text += f"\n(the last {frames} of {depth} frames)"
    return text


def _clip(text: str, chars: int = MESSAGE_CHARS) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _say(text: str) -> None:
    """The failure's line for ``clipstream up`` too (``topics.stage.alert``); its traceback,
    which follows it, for the worker's log alone."""
    head, _, rest = text.partition("\n")
    alert("worker", head)
    if rest:
        print(rest, file=sys.stderr, flush=True)


class ModelFailures:
    """The worker's account of failing model calls, written with ``say`` (default: an alert in
    the worker's log, which ``clipstream up`` prints too), rate limited by a ``Folding``.

    Only a failure calls it, so a successful batch pays nothing for it. Thread-safe: the
    worker finishes batches on its main and its emitter threads.
    """

    def __init__(self, replica: int, *, say: Callable[[str], None] = _say, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic, max_kinds: int = MAX_KINDS) -> None:
        self.replica, self.say = replica, say
        self.folding = Folding(every_s, clock=clock, max_kinds=max_kinds)
        self._lock = threading.Lock()
        self._texts: dict[Hashable, str] = {}  # kind -> its latest text, for the stop's last word

    def failed(self, model: str, version: str | None, failure: str, exc: BaseException | None = None,
               *, group: str | None = None) -> None:
        """One failed model call of ``model`` at ``version`` (a member of ``group``, if any):
        ``failure`` is what its items were answered with, ``exc`` what was raised (its traceback
        is written with the first line of its kind)."""
        what = f"{type(exc).__name__}: {exc}" if exc is not None else failure.removeprefix("model error: ")
        key = (model, version, group, kind_of(exc) if exc is not None else what)
        with self._lock:
            say = self.folding.offer(key)
            if key in self._texts or len(self._texts) < 4 * self.folding.max_kinds:
                self._texts[key] = what
        if say is None:
            return
        other = say.kind == OTHER
        line = self.line(model, version, what, group=group)
        if other and say.first:
            line += " (too many kinds of failure to count apart: further new ones are folded together)"
        elif say.folded:  # a kind seen again after a quiet interval is said as it is
            line += self.folded(say)
        if say.first and exc is not None and not other:
            line += "\n" + short_traceback(exc)
        self.say(line)

    def line(self, model: str, version: str | None, what: str, *, group: str | None = None) -> str:
        """The line for a failure: who failed, with what, and the way out."""
        at = f"version {version}" if version is not None else "(no version)"
        member = f" (member of group {group})" if group is not None else ""
        return (f"model {model} {at}{member} replica {self.replica}: predict_batch failed: {_clip(what)}; "
                f"its items are answered with errors. Roll it back (clipstream rollback {model}) or "
                f"deploy a fixed version (clipstream deploy-model {model} PATH --version N)")

    @staticmethod
    def folded(say: Say) -> str:
        """How many occurrences a line stands for beyond itself."""
        like = "of other kinds" if say.kind == OTHER else "like it"
        return f" ({say.folded} more failure{'s' * (say.folded != 1)} {like} in {say.over_s:.0f} s)"

    def tick(self) -> None:
        """Say the failures folded since their kind's last line once ``every_s`` has passed,
        though none of the kind came since: a model that failed in a burst and then stopped
        failing is told in full now, not when the worker stops. Free while nothing is folded."""
        if self.folding.folded:
            self._say_folded(self.folding.every_s)

    def close(self) -> None:
        """Say how many failures were folded since their kind's last line (when stopping)."""
        self._say_folded(0.0)

    def _say_folded(self, older_than_s: float) -> None:
        with self._lock:
            due = self.folding.unsaid(older_than_s)
        for say in due:
            if say.kind == OTHER:
                self.say(f"replica {self.replica}: model calls failed" + self.folded(say))
                continue
            model, version, group, _ = say.kind  # type: ignore[misc]
            what = self._texts.get(say.kind, "model calls failed")
            self.say(self.line(model, version, what, group=group) + self.folded(say))
