"""The join state of one selector: pending queries waiting for their models' predictions.

A query is answered when every model it was sent to has reported, or at its deadline with
whatever arrived (Clipper 5.2.2: a late answer is worse than an inaccurate one). A query with
nothing at all by its deadline may have a later last resort: the default is the least accurate
answer there is, so it waits there for a first prediction (the selector's deadline is the
reply budget early, the last resort the budget's floor early). Expired and
error predictions are reports without an answer: they count as missing. A prediction that
arrives after the answer is dropped and counted; a memory of the ids answered in the last
minute (bounded in count too) tells a late prediction from one we never heard of: a window by
time keeps a long-running selector's memory flat whatever its rate. Pure Python: the Kafka adapter feeds it.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

from schemas.reasons import MODELS_FAILED, MODELS_LATE, NO_TIME_TO_ASK, NOTHING_ARRIVED, OK_STATUSES, refused_input
from selector.types import Output, Query, State


@dataclass(slots=True)
class Asked:
    """What answering a query needs besides its predictions: where and by when the answer goes,
    and what ``select`` saw, which ``combine`` sees too. The selector fills it in at dispatch."""

    app: str = ""
    deadline_us: int = 0  # the caller's deadline, which the Response carries (not the cutoff)
    reply_topic: str | None = None  # None: the shared responses topic
    reply_partition: int | None = None
    context: str | None = None
    trace: dict[str, int] = field(default_factory=dict)  # the query's stage stamps, then the last prediction's
    query: Query | None = None
    state: State | None = None  # the policy state select used
    partition: int | None = None  # the queries partition it was read from (handed over with it)


@dataclass
class Pending:
    """A query in flight: who it was sent to, when it is due, and what has come back."""

    query_id: str
    expected: tuple[str, ...]
    deadline_us: int
    asked: Asked = field(default_factory=Asked)
    arrived: dict[str, Output] = field(default_factory=dict)  # model -> the prediction's output
    failed: dict[str, str] = field(default_factory=dict)  # model -> why (expired, error text)
    expired: set[str] = field(default_factory=set)  # of ``failed``: given up or expired, late rather than broken
    versions: dict[str, str | None] = field(default_factory=dict)  # model -> the version that answered
    completed_us: int | None = None
    last_resort_us: int | None = None  # with nothing arrived by ``deadline_us``, wait to here

    def extend(self) -> bool:
        """Nothing arrived and a later last resort remains: move the deadline there."""
        if self.arrived or self.last_resort_us is None or self.last_resort_us <= self.deadline_us:
            return False
        self.deadline_us, self.last_resort_us = self.last_resort_us, None
        return True

    @property
    def complete(self) -> bool:
        return all(m in self.arrived or m in self.failed for m in self.expected)

    @property
    def missing(self) -> list[str]:
        """Stragglers (no report by the deadline) and models that failed or expired."""
        return [m for m in self.expected if m not in self.arrived]


class JoinState:
    """Pending queries keyed by id, plus a deadline heap (lazy deletion) for the timer."""

    def __init__(self, answered_capacity: int = 100_000, answered_window_us: int = 60_000_000) -> None:
        self._pending: dict[str, Pending] = {}
        self._heap: list[tuple[int, str]] = []
        self._answered: OrderedDict[str, int] = OrderedDict()  # query id -> its deadline
        self._answered_capacity = answered_capacity
        self._answered_window_us = answered_window_us
        self.late = 0  # predictions that came after the answer
        self.unknown = 0  # predictions for queries this selector never registered
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, query_id: str) -> bool:
        return query_id in self._pending

    def get(self, query_id: str) -> Pending | None:
        return self._pending.get(query_id)

    def register(self, query_id: str, expected: list[str] | tuple[str, ...], deadline_us: int,
                 last_resort_us: int | None = None, asked: Asked | None = None) -> Pending:
        pending = Pending(query_id, tuple(expected), int(deadline_us), asked if asked is not None else Asked(),
                          last_resort_us=None if last_resort_us is None else int(last_resort_us))
        self._pending[query_id] = pending
        heapq.heappush(self._heap, (pending.deadline_us, query_id))
        return pending

    def add(self, query_id: str, model: str, status: str, output: Output | None = None, error: str | None = None,
            version: str | None = None) -> Pending | None:
        """Record one model's report; the pending query (now removed) if that completes it."""
        pending = self._pending.get(query_id)
        if pending is None:
            if query_id in self._answered:
                self.late += 1
            else:
                self.unknown += 1
            return None
        if model not in pending.expected or model in pending.arrived or model in pending.failed:
            self.duplicates += 1
            return None
        if status in OK_STATUSES and output is not None:
            pending.arrived[model] = output
            pending.versions[model] = version
        else:
            pending.failed[model] = error or status
            if status == "expired":
                pending.expired.add(model)
        if pending.complete:
            return self.finish(query_id)
        return None

    def expired(self, now_us: int) -> list[Pending]:
        """The queries whose deadline has come (removed): they are answered with what arrived."""
        due = []
        while self._heap and self._heap[0][0] <= now_us:
            _, query_id = heapq.heappop(self._heap)
            pending = self._pending.get(query_id)
            if pending is None or pending.deadline_us > now_us:
                continue
            if pending.extend() and pending.deadline_us > now_us:
                heapq.heappush(self._heap, (pending.deadline_us, query_id))
            else:
                due.append(self.finish(query_id))
        return due

    def next_deadline(self) -> int | None:
        """The earliest deadline of a pending query: the selector's poll timeout runs to it."""
        while self._heap and self._heap[0][1] not in self._pending:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def drop_partitions(self, partitions: set[int]) -> int:
        """Forget, unanswered, the queries read from ``partitions``: they moved to another
        member, which reads them again and answers them. How many were dropped."""
        gone = [qid for qid, p in self._pending.items() if p.asked.partition in partitions]
        for qid in gone:
            del self._pending[qid]  # its heap entry is skipped when it comes up
        return len(gone)

    def finish(self, query_id: str) -> Pending:
        pending = self._pending.pop(query_id)
        answered = self._answered
        answered[query_id] = pending.deadline_us
        horizon = pending.deadline_us - self._answered_window_us
        while answered and (len(answered) > self._answered_capacity or next(iter(answered.values())) < horizon):
            answered.popitem(last=False)
        return pending

    def answered(self, query_id: str) -> bool:
        return query_id in self._answered


# a model's failure when it was not asked: its recent trips take longer than the time left
NOT_ASKED = "not asked: its recent trips take longer than the time left"


def gave_nothing(pending: Pending) -> list[str]:
    """The models a feedback on the query teaches as wrong: each one asked that gave no answer,
    save one that refused the caller's input (the caller's mistake, not the model's)."""
    return [m for m in pending.missing if refused_input(m, pending.failed.get(m, "")) is None]


def why_default(pending: Pending) -> str:
    """Why a query with no prediction in hand gets the default."""
    if not pending.expected:
        return "the policy selected no model"
    if all(pending.failed.get(m) == NOT_ASKED for m in pending.expected):
        return NO_TIME_TO_ASK
    if len(pending.failed) == len(pending.expected):
        refused = {refused_input(m, e) for m, e in pending.failed.items()}
        if len(refused) == 1 and None not in refused:
            return f"every model refused the input: {refused.pop()}"  # said once, not once per model
        each = "; ".join(f"{m}: {e}" for m, e in pending.failed.items())
        return (MODELS_LATE if pending.expired.issuperset(pending.failed) else MODELS_FAILED) + each
    return NOTHING_ARRIVED
