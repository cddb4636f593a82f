"""Warming the pipeline up before `clipstream up` says ready.

Ready must mean that the first callers are answered by the models at their usual speed, not
that the processes exist. Two things are cold at first: a fresh client's first record to a
partition waits for metadata and connections, which a few single queries per app fix; and a
fresh broker runs interpreted until its JIT has compiled the request paths, which takes some
seconds of real traffic (docs/design/0012). So after the first answers come a few seconds of
steady traffic: a few closed-loop callers at each app's own SLO, so the warm-up never floods
the pipeline or trips the gateway's admission control.

Warm-up queries use random inputs, so no cache entry is left for a caller, and no feedback is
sent for them, so no policy learns from them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from registry.outputs import app_input
from schemas.reasons import MODELS_FAILED
from registry.topic import RegistryView
from schemas.tensor import VARIABLE

Report = Callable[[str], None]


@dataclass
class Target:
    """One app to warm: its name, one example's shape and dtype, its SLO."""

    app: str
    shape: tuple[int, ...]
    dtype: str
    slo_ms: float


@dataclass
class WarmStats:
    """What the steady phase saw: answers, defaults, refusals and the latencies answered."""

    defaults: int = 0
    refused: int = 0
    latencies_ms: list[float] = field(default_factory=list)  # one per answer
    reasons: Counter[str] = field(default_factory=Counter)  # the defaults' reasons

    @property
    def answered(self) -> int:
        return len(self.latencies_ms)

    def add(self, status: int, body: dict[str, Any]) -> None:
        if status != 200:
            self.refused += 1
            return
        if body.get("default"):
            self.defaults += 1
            self.reasons[str(body.get("default_reason") or "no reason given")] += 1
        self.latencies_ms.append(float(body.get("latency_ms", 0.0)))

    def worry(self, share: float = 0.1) -> str | None:
        """A warning when more than ``share`` of the answers were the default: the callers
        after ``ready`` would get it as often, so ``up`` says why before it says ready."""
        if not self.answered or self.defaults <= share * self.answered:
            return None
        reason, _ = self.reasons.most_common(1)[0]
        return (f"warning: {self.defaults} of {self.answered} warm-up answers were the app's default (most often: "
                f"{reason[:240]}): callers will get it as often until that is mended")

    def p50_ms(self, since: int = 0) -> float:
        """The median latency of the answers from the ``since``-th on (the pipeline warms up
        as it goes, so the recent ones say how warm it is now)."""
        recent = self.latencies_ms[since:]
        return float(np.median(recent)) if recent else float("nan")

    def line(self, since: int = 0, recent: str = "") -> str:
        p50 = f"p50 {self.p50_ms(since):.1f} ms" + (f" over the last {recent}" if recent else "")
        return f"{self.answered} answered, {p50}, {self.defaults} defaults, {self.refused} refused"


def targets_of(view: RegistryView) -> list[Target]:
    """The apps that have a model with a declared input (the others cannot be sent a query)."""
    out = []
    for app in view.apps.values():
        spec = app_input(view, app.models)
        if spec is None:
            continue
        out.append(Target(app.name, tuple(spec.shape), spec.dtype, float(app.slo_ms or 2000.0)))
    return out


def _body(rng: np.random.Generator, target: Target, slo_ms: float) -> dict[str, Any]:
    x = rng.uniform(0, 1, size=target.shape).astype(target.dtype)
    return {"input": x.tolist(), "slo_ms": slo_ms}


def _post(http: Any, target: Target, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Status and JSON of one predict call; a transport error reads as status 0 (refused): the
    warm-up goes on, and ``up`` reports an app that never answers."""
    import httpx

    try:
        r = http.post(f"/v1/apps/{target.app}/predict", json=body)
    except httpx.HTTPError:
        return 0, {}
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, {}


def first_answers(http: Any, target: Target, rounds: int, timeout_s: float) -> str | None:
    """Single queries with a generous SLO until ``rounds`` in a row are answered by every model;
    None when they were, else why not. A query the gateway refuses as the caller's fault (a
    4xx but 429: the app's inputs are over its body limit, say) is not tried again: waiting
    would not change it, and the model is not to blame."""
    rng = np.random.default_rng()
    good = failed = 0
    last = ""
    deadline = time.monotonic() + timeout_s
    while good < rounds and time.monotonic() < deadline:
        status, answer = _post(http, target, _body(rng, target, 2000.0))
        if 400 <= status < 500 and status != 429:
            return f"the gateway refused its query ({status}: {answer.get('detail', 'no reason given')})"
        if status == 200 and answer.get("models", {}).get("missing") == []:
            good += 1
            continue
        good = 0
        missing = ", ".join(answer.get("models", {}).get("missing") or ()) if status == 200 else ""
        last = str(answer.get("default_reason") or (missing and f"models missing from the answer: {missing}")
                   or answer.get("detail") or f"HTTP {status}")
        # every model answered with an error: it is loaded and fails, and waiting will not mend it
        failed = failed + 1 if last.startswith(MODELS_FAILED) else 0
        if failed >= rounds:
            return f"its answers are the default: {last[:300]}"
        time.sleep(RETRY_PAUSE_S)  # a model still loading: ask again soon, not in a tight loop
    if good >= rounds:
        return None
    return f"it did not answer in {timeout_s:.0f}s" + (f" (the last answer: {last[:300]})" if last else "")


# between first queries that got no prediction: a model still loading is not asked in a tight loop
RETRY_PAUSE_S = 0.05


def steady_load(http: Any, targets: list[Target], seconds: float, callers: int = 4,
                report: Report | None = None, every_s: float = 5.0) -> WarmStats:
    """``callers`` closed-loop callers for ``seconds``, round robin over the apps, each query at
    its app's SLO; progress every ``every_s``. Closed loop: at most ``callers`` in flight."""
    stats = WarmStats()
    lock = threading.Lock()
    start = time.monotonic()
    end = start + seconds
    order = itertools.cycle(targets)

    def caller() -> None:
        # fresh entropy, never a fixed seed: a seeded warm-up would fill the cache with the
        # very inputs a seeded client sends next, and answer them from it
        rng = np.random.default_rng()
        while time.monotonic() < end:
            with lock:
                target = next(order)
            status, body = _post(http, target, _body(rng, target, min(2000.0, target.slo_ms)))
            with lock:
                stats.add(status, body)

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(callers)]
    for t in threads:
        t.start()
    mark = 0  # the answers since the last report give its p50
    while alive := [t for t in threads if t.is_alive()]:
        alive[0].join(timeout=every_s)
        now = time.monotonic()
        if report is not None and now < end:
            with lock:
                line = stats.line(mark, f"{every_s:g} s")
                report(f"warming up: {now - start:.0f} of {seconds:.0f} s, {line}")
                mark = len(stats.latencies_ms)
    return stats


def warm_up(url: str, view: RegistryView, env: dict[str, str], report: Report = print,
            seconds: float = 20.0, callers: int = 4, timeout_s: float = 60.0,
            rounds: int = 5) -> None:
    """First answers from every app, then ``seconds`` of steady traffic over all of them."""
    import httpx

    keys = [k for k in env.get("CLIPSTREAM_GATEWAY_API_KEYS", "").split(",") if k]
    headers = {"X-API-Key": keys[0]} if keys else {}
    targets = targets_of(view)
    limits = httpx.Limits(max_connections=max(16, callers))
    # over HTTPS the warm-up calls its own gateway on loopback, whose certificate names the
    # host callers use, not 127.0.0.1: it is not checked
    with httpx.Client(base_url=url, timeout=10.0, headers=headers, limits=limits,
                      verify=not url.startswith("https://")) as http:
        answering = []
        for target in targets:
            if target.dtype in VARIABLE:  # made-up text or bytes could be any model's bad input
                report(f"note: {target.app} takes {target.dtype} inputs, which up cannot make up: not warmed up")
                continue
            why = first_answers(http, target, rounds, timeout_s)
            if why is None:
                answering.append(target)
            else:
                report(f"warning: {target.app} is not warmed up: {why}")
        if answering and seconds > 0:
            stats = steady_load(http, answering, seconds, callers, report)
            last = len(stats.latencies_ms) * 3 // 4  # p50 of the last quarter: how warm now
            report(f"warmed up {', '.join(t.app for t in answering)} in {seconds:.0f} s: "
                   f"{stats.line(last, f'{seconds / 4:g} s')}")
            if (worry := stats.worry()) is not None:
                report(worry)
        elif answering:
            report(f"warmed up {', '.join(t.app for t in answering)}")
