"""The gateway load generator's HTTP client: keep-alive answers parsed whole, and each answer
stamped with when it reached the socket (the kernel's stamp), not when the generator's loop
read it. A plain socket server in a thread plays the gateway."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from bench.load import now_us
from bench.load_http import RawHTTP


class SplitServer:
    """Answers each request on one connection with its header, then (after ``gap_s``) its body;
    records when the body was written and signals it."""

    def __init__(self, gap_s: float = 0.0) -> None:
        self.gap_s = gap_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.body_sent_us: list[int] = []
        self.sent = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
            n = 0
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(rest) < length:
                    rest += conn.recv(65536)
                buf = rest[length:]
                n += 1
                body = b'{"n": %d}' % n
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(body))
                time.sleep(self.gap_s)
                self.body_sent_us.append(now_us())
                conn.sendall(body)
                self.sent.set()


@pytest.fixture
def server() -> Iterator[SplitServer]:
    s = SplitServer(gap_s=0.02)
    yield s
    s.listener.close()


def test_answers_split_across_segments_are_read_whole_on_one_kept_alive_connection(server: SplitServer) -> None:
    async def go() -> list[tuple[int, bytes, int]]:
        client = RawHTTP(server.url, max_connections=1, timeout_s=5)
        try:
            return [await client.post("/v1/apps/a/predict", b'{"input": [1]}') for _ in range(3)]
        finally:
            await client.aclose()

    answers = asyncio.run(go())
    assert [(status, body) for status, body, _ in answers] == [(200, b'{"n": %d}' % n) for n in (1, 2, 3)]
    # each answer is stamped when its last segment (the body, 20 ms after the header) arrived
    for (_, _, arrived), sent in zip(answers, server.body_sent_us, strict=True):
        assert sent <= arrived + 1000  # the kernel's clock against the server's, both wall time
        assert arrived - sent < 20_000


def test_the_arrival_stamp_leaves_out_the_generators_own_delay_in_reading() -> None:
    server = SplitServer()
    try:
        async def go() -> tuple[int, int]:
            client = RawHTTP(server.url, max_connections=1, timeout_s=5)
            await client.warm(1)
            post = asyncio.ensure_future(client.post("/v1/apps/a/predict", b"{}"))
            await asyncio.sleep(0)  # the request goes out
            # the generator's loop is held up (as a descheduled process would be) from before the
            # answer arrives until 80 ms after: nothing can read it meanwhile
            assert server.sent.wait(5), "the server never answered"
            time.sleep(0.08)
            _, _, arrived = await post
            read = now_us()
            await client.aclose()
            return arrived, read

        arrived, read = asyncio.run(go())
        assert abs(arrived - server.body_sent_us[0]) < 20_000
        assert read - arrived >= 80_000
    finally:
        server.listener.close()


def test_a_chunked_body_is_read_whole_only_once_its_last_chunk_is_in() -> None:
    from bench.load_http import dechunk

    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    wire = head + b"5\r\n{\"a\":\r\n3;x=1\r\n 1}\r\n0\r\n\r\nHTTP/1.1 200 OK"
    body, end = dechunk(wire, len(head))
    assert body == b'{"a": 1}' and wire[end:] == b"HTTP/1.1 200 OK"
    for cut in (len(head) + 3, len(head) + 12, len(wire) - 17):
        assert dechunk(wire[:cut], len(head)) is None
