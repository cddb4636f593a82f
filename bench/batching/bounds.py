"""What an ideal batcher could do: a zero-overhead, single-device simulation (pure, no I/O).

The real benchmark measures the layer on a real broker; these bounds say what the figures it
is compared with allow at all, whatever the layer. Two questions the issue's figures raise:

* *Keeping the device busy within a 20 ms end-to-end deadline.* A request's deadline covers
  its wait and its batch's service, so a batch that fills 20 ms of device time can only hold
  requests that waited for nothing. Even with no Kafka hop, no scheduling cost and perfect
  knowledge of the device's latency curve, how much of the device's best throughput (the best
  batch size whose *service* fits 20 ms, Clipper's definition of the optimal batch size) can
  such a batcher turn into answers made within the deadline?
* *Delayed batching when the next batch is formed as the device frees.* Nagle's argument needs
  a batch to leave before the device can take it; when it leaves only as the device frees,
  a delay can only idle the device. How much does a delay gain an ideal batcher of that kind?

Two policies, both earliest deadline first, both dropping what can no longer make its deadline:

* ``greedy``: as soon as the device is free, the largest batch (up to ``cap``) that still
  answers the oldest queued request in time;
* ``efficient``: the batch size with the best throughput (b / latency(b)) among those that
  enough queued requests could still make, serving those requests and dropping the older
  ones: under overload it gives up on the oldest to keep batches large.

Times are in milliseconds. Unit-tested in tests/unit/test_bench_batching_bounds.py.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from typing import Any

POLICIES = ("greedy", "efficient")


def poisson_arrivals(rate_qps: float, duration_s: float, seed: int = 1,
                     period_s: float = 0.0, duty: float = 1.0) -> list[float]:
    """Arrival times (ms) of a Poisson stream at ``rate_qps`` on average; with ``period_s`` and
    ``duty`` < 1 an on/off wave (the bench's bursty load): ``rate / duty`` during the first
    ``duty`` of every period, nothing in the rest."""
    rng = random.Random(seed)
    bursty = period_s > 0 and duty < 1.0
    on_rate = rate_qps / duty if bursty else rate_qps
    period_ms, on_ms = period_s * 1000.0, duty * period_s * 1000.0
    out: list[float] = []
    t, end = 0.0, duration_s * 1000.0
    while True:
        t += rng.expovariate(on_rate / 1000.0)
        if bursty:  # time runs only while the wave is on: map "on" time onto wall time
            cycles, within = divmod(t, on_ms)
            wall = cycles * period_ms + within
        else:
            wall = t
        if wall >= end:
            return out
        out.append(wall)


def serve(arrivals_ms: Sequence[float], latency_ms: Callable[[int], float], slo_ms: float, *,
          cap: int, policy: str = "greedy", delay_ms: float = 0.0) -> dict[str, Any]:
    """Serve sorted arrivals on one device; every request's deadline is its arrival + ``slo_ms``.

    With ``delay_ms``, a device that frees with fewer than ``cap`` requests queued waits until
    the oldest has waited ``delay_ms`` (or ``cap`` are queued) before forming the batch.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {POLICIES}")
    if cap < 1:
        raise ValueError("cap must be at least 1")
    arr = list(arrivals_ms)
    n, i = len(arr), 0
    queue: list[float] = []  # arrival times, sorted; the deadline is arrival + slo
    now = good = batches = 0.0
    busy = 0.0
    while i < n or queue:
        if not queue:
            now = max(now, arr[i])
        while i < n and arr[i] <= now:
            queue.append(arr[i])
            i += 1
        if delay_ms > 0 and len(queue) < cap:  # delayed batching: let more come
            until = queue[0] + delay_ms
            if i + (cap - len(queue)) - 1 < n:
                until = min(until, arr[i + (cap - len(queue)) - 1])
            if until > now:
                now = until
                while i < n and arr[i] <= now:
                    queue.append(arr[i])
                    i += 1
        # what cannot make its deadline even alone is dropped
        first = bisect.bisect_left(queue, now + latency_ms(1) - slo_ms)
        del queue[:first]
        if not queue:
            continue
        if policy == "greedy":
            size = 1
            while size < min(cap, len(queue)) and now + latency_ms(size + 1) <= queue[0] + slo_ms:
                size += 1
        else:
            size, best = 1, 0.0
            for b in range(1, min(cap, len(queue)) + 1):
                able = len(queue) - bisect.bisect_left(queue, now + latency_ms(b) - slo_ms)
                if able >= b and b / latency_ms(b) > best:
                    size, best = b, b / latency_ms(b)
            del queue[:bisect.bisect_left(queue, now + latency_ms(size) - slo_ms)]  # too old for this batch: given up
        del queue[:size]  # the batch: the oldest of what is left
        service = latency_ms(size)
        good += size
        batches += 1
        busy += service
        now += service
    span_s = (arr[-1] if arr else 0.0) / 1000.0 or 1.0
    return {"goodput_qps": good / span_s, "answered": int(good), "offered": n,
            "mean_batch": good / batches if batches else 0.0, "device_busy": busy / (now or 1.0)}


def end_to_end_bound(latency_ms: Callable[[int], float], device_qps: float, slo_ms: float, cap: int,
                     loads: Sequence[float] = (0.75, 1.0, 1.3, 1.6, 2.0), duration_s: float = 20.0,
                     seed: int = 1) -> dict[str, Any]:
    """Goodput within ``slo_ms`` end to end of an ideal batcher, as a fraction of ``device_qps``,
    at each offered load (a multiple of ``device_qps``), for both policies."""
    out: dict[str, Any] = {"slo_ms": slo_ms, "device_qps": device_qps, "cap": cap, "by_load": {}}
    for load in loads:
        arr = poisson_arrivals(load * device_qps, duration_s, seed)
        out["by_load"][f"{load:g}x"] = {p: serve(arr, latency_ms, slo_ms, cap=cap, policy=p)["goodput_qps"] / device_qps
                                        for p in POLICIES}
    out["best"] = {p: max(v[p] for v in out["by_load"].values()) for p in POLICIES}
    return out


def delay_gain(latency_ms: Callable[[int], float], slo_ms: float, cap: int, rate_qps: float, delays_ms: Sequence[float],
               period_s: float = 0.0, duty: float = 1.0, duration_s: float = 20.0, seed: int = 1) -> dict[str, Any]:
    """Goodput of the ideal greedy batcher (next batch formed as the device frees) with each
    delay, and its ratio to no delay, on the same arrivals."""
    arr = poisson_arrivals(rate_qps, duration_s, seed, period_s, duty)
    runs = {f"{d:g} ms": serve(arr, latency_ms, slo_ms, cap=cap, delay_ms=d) for d in [0.0, *delays_ms]}
    base = runs["0 ms"]["goodput_qps"]
    return {"rate_qps": rate_qps, "runs": runs,
            "ratios": {k: v["goodput_qps"] / base if base else None for k, v in runs.items() if k != "0 ms"}}
