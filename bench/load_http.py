"""The load generator's way in through the REST gateway: open-loop posts over keep-alive
connections, each query's outcome recorded as in ``bench.load``."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Sequence

import numpy as np

from bench.load import Outcome, Progress, RunResult, now_us, ticker, without_gc_pauses


class RawHTTP:
    """A minimal HTTP/1.1 keep-alive client on asyncio streams: a pool of connections, one
    request at a time each. It costs a small fraction of httpx's CPU per request, which is what
    lets a 2-core box offer more load than the gateway serves. ``post`` -> (status, body)."""

    def __init__(self, url: str, max_connections: int, timeout_s: float) -> None:
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.max, self.timeout_s = max_connections, timeout_s
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.open = 0
        self.freed = asyncio.Event()

    async def warm(self, n: int) -> None:
        """Open ``n`` connections before the run: a population of callers keeps its connections,
        and opening them all at the first burst costs both sides a CPU spike that is not the
        steady state being measured (the httpx client is warmed the same way)."""
        n = min(n, self.max - self.open)
        self.open += n
        opened = await asyncio.gather(*(asyncio.open_connection(self.host, self.port) for _ in range(n)),
                                      return_exceptions=True)
        for conn in opened:
            if isinstance(conn, BaseException):
                self.open -= 1
            else:
                self.idle.append(conn)

    async def _conn(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while True:
            if self.idle:
                reader, writer = self.idle.pop()
                if reader.at_eof():  # the server closed it while it sat idle
                    self.open -= 1
                    writer.close()
                    continue
                return reader, writer
            if self.open < self.max:
                self.open += 1
                try:
                    return await asyncio.open_connection(self.host, self.port)
                except Exception:
                    self.open -= 1
                    raise
            self.freed.clear()
            await self.freed.wait()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        reader, writer = await self._conn()
        ok = False
        try:
            writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (path.encode(), self.host.encode(), len(body), body))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            data = await reader.readexactly(length) if length else b""
            ok = True
            return status, data
        finally:
            if ok:
                self.idle.append((reader, writer))
            else:
                self.open -= 1
                writer.close()
            self.freed.set()

    async def aclose(self) -> None:
        for _, w in self.idle:
            w.close()
        self.idle.clear()


@without_gc_pauses
def run_gateway(url: str, app: str, bodies: Sequence[bytes], times: np.ndarray, *, max_connections: int = 256,
                timeout_s: float = 10.0, progress: Progress | None = None, client: str = "raw") -> RunResult:
    """Post ``bodies[i % len]`` at ``times[i]`` (seconds from now) to the app's predict route.

    ``client``: ``raw`` (``RawHTTP``, cheap) or ``httpx`` (httpx.AsyncClient)."""
    return asyncio.run(_gateway(url, app, bodies, times, max_connections, timeout_s, progress, client))


async def _gateway(url: str, app: str, bodies: Sequence[bytes], times: np.ndarray, max_connections: int,
                   timeout_s: float, progress: Progress | None, kind: str) -> RunResult:
    import httpx

    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    path = f"/v1/apps/{app}/predict"
    headers = {"content-type": "application/json"}
    loop = asyncio.get_running_loop()
    results = [Outcome(i, 0) for i in range(len(times))]
    answered = [0]
    raw = RawHTTP(url, max_connections, timeout_s) if kind == "raw" else None
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s) as client:
        # open the connections first: connection set-up is not the system's latency
        if raw is not None:
            await raw.warm(min(max_connections, 128))
        else:
            await asyncio.gather(*(client.get("/healthz") for _ in range(min(max_connections, 64))),
                                 return_exceptions=True)

        async def one(i: int) -> None:
            r = results[i]
            r.sent_us = now_us()
            try:
                if raw is not None:
                    status, content = await raw.post(path, bodies[i % len(bodies)])
                else:
                    resp = await client.post(path, content=bodies[i % len(bodies)], headers=headers)
                    status, content = resp.status_code, resp.content
                r.recv_us, r.status = now_us(), status
                if status == 200:
                    body = json.loads(content)
                    r.outcome = "default" if body.get("default") else "answered"
                    r.query_id = body.get("query_id", "")
                    r.output = body.get("output")
                    r.server_ms = float(body.get("latency_ms", math.nan))
                else:
                    r.outcome = "error"
            except Exception:  # timeouts, refused connections: an error, keep going
                r.recv_us = now_us()
                r.outcome = "error"
            answered[0] += 1

        stop = threading.Event()
        ticker("gateway", len(times), lambda: answered[0], progress, stop)
        cpu0, wall0 = time.process_time(), time.monotonic()
        start_us = now_us() + 20_000
        t0 = loop.time() + 0.02
        tasks: set[asyncio.Task[None]] = set()
        for i, t in enumerate(times):
            delay = t0 + t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            results[i].sched_us = start_us + int(t * 1e6)
            task = asyncio.create_task(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s + 5)
        stop.set()
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        if raw is not None:
            await raw.aclose()
    duration = float(times[-1]) if len(times) else 0.0
    return RunResult(results, start_us, duration, wall, cpu)
