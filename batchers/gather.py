"""The predictions a batcher process makes in one turn of its event loop, sent together.

A query of an ensemble asks each of its models, and one fetch brings the requests of all of
them; their cache lookups come back in the same turn of the loop (docs/design/0055). Sent by
each model as it finds them, a query's hits would be one ``Predictions`` record per model, each
encoded, fetched and decoded on its own. Gathered until the turn ends, they are one record per
selector partition, whatever the model (docs/design/0076). Nothing waits for a timer: the
gathered predictions go out as soon as the tasks of this turn have run. No Kafka here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
Send = Callable[[list[T]], None]


class TurnGather(Generic[T]):
    """``add(items, send)`` keeps the items; once the loop has run what is ready now, one call
    of the last ``send`` given gets every item added meanwhile, in order. The models' services
    of one batcher process share their producer, offsets and topic, so any one of their
    ``send``s serves them all."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._send: Send[T] | None = None
        self.sends = 0  # how many sends went out (each makes a record per partition)

    def add(self, items: list[T], send: Send[T]) -> None:
        if not items:
            return
        if not self._items:
            asyncio.get_running_loop().call_soon(self._flush)
        self._items.extend(items)
        self._send = send

    def _flush(self) -> None:
        items, self._items = self._items, []
        if items and self._send is not None:
            self.sends += 1
            self._send(items)
