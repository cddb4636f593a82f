"""The load generator's way in through the REST gateway: open-loop posts over keep-alive
connections, each query's outcome recorded as in ``bench.load``."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import struct
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from bench.load import Outcome, Progress, RunResult, now_us, ticker, without_gc_pauses


# SO_TIMESTAMPNS (asm-generic/socket.h): the kernel stamps each received segment; Python names
# the option only on some builds, and Linux has had the number since 2.6.22. Elsewhere no
# stamp: the arrival is then unknown (0), and only the read time is reported
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)


def dechunk(buf: bytes | bytearray, start: int) -> tuple[bytes, int] | None:
    """The body of a chunked response whose chunks begin at ``start`` and the offset just past
    its last chunk; None while the last chunk has not arrived (Ray Serve's proxy chunks)."""
    parts, pos = [], start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        if size == 0:
            trailer = buf.find(b"\r\n\r\n", eol)
            return (b"".join(parts), trailer + 4) if trailer >= 0 else None
        if len(buf) < eol + 2 + size + 2:
            return None
        parts.append(bytes(buf[eol + 2:eol + 2 + size]))
        pos = eol + 2 + size + 2


class _Conn:
    """One keep-alive connection of ``RawHTTP``: its socket, what it has read so far, the
    response it awaits, and the kernel's arrival time of the last bytes read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes, int]] | None = None
        self.arrived_us = 0
        self.closed = False


class RawHTTP:
    """A minimal HTTP/1.1 keep-alive client on non-blocking sockets: a pool of connections, one
    request at a time each. It costs a small fraction of httpx's CPU per request, which is what
    lets a 2-core box offer more load than the gateway serves. ``post`` -> (status, body,
    arrived_us).

    ``arrived_us`` is when the answer's last bytes reached this process's socket, as the kernel
    stamped them (SO_TIMESTAMPNS), not when the generator's event loop got round to reading
    them: on a shared 2-core machine the generator is itself descheduled for tens of ms at a
    time, and that delay is the instrument's, not the system's (0 when no stamp came).
    """

    def __init__(self, url: str, max_connections: int, timeout_s: float) -> None:
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.max, self.timeout_s = max_connections, timeout_s
        self.idle: list[_Conn] = []
        self.open = 0
        self.freed = asyncio.Event()

    async def warm(self, n: int) -> None:
        """Open ``n`` connections before the run: a population of callers keeps its connections,
        and opening them all at the first burst costs both sides a CPU spike that is not the
        steady state being measured (the httpx client is warmed the same way)."""
        n = min(n, self.max - self.open)
        self.open += n
        opened = await asyncio.gather(*(self._connect() for _ in range(n)), return_exceptions=True)
        for conn in opened:
            if isinstance(conn, BaseException):
                self.open -= 1
            else:
                self.idle.append(conn)

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (self.host, self.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if SO_TIMESTAMPNS is not None:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except BaseException:
            sock.close()
            raise
        conn = _Conn(sock)
        loop.add_reader(sock.fileno(), self._readable, conn)
        return conn

    def _readable(self, conn: _Conn) -> None:
        try:
            data, ancillary, _, _ = conn.sock.recvmsg(65536, socket.CMSG_SPACE(16))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(conn, exc)
            return
        if not data:
            self._close(conn, ConnectionResetError("the gateway closed the connection"))
            return
        for level, kind, stamp in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(stamp) >= 16:
                sec, nsec = struct.unpack("qq", stamp[:16])
                conn.arrived_us = sec * 1_000_000 + nsec // 1000
        conn.buf += data
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(conn.buf[:end])
        length, chunked = 0, False
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
            elif line.lower().replace(b" ", b"") == b"transfer-encoding:chunked":
                chunked = True
        if chunked:
            framed = dechunk(conn.buf, end + 4)
            if framed is None:
                return
            body, length = framed[0], framed[1] - end - 4
        elif len(conn.buf) < end + 4 + length:
            return
        else:
            body = bytes(conn.buf[end + 4:end + 4 + length])
        del conn.buf[:end + 4 + length]
        if conn.waiter is not None and not conn.waiter.done():
            conn.waiter.set_result((int(head[9:12]), body, conn.arrived_us))

    def _close(self, conn: _Conn, exc: BaseException | None = None) -> None:
        if conn.closed:
            return
        conn.closed = True
        try:
            asyncio.get_running_loop().remove_reader(conn.sock.fileno())
        except (RuntimeError, ValueError):
            pass
        conn.sock.close()
        if conn.waiter is not None and not conn.waiter.done():
            conn.waiter.set_exception(exc or ConnectionResetError("closed"))

    async def _conn(self) -> _Conn:
        while True:
            if self.idle:
                conn = self.idle.pop()
                if conn.closed:  # the server closed it while it sat idle
                    self.open -= 1
                    continue
                return conn
            if self.open < self.max:
                self.open += 1
                try:
                    return await self._connect()
                except Exception:
                    self.open -= 1
                    raise
            self.freed.clear()
            await self.freed.wait()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes, int]:
        conn = await self._conn()
        loop = asyncio.get_running_loop()
        ok = False
        try:
            conn.waiter = loop.create_future()
            await loop.sock_sendall(conn.sock, b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: %d\r\n\r\n%s"
                                    % (path.encode(), self.host.encode(), len(body), body))
            answer = await asyncio.wait_for(conn.waiter, self.timeout_s)
            ok = True
            return answer
        finally:
            conn.waiter = None
            if ok and not conn.closed:
                self.idle.append(conn)
            else:
                self.open -= 1
                self._close(conn)
            self.freed.set()

    async def aclose(self) -> None:
        for conn in self.idle:
            self._close(conn)
        self.idle.clear()


@without_gc_pauses
def run_gateway(url: str, app: str, bodies: Sequence[bytes], times: np.ndarray, *, max_connections: int = 256,
                timeout_s: float = 10.0, progress: Progress | None = None, client: str = "raw",
                path: str | None = None) -> RunResult:
    """Post ``bodies[i % len]`` at ``times[i]`` (seconds from now) to the app's predict route.

    ``client``: ``raw`` (``RawHTTP``, cheap) or ``httpx`` (httpx.AsyncClient). ``path``: another
    route than the gateway's (another server under the same load, ``bench.cost``)."""
    return asyncio.run(_gateway(url, path or f"/v1/apps/{app}/predict", bodies, times, max_connections, timeout_s,
                                progress, client))


async def _gateway(url: str, path: str, bodies: Sequence[bytes], times: np.ndarray, max_connections: int,
                   timeout_s: float, progress: Progress | None, kind: str) -> RunResult:
    import httpx

    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    headers = {"content-type": "application/json"}
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
                    status, content, r.arrived_us = await raw.post(path, bodies[i % len(bodies)])
                else:
                    resp = await client.post(path, content=bodies[i % len(bodies)], headers=headers)
                    status, content = resp.status_code, resp.content
                r.recv_us = now_us()
                _read_answer(r, status, content)
            except Exception:  # timeouts, refused connections: an error, keep going
                r.recv_us = now_us()
                r.outcome = "error"
            answered[0] += 1

        stop = threading.Event()
        ticker("gateway", len(times), lambda: answered[0], progress, stop)
        cpu0, wall0 = time.process_time(), time.monotonic()
        start_us = await send_on_schedule(times, results, one, timeout_s)
        stop.set()
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        if raw is not None:
            await raw.aclose()
    duration = float(times[-1]) if len(times) else 0.0
    return RunResult(results, start_us, duration, wall, cpu)


def _read_answer(r: Outcome, status: int, content: bytes) -> None:
    """Fill ``r`` from the gateway's answer: its outcome, and the body's fields the reports read."""
    r.status = status
    if status in (200, 202):  # 202: a feedback taken
        body = json.loads(content)
        if "outputs" in body:  # an Open Inference Protocol answer: its default output says
            body["default"] = any(any(o["data"]) for o in body["outputs"] if o.get("name") == "default")
        r.outcome = "default" if body.get("default") else "answered"
        r.query_id = body.get("query_id", "")
        r.output = body.get("output")
        r.server_ms = float(body.get("latency_ms", math.nan))
    else:
        r.outcome = "error"
        r.detail = content[:200].decode("utf-8", "replace")


async def send_on_schedule(times: np.ndarray, results: list[Outcome],
                            one: Callable[[int], Awaitable[None]], timeout_s: float) -> int:
    """Start ``one(i)`` at each ``times[i]`` (open loop: never waiting for an answer), then wait
    for the answers; the schedule's start, in µs."""
    loop = asyncio.get_running_loop()
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
    return start_us
