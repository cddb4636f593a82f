"""A stage's life: the one ``ready:`` line, and stopping on SIGTERM/SIGINT.

Each stage prints exactly one line starting with ``ready: <stage>`` on stdout once it can
serve (partitions assigned and start offsets fixed, models loaded, socket bound).
``clipstream up``'s supervisor, the tests and the benchmarks wait for that line instead of a
sleep, which is what lets ``up`` promise that the first query after its own ready line is
answered by the models.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from clipstream.heap import freeze_startup_heap


def ready_line(stage: str, detail: str = "") -> str:
    """``ready: <stage>`` or ``ready: <stage> <detail>``."""
    return f"ready: {stage} {detail}" if detail else f"ready: {stage}"


def announce_ready(stage: str, detail: str = "") -> None:
    """Freeze the start-up heap (``clipstream.heap``), then print the ready line."""
    freeze_startup_heap()
    print(ready_line(stage, detail), flush=True)


def stop_on_signals(stop: threading.Event | Callable[..., Any] | None = None) -> threading.Event:
    """SIGTERM and SIGINT set ``stop`` (an event, made here when None) or call it (a callable
    given the signal's arguments); returns the event (a new one when ``stop`` is a callable,
    set alongside the call). Main thread only, as ``signal.signal`` is."""
    event = stop if isinstance(stop, threading.Event) else threading.Event()
    call = stop if callable(stop) and not isinstance(stop, threading.Event) else None

    def handler(*args: Any) -> None:
        event.set()
        if call is not None:
            call(*args)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return event
