"""How often each process talks to the broker and is woken, counted over a load step.

CPU per query says how much a stage spends; these say on what. Each request a Kafka client
sends to the broker is one TCP data segment on loopback (records here are a few kB, far under
the loopback MTU), so the segments a process sent to the broker's port over a step, divided
by the queries, count its broker requests per query: the produces, fetches and commits that a
query's records cost. Context switches per query count the wake-ups behind them.

``ss`` (iproute2) reads the sockets; where it is missing the counts are left out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

_PIDS = re.compile(r"pid=(\d+)")
_SEGS_OUT = re.compile(r"\bdata_segs_out:(\d+)")


def parse_ss(text: str, port: int) -> dict[int, int]:
    """Data segments sent to ``port`` so far, per owning pid, from ``ss -tinpH`` output (each
    socket is one line, its counters on the indented line after it)."""
    out: dict[int, int] = {}
    pids: list[int] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            parts = line.split()
            peer = parts[4] if len(parts) > 4 else ""
            to_port = peer.rsplit(":", 1)[-1] == str(port)
            pids = [int(p) for p in _PIDS.findall(line)] if to_port else []
            continue
        m = _SEGS_OUT.search(line)
        if m and pids:
            for pid in dict.fromkeys(pids):  # a socket shared by a fork counts once per process
                out[pid] = out.get(pid, 0) + int(m.group(1))
            pids = []
    return out


def broker_segments(pids: Mapping[int, str], port: int) -> dict[str, int] | None:
    """Data segments each labelled process has sent to the broker at ``port`` so far (the same
    label adds up); None when ``ss`` is not installed."""
    if shutil.which("ss") is None:
        return None
    text = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30).stdout
    sent = parse_ss(text, port)
    out: dict[str, int] = {}
    for pid, label in pids.items():
        out[label] = out.get(label, 0) + sent.get(pid, 0)
    return out


def context_switches(pids: Mapping[int, str], proc: Path = Path("/proc")) -> dict[str, int]:
    """Voluntary plus involuntary context switches of every thread of each labelled process."""
    out: dict[str, int] = {}
    for pid, label in pids.items():
        total = 0
        try:
            tids = os.listdir(proc / str(pid) / "task")
        except OSError:
            continue
        for tid in tids:
            try:
                text = (proc / str(pid) / "task" / tid / "status").read_text()
            except OSError:
                continue
            total += sum(int(line.split()[1]) for line in text.splitlines() if "ctxt_switches:" in line)
        out[label] = out.get(label, 0) + total
    return out


def snapshot(pids: Mapping[int, str], port: int | None) -> tuple[dict[str, int] | None, dict[str, int]]:
    """Both counts now: segments sent to the broker at ``port`` (None without a broker) and
    context switches, per label."""
    return (broker_segments(pids, port) if port else None), context_switches(pids)


def per_query(before: Mapping[str, int] | None, after: Mapping[str, int] | None, queries: int) -> dict[str, float] | None:
    """The growth of each count over a step, per query, largest first."""
    if before is None or after is None:
        return None
    n = max(1, queries)
    grown = {k: (v - before.get(k, 0)) / n for k, v in after.items()}
    return {k: round(v, 2) for k, v in sorted(grown.items(), key=lambda kv: -kv[1])}
