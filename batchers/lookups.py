"""One cache round trip for all the models a batcher process serves, per turn of its loop.

One fetch can bring requests for several models: an ensemble's query asks each of them. Each
model's lookup task would send an MGET of its own, which costs a Redis round trip and a wake-up
of the loop for each reply. The tasks that one fetch woke run in the same turn of the loop, so
the first to ask waits one turn for the others, and their keys go out in one MGET
(docs/design/0055). No Kafka here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from clipstream.errors import ClipstreamError

Values = list[bytes | None]


class LookupAbandoned(ClipstreamError):
    """The task sending a shared MGET was cancelled before its reply came."""


class SharedLookups:
    """``await lookups(keys)`` -> the cached values of ``keys``, in order; the keys asked for in
    one turn of the loop share one ``mget``. An error of that ``mget`` reaches every asker."""

    def __init__(self, mget: Callable[[list[str]], Awaitable[Values]]) -> None:
        self._mget = mget
        self._joining: list[tuple[list[str], asyncio.Future[Values]]] | None = None
        self.round_trips = 0

    async def __call__(self, keys: list[str]) -> Values:
        if self._joining is not None:  # a round trip is being gathered this turn: join it
            fut: asyncio.Future[Values] = asyncio.get_running_loop().create_future()
            self._joining.append((keys, fut))
            return await fut
        self._joining = []
        try:
            await asyncio.sleep(0)  # one turn: the other tasks woken with this one ask meanwhile
        except asyncio.CancelledError:
            others, self._joining = self._joining, None
            _fail(others, LookupAbandoned("the cache lookup was abandoned"))
            raise
        others, self._joining = self._joining, None
        try:
            values = await self._mget([*keys, *(k for ks, _ in others for k in ks)])
            self.round_trips += 1
        except asyncio.CancelledError:
            _fail(others, LookupAbandoned("the cache lookup was abandoned"))
            raise
        except Exception as exc:
            _fail(others, exc)
            raise
        at = len(keys)
        for ks, fut in others:
            if not fut.done():
                fut.set_result(values[at:at + len(ks)])
            at += len(ks)
        return values[:len(keys)]


def _fail(others: list[tuple[list[str], asyncio.Future[Values]]], exc: BaseException) -> None:
    for _, fut in others:
        if not fut.done():
            fut.set_exception(exc)
