"""The gateway's HTTP/1.1 protocol: uvicorn's httptools protocol, with what the gateway needs
before any route runs (the parse time stamp, bounded heads, JSON answers to what it refuses)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable

from clipstream.clock import now_us
from clipstream.errors import ClipstreamError

# scope key: when the server began parsing the request (epoch us), set by ``stamped_protocol``
RECEIVED_US = "clipstream.received_us"


def stamped_protocol(max_head_bytes: int = 32 * 1024, head_timeout_s: float = 10.0) -> type | None:
    """uvicorn's httptools protocol, stamping each request's scope when its parsing begins.

    Under load a request can wait in the event loop for milliseconds between its bytes
    arriving and its handler starting; the caller's clock runs all along, so the deadline
    (and the wait for the reply) counts from the stamp, not from the handler. None when
    httptools is missing: the handler's own start is used then (and uvicorn's h11 protocol
    answers a request it cannot parse in plain text).

    A request the parser refuses (``Content-Length: abc``, no HTTP at all) never reaches the
    app; uvicorn answers it 400 in plain text, and this protocol in the gateway's JSON
    (``parse_error_response``), still closing the connection. So does a request whose line and
    headers pass ``max_head_bytes`` (431), or take longer than ``head_timeout_s`` from their
    first byte (408): a client that never ends its headers would otherwise hold memory, or a
    connection, for as long as it likes, before any route or API key is looked at.
    """
    try:
        from httptools import HttpParserCallbackError, HttpParserInvalidURLError
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class StampedHttpToolsProtocol(HttpToolsProtocol):
        head_bytes = 0  # received while a head is read (its body too, in its last read); -1 between heads
        head_size = 0  # of the head being read, as the parser hands it over
        head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._time_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._untime_head()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.head_bytes >= 0:
                self.head_bytes += len(data)
            super().data_received(data)
            # judged once the parser has read the chunk: a head it completed is within bounds
            # whatever body bytes came with it (-1 then). Only a head left incomplete is timed,
            # so a request whose head comes in one read, the usual case, arms no timer
            if self.head_bytes > max_head_bytes and not self.transport.is_closing():
                self._refuse(431, "Request Header Fields Too Large",
                             f"the request line and headers are over {max_head_bytes} bytes")
            elif self.head_bytes > 0 and self.head_timer is None and not self.transport.is_closing():
                self._time_head()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[RECEIVED_US] = now_us()  # type: ignore[literal-required]
            self.head_size = 0

        # a head that arrives whole in one read is measured as the parser hands it over
        def on_url(self, url: bytes) -> None:
            self._measure(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._measure(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _measure(self, size: int) -> None:
            self.head_size += size
            if self.head_size > max_head_bytes:
                raise _HeadTooLarge  # the parser stops; ``send_400_response`` answers 431

        def on_headers_complete(self) -> None:
            self.head_bytes = -1
            self._untime_head()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self.head_bytes = 0  # what comes next is the next request's head

        def _time_head(self) -> None:
            self._untime_head()
            self.head_timer = self.loop.call_later(head_timeout_s, self._head_too_slow)

        def _untime_head(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_too_slow(self) -> None:
            self.head_timer = None
            if self.head_bytes >= 0 and not self.transport.is_closing():
                self._refuse(408, "Request Timeout", f"the request line and headers did not arrive within "
                                                     f"{head_timeout_s:g} s")

        def _refuse(self, status: int, phrase: str, detail: str) -> None:
            self._untime_head()
            self.head_bytes = -1
            self.transport.write(error_response(status, phrase, detail, self.server_state.default_headers))
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            # uvicorn calls this while it handles the parser's error, which names the fault
            error = sys.exception()
            if isinstance(error, HttpParserCallbackError) and isinstance(error.__context__, _HeadTooLarge):
                self._refuse(431, "Request Header Fields Too Large",
                             f"the request line and headers are over {max_head_bytes} bytes")
                return
            reason = str(error or "")
            if isinstance(error, HttpParserCallbackError):  # a callback of uvicorn's refused what it read
                reason = "the URL is not valid" if isinstance(error.__context__, HttpParserInvalidURLError) else ""
            self.transport.write(parse_error_response(reason, self.server_state.default_headers))
            self.transport.close()

    return StampedHttpToolsProtocol


class _HeadTooLarge(ClipstreamError):
    """Raised in a parser callback to stop reading a request whose head is over the limit."""


# the parser's reasons that a caller may not read at once, said plainly
_PARSE_REASONS = {"Invalid character in Content-Length": "Content-Length must be a whole number of bytes"}


def parse_error_response(reason: str, default_headers: Iterable[tuple[bytes, bytes]] = ()) -> bytes:
    """The raw 400 for a request the HTTP parser refused, for ``reason`` (the parser's words;
    empty when it gave none)."""
    reason = reason.strip()
    detail = "the request is not valid HTTP/1.1" + (f": {_PARSE_REASONS.get(reason, reason)}" if reason else "")
    return error_response(400, "Bad Request", detail, default_headers)


def error_response(status: int, phrase: str, detail: str, default_headers: Iterable[tuple[bytes, bytes]] = ()) -> bytes:
    """A raw answer to a request no route saw: the gateway's JSON ``{"detail": ...}``, with the
    reason under ``error`` too, which the Open Inference Protocol's clients read (the path may
    not have been read), and ``connection: close``, after the server's own headers (date, server)."""
    body = json.dumps({"detail": detail, "error": detail}, separators=(",", ":")).encode()
    head = [f"HTTP/1.1 {status} {phrase}".encode(), *(name + b": " + value for name, value in default_headers),
            b"content-type: application/json", b"content-length: " + str(len(body)).encode(),
            b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body
