"""Which batch offset a pipelined worker may commit: the end of the longest run of batches
whose every output the broker has acknowledged.

The worker runs a batch on the device while it writes out the previous one and reads the
next, so batches finish out of step with their offsets' order and their records are
acknowledged later still. Committing past a batch whose outputs are not yet acknowledged
could lose them in a crash; this keeps at-least-once without making the device wait for acks.
No Kafka here: the worker's threads call it, so it has its own lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class OffsetTracker:
    """Batches in offset order; each is done when it is finished and all its records acked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # offset -> records not yet acknowledged, or None while the batch is still running
        self._open: OrderedDict[int, int | None] = OrderedDict()
        self._committable: int | None = None
        self.failure: str | None = None

    def begin(self, offset: int) -> None:
        """A batch was read (offsets arrive in increasing order)."""
        with self._lock:
            self._open[offset] = None

    def produced(self, offset: int, records: int) -> None:
        """The batch's outputs are all handed to the producer: ``records`` acks to wait for."""
        with self._lock:
            if offset in self._open:  # else a batch from before a reset: it will be read again
                self._open[offset] = (self._open[offset] or 0) + records
                self._advance()

    def acked(self, offset: int, error: str | None = None) -> None:
        """One record of the batch at ``offset`` was acknowledged (or failed for good)."""
        with self._lock:
            if error is not None:  # the batch stays open: it is where the worker resumes
                self.failure = self.failure or f"batch at offset {offset}: {error}"
                return
            left = self._open.get(offset)
            if left is not None:
                self._open[offset] = left - 1
            self._advance()

    def _advance(self) -> None:
        while self._open:
            offset, left = next(iter(self._open.items()))
            if left is None or left > 0:
                return
            self._open.popitem(last=False)
            self._committable = offset + 1

    def take_committable(self) -> int | None:
        """The offset to commit (one past the last done batch) if it moved since the last call."""
        with self._lock:
            out, self._committable = self._committable, None
            return out

    def first_open(self) -> int | None:
        """Where to resume after a failed delivery: the oldest batch not known to be done."""
        with self._lock:
            return next(iter(self._open), None)

    def reset(self) -> None:
        with self._lock:
            self._open.clear()
            self._committable = None
            self.failure = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
