"""Requests uvicorn's HTTP parser refuses before the gateway's app runs: the caller still gets
the gateway's JSON ``{"detail": ...}`` (README: every error is JSON), over a real socket."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from starlette.requests import Request

from frontend.gateway_http import HTTPProblem, read_body
from frontend.http_protocol import stamped_protocol
from tests.unit.test_gateway_http import GOOD, make_app


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """The gateway app (fake registry and bus) under uvicorn with the gateway's own protocol."""
    yield from _serve(stamped_protocol())


@pytest.fixture(scope="module")
def strict_port() -> Iterator[int]:
    """The same with a head of at most 4 KiB, to arrive within half a second."""
    yield from _serve(stamped_protocol(max_head_bytes=4096, head_timeout_s=0.5))


def _serve(protocol: type | None) -> Iterator[int]:
    assert protocol is not None  # uvicorn[standard] brings httptools
    server = uvicorn.Server(uvicorn.Config(make_app(), host="127.0.0.1", port=0, http=protocol,
                                           lifespan="on", log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


def _raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the answer to ``request``, read until the server closes."""
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # every recv has a deadline
        s.sendall(request)
        while chunk := s.recv(4096):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def test_headers_over_the_limit_are_a_json_431_before_any_key_is_checked(strict_port: int) -> None:
    status, headers, body = _raw(strict_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                              + b"X-Pad: " + b"a" * 8000 + b"\r\n\r\n")
    assert status == 431 and headers["connection"] == "close"
    reason = "the request line and headers are over 4096 bytes"  # under both keys: the path may be unread
    assert json.loads(body) == {"detail": reason, "error": reason}
    # one header value that never ends, sent in pieces: refused once the pieces pass the limit
    data = b""
    with socket.create_connection(("127.0.0.1", strict_port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        for _ in range(10):
            try:
                s.sendall(b"a" * 1000)
            except OSError:  # closed once the server answered
                break
            time.sleep(0.01)  # separate reads at the server
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 431 "), data


def test_headers_that_never_end_are_a_json_408_and_the_connection_is_freed(strict_port: int) -> None:
    """A client dripping header lines: refused once the head has taken longer than allowed,
    though bytes keep coming (each would have reset an idle timer)."""
    started = time.monotonic()
    data = b""
    with socket.create_connection(("127.0.0.1", strict_port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        s.settimeout(0.1)
        while time.monotonic() - started < 5:
            try:
                s.sendall(b"X-Drip: 1\r\n")
                chunk = s.recv(4096)
            except socket.timeout:
                continue
            except OSError:  # closed by the server after its answer
                break
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert b"did not arrive within 0.5 s" in data and time.monotonic() - started < 3


def test_a_request_within_the_limits_is_served_and_the_next_on_the_connection_too(strict_port: int) -> None:
    """Keep-alive: the head timer runs only while a head is arriving, not while a response is
    made or the connection waits."""
    with socket.create_connection(("127.0.0.1", strict_port), timeout=10) as s:
        for _ in range(2):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = s.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            time.sleep(0.8)  # idle past the head timeout: still open


@pytest.mark.parametrize("length", [b"abc", b"-5", b"1e3"])
def test_a_content_length_that_is_no_number_is_a_json_400(port: int, length: bytes) -> None:
    status, headers, body = _raw(port, b"POST /v1/apps/pets/predict HTTP/1.1\r\nHost: x\r\n"
                                       b"Content-Length: " + length + b"\r\n\r\n")
    assert status == 400, body
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    detail = json.loads(body)["detail"]
    assert "Content-Length" in detail and "HTTP" in detail, detail
    # the connection was closed (the read above ended), and the next caller is served
    r = httpx.post(f"http://127.0.0.1:{port}/v1/apps/pets/predict", json={"input": GOOD}, timeout=10)
    assert r.status_code == 200 and r.json()["output"] == "dog"


@pytest.mark.parametrize("request_bytes", [
    b"NOT HTTP\r\n\r\n",
    b"POST /v1/apps/pets/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
    b"POST /v1/apps/pets/predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_other_requests_the_parser_refuses_are_json_400s_too(port: int, request_bytes: bytes) -> None:
    status, headers, body = _raw(port, request_bytes)
    assert (status, headers["content-type"]) == (400, "application/json"), body
    assert json.loads(body)["detail"].startswith("the request is not valid HTTP/1.1")


def test_openapi_lists_the_400_for_predict_and_feedback(port: int) -> None:
    paths = httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=10).json()["paths"]
    for route in ("predict", "feedback"):
        assert "400" in paths[f"/v1/apps/{{app}}/{route}"]["post"]["responses"], route


def test_without_httptools_the_gateway_falls_back_to_uvicorns_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gateway_cli`` passes ``stamped_protocol() or "auto"``: uvicorn then picks h11, which
    answers an unparsable request 400 in plain text (not the gateway's JSON)."""
    monkeypatch.setitem(sys.modules, "httptools", None)  # import httptools -> ImportError
    assert stamped_protocol() is None


def test_a_body_cut_short_is_a_400_not_an_exception_in_the_app() -> None:
    """uvicorn reports a body the parser refused half-way (or a caller gone) as a disconnect."""
    async def receive() -> dict:
        return {"type": "http.disconnect"}

    with pytest.raises(HTTPProblem) as info:
        asyncio.run(read_body(Request({"type": "http", "headers": []}, receive), 100, 1.0))
    assert info.value.status == 400
