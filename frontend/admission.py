"""How many predictions the gateway lets into the pipeline at once: AIMD on concurrency.

Under overload every stage queues, every query becomes late and the pipeline answers nobody
in time; callers are better served by a quick 503 for the excess than by a default after the
SLO. The right number in flight is (by Little's law) the rate the pipeline sustains times
its latency, which nobody configures, so it is learnt the way Clipper learns a batch size:
each answer in time raises the limit a little (by one per limit's worth of answers), and a
limit's worth of answers of which too many were bad cuts it by a fraction.

What counts as bad is what says the pipeline is behind, and nothing else (docs/design/0015):
an answer that came late or empty (``late``), or one that had every model's prediction yet
came slowly (``slow``, queueing shows in latency before it shows in missed deadlines). An
answer made at the straggler cutoff with predictions in hand is on time: its latency is the
cutoff's, set by the SLO, and says nothing about load. One bad answer never cuts: a pause (a
GC, a broker hiccup) delays every query in flight at that moment, so a cut needs a share of
a limit's worth of answers, which a hiccup of a lightly loaded pipeline does not reach. As in
TCP, only answers to queries admitted after the last cut count towards the next one.

The limit grows past its initial value only while it is in use (a query admitted with at
least half the limit already in flight), as TCP validates its window (RFC 7661): at light
load nothing tests a higher limit. Below the initial value it regrows on any answer in time,
as TCP restarts from its initial window: light load needs no proof, and a limit left low by
an old overload would otherwise refuse the bursts of a light load for good. Pure: the
gateway passes the clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, Literal

from schemas.reasons import behind

MIN_WINDOW = 8  # answers a cut is judged over, at the least (a limit's worth when larger)
BAD_SHARE = 0.25  # the share of that window that must be bad for a cut


Verdict = Literal["late", "slow", "on_time"]


def verdict(answer: Mapping[str, Any], timed_out: bool, slo_ms: float, slow_fraction: float,
            waited_ms: float = 0.0) -> Verdict | None:
    """What an answer (the caller's JSON) says about load; None: nothing (a default for another
    reason than an empty pipeline, such as every model failing).

    Late: no reply, a default because nothing arrived (no time left to ask, every model given up
    as late by its batcher), or an answer after the SLO. Slow: every model answered, but the
    pipeline took past ``slow_fraction`` of the SLO, not counting the ``waited_ms`` the query
    waited for a slot in the gateway (that wait is the limit's doing, not the pipeline's). Any
    other answer with predictions in hand is on time, a straggler missing or not: the cutoff,
    not the load, set its latency.
    """
    if timed_out or answer["latency_ms"] > slo_ms or (
            answer["default"] and behind(answer.get("default_reason"))):
        return "late"
    if answer["default"]:
        return None
    if not answer["models"]["missing"] and answer["latency_ms"] - waited_ms > slo_ms * slow_fraction:
        return "slow"
    return "on_time"


class AdmissionLimit:
    """An additive-increase / multiplicative-decrease limit on predictions in flight."""

    def __init__(self, initial: float = 16.0, floor: float = 4.0, ceiling: float = 4096.0,
                 backoff: float = 0.9) -> None:
        if not 0 < floor <= initial <= ceiling or not 0 < backoff < 1:
            raise ValueError("need 0 < floor <= initial <= ceiling and 0 < backoff < 1")
        self.limit, self.floor, self.ceiling = float(initial), float(floor), float(ceiling)
        self.initial = float(initial)
        self.backoff = backoff
        self._last_cut_us: int | None = None
        self._recent: deque[bool] = deque()  # since the last cut: was each answer bad?
        self._bad_in_recent = 0  # how many of those were (kept, not summed per answer)
        self.cuts = 0

    def admits(self, inflight: int) -> bool:
        return inflight < int(self.limit)

    @property
    def window(self) -> int:
        """How many answers a cut is judged over: a limit's worth, at least MIN_WINDOW."""
        return max(MIN_WINDOW, int(self.limit))

    def on_time(self, inflight_at_admission: int | None = None, admitted_us: int | None = None) -> None:
        """An answer in time with predictions in hand (the straggler cutoff's included).

        ``inflight_at_admission``: how many were in flight when this query was let in; above
        the initial limit, it grows only if that was at least half of it (None: assume so).
        """
        self._count(False, admitted_us)
        in_use = inflight_at_admission is None or inflight_at_admission + 1 >= self.limit / 2
        if in_use or self.limit < self.initial:
            self.limit = min(self.ceiling, self.limit + 1.0 / self.limit)

    def late(self, now_us: int, admitted_us: int) -> bool:
        """An answer the pipeline did not make in time (none by the deadline, nothing arrived,
        or it came after the deadline) for a query admitted at ``admitted_us``. True: a cut."""
        return self._bad(now_us, admitted_us)

    def slow(self, now_us: int, admitted_us: int) -> bool:
        """An answer in time with every model's prediction, but slow: queueing. True: a cut."""
        return self._bad(now_us, admitted_us)

    def cut(self, now_us: int, admitted_us: int) -> bool:
        """Cut at once on evidence of its own (the gateway's event loop behind), unless a cut
        came after ``admitted_us`` already. True: a cut."""
        if self._last_cut_us is not None and admitted_us <= self._last_cut_us:
            return False
        self._last_cut_us = now_us
        self._recent.clear()
        self._bad_in_recent = 0
        self.limit = max(self.floor, self.limit * self.backoff)
        self.cuts += 1
        return True

    def _count(self, bad: bool, admitted_us: int | None) -> bool:
        if admitted_us is not None and self._last_cut_us is not None and admitted_us <= self._last_cut_us:
            return False  # let in under the old limit: says nothing about the new one
        self._recent.append(bad)
        self._bad_in_recent += bad
        while len(self._recent) > self.window:
            self._bad_in_recent -= self._recent.popleft()
        return True

    def _bad(self, now_us: int, admitted_us: int) -> bool:
        if not self._count(True, admitted_us):
            return False
        if self._bad_in_recent < max(2.0, BAD_SHARE * self.window):
            return False
        return self.cut(now_us, admitted_us)


class RecentTimes:
    """A high quantile of how long the pipeline took for an app's recent answers (from admission
    to answer, ms): a caller waits for a slot only as long as those leave room for before the
    slow band of its SLO, so under a lasting overload, when answers take most of the SLO, a
    wait would only make the answer late and the 503 comes at once."""

    def __init__(self, window: int = 64, quantile: float = 0.9, every: int = 16) -> None:
        self._recent: deque[float] = deque(maxlen=window)
        self._quantile, self._every, self._seen = quantile, every, 0
        self.value = 0.0  # recomputed every ``every`` answers (each one, while still few)

    def add(self, took_ms: float) -> None:
        self._recent.append(took_ms)
        self._seen += 1
        if self._seen % self._every == 0 or self._seen < self._every:
            ordered = sorted(self._recent)
            self.value = ordered[min(len(ordered) - 1, int(self._quantile * len(ordered)))]

