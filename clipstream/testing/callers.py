"""Closed-loop REST callers for tests and benchmarks: each caller sends its next query as soon as
its last one is answered, as an application's request threads do, so the number in flight never
exceeds the number of callers and every refusal says something about the gateway, not the load.

Inputs come from ``flagged_input``: unique per call (no prediction-cache hit can skip a model) and
flagged (first feature 1) on a fixed share of calls, which ``make_stalling_model`` stalls on.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Call:
    """One call: who sent it, whether its input was flagged to stall, and what came back."""

    caller: int
    index: int
    flagged: bool
    status: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    wall_ms: float = 0.0

    @property
    def detail(self) -> str:
        return str(self.body.get("detail", "")) if self.status != 200 else ""


def flagged_input(index: int, stall_share: float, rng: np.random.Generator, size: int = 64) -> tuple[list[float], bool]:
    """A fresh input; flagged on ``stall_share`` of indexes, spread evenly (index-determined)."""
    flagged = int((index + 1) * stall_share) > int(index * stall_share)
    x = rng.uniform(0.0, 0.99, size)
    x[0] = 1.0 if flagged else 0.0
    return [round(float(v), 6) for v in x], flagged


def closed_loop(url: str, app: str, *, callers: int, calls_each: int, stall_share: float = 0.0,
                slo_ms: float | None = None, seed: int = 0, timeout_s: float = 10.0) -> list[Call]:
    """``callers`` concurrent callers, ``calls_each`` calls apiece; every call, in order sent."""
    return asyncio.run(_closed_loop(url, app, callers, calls_each, stall_share, slo_ms, seed, timeout_s))


async def _closed_loop(url: str, app: str, callers: int, calls_each: int, stall_share: float,
                       slo_ms: float | None, seed: int, timeout_s: float) -> list[Call]:
    import httpx

    calls: list[Call] = []
    rng = np.random.default_rng(seed)

    async def caller(k: int, http: httpx.AsyncClient) -> None:
        for n in range(calls_each):
            i = n * callers + k
            x, flagged = flagged_input(i, stall_share, rng)
            call = Call(k, i, flagged)
            body: dict[str, Any] = {"input": x} if slo_ms is None else {"input": x, "slo_ms": slo_ms}
            t0 = time.perf_counter()
            r = await http.post(f"/v1/apps/{app}/predict", json=body)
            call.wall_ms = (time.perf_counter() - t0) * 1000.0
            call.status = r.status_code
            call.body = r.json()
            calls.append(call)

    limits = httpx.Limits(max_connections=callers, max_keepalive_connections=callers)
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout_s, limits=limits) as http:
        await asyncio.gather(*(caller(k, http) for k in range(callers)))
    return calls


def refusal_reasons(details: Iterable[str]) -> dict[str, int]:
    """The gateway's 503 reasons, counted with their numbers blanked ("limit of N")."""
    out: dict[str, int] = {}
    for d in details:
        key = re.sub(r"\d+", "N", d)
        out[key] = out.get(key, 0) + 1
    return out


def tally(calls: list[Call], slo_ms: float, straggler: str) -> dict[str, Any]:
    """What the callers got: refusals (with the gateway's reasons), defaults, answers after the
    SLO (by the gateway's own clock), and whether every flagged call named the straggler missing."""
    ok = [c for c in calls if c.status == 200]
    refused = [c for c in calls if c.status == 503]
    flagged = [c for c in ok if c.flagged and not c.body.get("default")]
    reasons = refusal_reasons(c.detail for c in refused)
    latency = np.array([float(c.body["latency_ms"]) for c in ok]) if ok else np.zeros(0)
    return {
        "calls": len(calls),
        "refused_503": len(refused),
        "refusal_reasons": reasons,
        "other_errors": len(calls) - len(ok) - len(refused),
        "answered": sum(not c.body.get("default") for c in ok),
        "defaults": sum(bool(c.body.get("default")) for c in ok),
        "over_slo": int((latency > slo_ms).sum()),
        "p50_ms": round(float(np.percentile(latency, 50)), 1) if latency.size else None,
        "p99_ms": round(float(np.percentile(latency, 99)), 1) if latency.size else None,
        "max_ms": round(float(latency.max()), 1) if latency.size else None,
        "flagged_answered": len(flagged),
        "flagged_naming_straggler": sum(straggler in c.body["models"]["missing"] for c in flagged),
        "straggler_missing": sum(straggler in c.body.get("models", {}).get("missing", []) for c in ok),
    }
