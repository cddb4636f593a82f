"""Steady load through the gateway and the Kafka producer, and the ledger of every query it
sent, for the fault suite (``tests/faults``).

The load is open-loop (a query every ``1/rate`` s on each path, whatever happened to the last
one), so a fault cannot slow the senders down and hide itself: every query sent during it is in
the ledger with what came of it. An outcome is one of

- ``real``: a prediction made by the models (``partial`` when some model was missing);
- ``default``: the app's default, with the selector's reason;
- ``refused``: a status at the door: an HTTP status, a connection error (the gateway was
  down or dropped the connection), or a Kafka delivery error;
- none (``lost``): no answer and no status by the end of the drain.

The gap of a path is measured on the queries sent from one SLO before the fault on (those in
flight when it hit): the first window of ``window_s`` seconds of sends in which every query got
a real answer within its SLO (plus ``late_s`` for the trip to the caller) marks the resumption,
and the gap is the time from the fault to the first of those answers (0 when the first window
is already clean). Judging windows by send time, not by arrival, keeps a query still waiting
on a dead stage from looking like a healthy silence.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PATHS = ("rest", "kafka")


@dataclass
class Query:
    """One query sent, and what reached its caller."""

    path: str
    qid: str
    sent: float  # epoch seconds
    slo_s: float
    done: float = 0.0  # when its outcome reached the caller (0: none yet)
    outcome: str = ""  # real | default | refused | "" (none)
    reason: str = ""  # a default's reason, or what refused it
    missing: int = 0  # models missing from a real answer
    yielded: int = 0  # Kafka: how often ResponseReader yielded its id
    served_ms: float | None = None  # REST: the gateway's own latency for it (its ``latency_ms``)

    def set(self, outcome: str, reason: str = "", missing: int = 0, served_ms: float | None = None) -> None:
        if not self.outcome:  # the first outcome is the caller's; a later one is not its answer
            self.outcome, self.reason, self.missing, self.done = outcome, reason, missing, time.time()
            self.served_ms = served_ms

    def good(self, late_s: float, complete: bool = False) -> bool:
        """A real answer in time (and with every model, for ``complete``)."""
        return (self.outcome == "real" and self.done - self.sent <= self.slo_s + late_s
                and not (complete and self.missing))


def gap_s(queries: Iterable[Query], fault_at: float, window_s: float = 1.0, late_s: float = 0.5,
          complete: bool = False) -> float | None:
    """Seconds from the fault until real answers resumed on these queries (module docstring);
    None when no window of ``window_s`` after the fault was clean."""
    seen = sorted((q for q in queries if q.sent >= fault_at - q.slo_s), key=lambda q: q.sent)
    good = [q.good(late_s, complete) for q in seen]
    end = bad = 0  # the window is seen[i:end]; ``bad`` of them did not get a real answer in time
    for i, first in enumerate(seen):
        if seen[-1].sent < first.sent + window_s:
            return None  # no full window left to judge
        while end < len(seen) and seen[end].sent <= first.sent + window_s:
            bad += not good[end]
            end += 1
        if not bad:
            return 0.0 if i == 0 else round(max(0.0, min(q.done for q in seen[i:end]) - fault_at), 3)
        bad -= not good[i]  # one pass over the queries: the ledger is read while the load runs
    return None


def ledger(queries: Iterable[Query], fault_at: float, window_s: float = 1.0, late_s: float = 0.5) -> dict[str, Any]:
    """Counts of one path's queries by outcome, with reasons, duplicates and the gap."""
    qs = list(queries)
    after = [q for q in qs if q.sent >= fault_at]
    bad_after = [q.sent - fault_at for q in after if not q.good(late_s)]
    return {
        "sent": len(qs),
        "sent_after_fault": len(after),
        "answered_real": sum(q.outcome == "real" for q in qs),
        "real_partial": sum(q.outcome == "real" and q.missing > 0 for q in qs),
        "real_late": sum(q.outcome == "real" and not q.good(late_s) for q in qs),
        "answered_default": sum(q.outcome == "default" for q in qs),
        "default_reasons": dict(Counter(q.reason for q in qs if q.outcome == "default")),
        "refused": sum(q.outcome == "refused" for q in qs),
        "refusal_reasons": dict(Counter(q.reason for q in qs if q.outcome == "refused")),
        "lost": sum(not q.outcome for q in qs),
        "duplicates": sum(max(0, q.yielded - 1) for q in qs),
        "gap_s": gap_s(qs, fault_at, window_s, late_s),
        "gap_complete_s": gap_s(qs, fault_at, window_s, late_s, complete=True),
        "last_not_real_s": round(max(bad_after), 3) if bad_after else None,
        "good_by_second": timeline(qs, fault_at, late_s),
        "late_ms": late_where(qs, late_s),
    }


def late_where(queries: Iterable[Query], late_s: float = 0.5) -> dict[str, float] | None:
    """Where the late real answers' time went: the median time from send to the caller, and,
    on REST, the median the gateway took, from when it began reading the request to its
    answer. A gateway figure within the SLO beside a long wait at the caller puts the delay
    before the gateway's handler (the connection, the server, or the caller's own loop), not
    in the pipeline."""
    late = [q for q in queries if q.outcome == "real" and not q.good(late_s)]
    if not late:
        return None
    out = {"caller_p50": round(1000 * float(np.median([q.done - q.sent for q in late])), 1)}
    served = [q.served_ms for q in late if q.served_ms is not None]
    if served:
        out["gateway_p50"] = round(float(np.median(served)), 1)
    return out


def timeline(queries: Iterable[Query], fault_at: float, late_s: float = 0.5) -> str:
    """One digit per second of sends from the fault on: the tenths of that second's queries
    that got a real answer in time (``9``: at least nine in ten; ``-``: none sent), so a
    ledger shows whether a path came back at once, flickered or stayed down."""
    by_second: dict[int, list[bool]] = {}
    for q in queries:
        if q.sent >= fault_at:
            by_second.setdefault(int(q.sent - fault_at), []).append(q.good(late_s))
    if not by_second:
        return ""
    return "".join(str(min(9, int(10 * sum(g) / len(g)))) if (g := by_second.get(s)) else "-"
                   for s in range(max(by_second) + 1))


def table(name: str, paths: dict[str, dict[str, Any]]) -> str:
    """The ledgers of one fault as a small text table, with the reasons under it."""
    cols = ("sent", "answered_real", "real_partial", "real_late", "answered_default", "refused",
            "lost", "duplicates", "gap_s", "gap_complete_s", "last_not_real_s")
    heads = ("sent", "real", "partial", "late", "default", "refused", "lost", "dup", "gap_s",
             "complete_s", "last_bad_s")
    lines = [f"ledger: {name}", "path   " + " ".join(f"{h:>10}" for h in heads)]
    for path, row in paths.items():
        lines.append(f"{path:<6} " + " ".join(f"{'-' if row[c] is None else row[c]!s:>10}" for c in cols))
    for path, row in paths.items():
        lines.append(f"  {path}: defaults {row['default_reasons'] or '{}'}; refused {row['refusal_reasons'] or '{}'}")
    for path, row in paths.items():
        lines.append(f"  {path}: tenths in time by second from the fault: {row['good_by_second'] or '-'}")
    for path, row in paths.items():
        if late := row.get("late_ms"):
            medians = ", ".join(f"{k} {v:,.1f}" for k, v in late.items())
            lines.append(f"  {path}: late real answers, median ms: {medians}")
    return "\n".join(lines)


class Load:
    """``rate`` queries a second through the gateway and ``rate`` through ``clipstream.Producer``,
    each with a fresh input (no prediction-cache hit), until ``stop``."""

    def __init__(self, url: str, app: str, settings: Any, rate: float, slo_ms: float,
                 size: int = 64, seed: int = 0) -> None:
        from frontend.producer import Producer, ResponseReader

        self.url, self.app, self.rate, self.slo_ms, self.size = url.rstrip("/"), app, rate, slo_ms, size
        self.queries: dict[str, Query] = {}
        # each path's queries in the order sent (one sender per path): the health check reads
        # their tail many times a second, and a copy of every query each time would cost more
        # the longer a slow start lasts, taking the CPU from the load it watches
        self._sent: dict[str, list[Query]] = {p: [] for p in PATHS}
        self._rng = np.random.default_rng(seed)
        self._stop = threading.Event()
        self._producer = Producer(settings=settings)
        self._reader = ResponseReader(settings)  # reads from the end now: nothing is missed
        self._threads: list[threading.Thread] = []
        self._rest_done = threading.Event()
        self._drained = threading.Event()  # the reader stops once the drain is over

    @property
    def raw_duplicates(self) -> int:
        """Second Responses on the topic that the reader dropped (not a caller's duplicate)."""
        return self._reader.duplicates

    def of(self, path: str) -> list[Query]:
        """Every query sent on ``path``, in the order sent."""
        return list(self._sent[path])

    def tail(self, path: str, n: int) -> tuple[int, list[Query]]:
        """How many queries were sent on ``path``, and the last ``n`` of them."""
        sent = self._sent[path]
        return len(sent), sent[-n:]

    def start(self) -> "Load":
        for target in (self._rest, self._kafka, self._read):
            self._threads.append(threading.Thread(target=target, daemon=True))
            self._threads[-1].start()
        return self

    def stop(self, drain_s: float) -> None:
        """Stop sending; wait up to ``drain_s`` for every query's outcome, then close."""
        self._stop.set()
        deadline = time.monotonic() + drain_s
        try:
            self._producer.flush(max(1.0, drain_s / 2))
        except Exception:  # noqa: BLE001 - what was not delivered shows as lost or refused
            pass
        while time.monotonic() < deadline and not (self._rest_done.is_set() and all(q.outcome for q in self.of("kafka"))):
            time.sleep(0.05)
        quiet = time.monotonic() + 1.0  # a late second Response still on its way counts too
        while time.monotonic() < quiet:
            time.sleep(0.05)
        self._drained.set()
        for t in self._threads:
            t.join(10)
        self._reader.close()
        self._producer.close()

    def _input(self) -> np.ndarray:
        return self._rng.uniform(0.0, 1.0, self.size).astype(np.float32)

    def _pace(self, start: float, i: int) -> None:
        self._stop.wait(max(0.0, start + i / self.rate - time.monotonic()))

    def _rest(self) -> None:
        asyncio.run(self._rest_loop())
        self._rest_done.set()

    async def _rest_loop(self) -> None:
        import httpx

        timeout = self.slo_ms / 1000 + 20.0  # an answer never takes this long; no answer is lost
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=self.url, timeout=timeout, limits=limits) as http:
            tasks: list[asyncio.Task[None]] = []
            start, i = time.monotonic(), 0
            while not self._stop.is_set():
                q = Query("rest", uuid.uuid4().hex, time.time(), self.slo_ms / 1000)
                self.queries[q.qid] = q
                self._sent["rest"].append(q)
                tasks.append(asyncio.create_task(self._call(http, q, self._input())))
                i += 1
                await asyncio.sleep(max(0.0, start + i / self.rate - time.monotonic()))
            await asyncio.gather(*tasks)

    async def _call(self, http: Any, q: Query, x: np.ndarray) -> None:
        import httpx

        from frontend.client import post_predict  # as ``Client.predict``: once more on a dropped connection

        body = {"input": [round(float(v), 6) for v in x], "slo_ms": self.slo_ms}
        try:
            r = await post_predict(http, f"/v1/apps/{self.app}/predict", body)
        except httpx.TimeoutException:
            return  # no answer and no status: lost
        except httpx.TransportError as exc:
            q.set("refused", f"connection: {type(exc).__name__}")
            return
        if r.status_code != 200:
            detail = r.json().get("detail", "") if r.headers.get("content-type", "").startswith("application/json") else ""
            q.set("refused", f"{r.status_code} {_blank_numbers(str(detail))}".strip())
            return
        answer = r.json()
        if answer.get("default"):
            q.set("default", str(answer.get("default_reason")))
        else:
            q.set("real", missing=len(answer.get("models", {}).get("missing", [])), served_ms=answer.get("latency_ms"))

    def _kafka(self) -> None:
        start, i = time.monotonic(), 0
        while not self._stop.is_set():
            q = Query("kafka", uuid.uuid4().hex, time.time(), self.slo_ms / 1000)
            self.queries[q.qid] = q
            self._sent["kafka"].append(q)
            self._producer.send_query(self.app, self._input(), slo_ms=self.slo_ms, query_id=q.qid,
                                      on_delivery=self._delivered)
            i += 1
            self._producer.poll(0)
            self._pace(start, i)

    def _delivered(self, qid: str, error: Exception | None) -> None:
        if error is not None:
            self.queries[qid].set("refused", f"delivery: {error}")

    def _read(self) -> None:
        while not self._drained.is_set():
            r = self._reader.poll(0.05)
            if r is None or (q := self.queries.get(r.query_id)) is None:
                continue
            q.yielded += 1
            if r.is_default:
                q.set("default", str(r.default_reason))
            else:
                q.set("real", missing=len(r.missing))


def _blank_numbers(text: str) -> str:
    import re

    return re.sub(r"\d+", "N", text)


# --- the stages `clipstream up` runs ----------------------------------------------------------


def stage_pid(log_dir: Path, stage: str) -> int | None:
    """The pid of ``up``'s stage ``stage``, found by the heartbeat file ``up`` names for it in the
    stage's environment (unique per stage and per ``up``); None while it is not running.

    The stage's spare (``clipstream.spare``) has the same environment, and is always started
    after the process serving as the stage: the oldest of them is the stage."""
    from topics.stage import HEARTBEAT_FILE_ENV

    needle = f"{HEARTBEAT_FILE_ENV}={log_dir / stage}.heartbeat".encode()
    found: list[tuple[int, int]] = []  # (start time in clock ticks, pid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if needle in env and fields[0] != "Z":
            found.append((int(fields[19]), int(entry)))  # field 22 of stat, counted after the name
    return min(found)[1] if found else None


def ready_count(log_dir: Path, stage: str) -> int:
    """How many times the stage has printed its ``ready:`` line (its log is appended to)."""
    try:
        return sum(line.startswith("ready:") for line in (log_dir / f"{stage}.log").read_text(errors="replace").splitlines())
    except OSError:
        return 0


def observe(until: Callable[[], bool], deadline_s: float, every_s: float = 0.25) -> None:
    """Keep the load running until ``until()`` holds or ``deadline_s`` seconds have passed (a
    fault that never heals still ends the run, with its ledger)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and not until():
        time.sleep(every_s)
