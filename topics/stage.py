"""A stage's life: the one ``ready:`` line, and stopping on SIGTERM/SIGINT.

Each stage prints exactly one line starting with ``ready: <stage>`` on stdout once it can
serve (partitions assigned and start offsets fixed, models loaded, socket bound).
``clipstream up``'s supervisor, the tests and the benchmarks wait for that line instead of a
sleep, which is what lets ``up`` promise that the first query after its own ready line is
answered by the models.

Each working loop of a stage also beats a heartbeat (``heartbeat``, ``beat_on_loop``) into the
file the supervisor names in ``CLIPSTREAM_HEARTBEAT_FILE``: a stage whose loop is wedged stops
beating, and ``clipstream up`` kills and restarts it (docs/design/0014). A part that cannot go
on at all (``fail``: a Kafka client in a fatal state) stops the whole stage, which exits with
``FATAL_EXIT`` to be started afresh. An asyncio stage runs its tasks with ``run_tasks``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

from clipstream.heap import freeze_startup_heap


def ready_line(stage: str, detail: str = "") -> str:
    """``ready: <stage>`` or ``ready: <stage> <detail>``."""
    return f"ready: {stage} {detail}" if detail else f"ready: {stage}"


# a stage's line for whoever runs the pipeline, not only for its log: ``clipstream up`` shows it
ALERT_PREFIX = "alert: "
# the words of an alert that blames capacity: ``up`` adds the stages restarted lately to one
CAPACITY_ADVICE = "add replicas"


def alert(stage: str, msg: str) -> None:
    """One line that ``clipstream up`` also prints (a stage serving wrongly, such as a model whose
    every call fails); the caller keeps it rare, as ``up``'s output is read by a person."""
    print(f"{ALERT_PREFIX}{stage}: {msg}", file=sys.stderr, flush=True)


# a stage's line that ``clipstream up`` shows as it is, as news rather than as an alert
NOTE_PREFIX = "note: "


def note(stage: str, msg: str) -> None:
    """One line ``clipstream up`` also prints (a change the stage made on its own, such as the
    batching knobs a batcher took from the registry); rare, as an alert."""
    print(f"{NOTE_PREFIX}{stage}: {msg}", flush=True)


def relayed(stage: str, said: str, prefix: str = "") -> str:
    """``<prefix><stage>: <what it said>``, as ``up`` prints a stage's alert (prefix ``alert: ``)
    or note: the stage's process name replaces the label the stage gave itself
    (``topics.stage.alert``, ``.note``)."""
    _label, sep, message = said.strip().partition(": ")
    return f"{prefix}{stage}: {message if sep else said.strip()}"


def announce_ready(stage: str, detail: str = "") -> None:
    """Freeze the start-up heap (``clipstream.heap``), then print the ready line."""
    freeze_startup_heap()
    print(ready_line(stage, detail), flush=True)


Task = Callable[[], Coroutine[Any, Any, None]]


def run_tasks(tasks: Sequence[Task]) -> int:
    """Run an asyncio stage's tasks until SIGTERM/SIGINT (or ``fail``), then cancel them so each
    one's ``finally`` closes what it opened (consumers commit and leave, producers flush); the
    exit status. A task that ends or raises stops the stage: the supervisor starts it afresh
    rather than leave the other tasks beating while a part of it serves nothing."""
    return asyncio.run(_run_tasks(tasks))


async def _run_tasks(tasks: Sequence[Task]) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    running = [loop.create_task(task(), name=task.__name__) for task in tasks]
    stopped = loop.create_task(stop.wait(), name="signals")
    done, _ = await asyncio.wait([stopped, *running], return_when=asyncio.FIRST_COMPLETED)
    for task in done - {stopped}:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            traceback.print_exception(error, file=sys.stderr)
        fail(f"task {task.get_name()} {'ended' if error is None else f'raised {error!r}'}")
    for task in [stopped, *running]:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    return exit_code()


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


# EX_TEMPFAIL: a stage that stopped because a part of it could not go on; a new process can
FATAL_EXIT = 75
_FAILED: list[str] = []


def fail(reason: str) -> None:
    """A part of the stage cannot go on, and a new process would: a Kafka client in a fatal
    state, as a static member fenced when its group's coordinator moved. Stop the stage as
    SIGTERM does (queued records still go out) so that it exits with ``exit_code()`` and its
    supervisor starts it again; the stage would otherwise keep beating while serving nothing.
    Any thread may call it; the stage is stopped once (a fatal client keeps reporting)."""
    if _FAILED:
        return
    _FAILED.append(reason)
    print(f"fatal: {reason}; stopping, to be restarted", file=sys.stderr, flush=True)
    # no supervisor stops a stage that failed by itself, and one that never beat is not judged
    # hung: a stop that blocks (a client's close waiting on a broker) must still end the process
    watchdog = threading.Timer(FAIL_EXIT_AFTER_S, _exit_now, args=(reason,))
    watchdog.daemon = True
    watchdog.start()
    os.kill(os.getpid(), signal.SIGTERM)


FAIL_EXIT_AFTER_S = 30.0


def _exit_now(reason: str) -> None:
    print(f"fatal: {reason}; still stopping after {FAIL_EXIT_AFTER_S:g} s, exiting now", file=sys.stderr, flush=True)
    os._exit(FATAL_EXIT)


def fail_if_fatal(err: Any, where: str) -> bool:
    """``fail`` when ``err`` (a ``KafkaError`` or None) is fatal to its client; True if so.
    A consumer hands its fatal error over as one with the code ``_FATAL``."""
    if err is None or not (err.fatal() or err.code() == KafkaError._FATAL):
        return False
    fail(f"{where}: {err.str()}")
    return True


def exit_code() -> int:
    """The stage's exit status once it stopped: ``FATAL_EXIT`` after ``fail``, else 0."""
    return FATAL_EXIT if _FAILED else 0


HEARTBEAT_FILE_ENV = "CLIPSTREAM_HEARTBEAT_FILE"
HEARTBEAT_EVERY_S = 1.0

# How long a Kafka client's thread with nothing to do blocks in one poll. A poll returns as
# soon as a record or a delivery report is there, so this bounds only how soon the thread sees
# a stop; each timeout that runs out wakes an idle process for nothing (docs/design/0049).
IDLE_POLL_S = 0.5


class Heartbeat:
    """Proof of life for a supervisor, beaten by each working loop of the stage from the loop
    itself (never from a side thread, which would keep beating while the work is wedged).

    The file holds one ``<loop> <seconds>`` line per loop, written at most every ``every_s``
    by whichever loop beats then, so the supervisor sees the stalest loop: a wedged learner
    thread makes a hung selector even while its join loop still turns. The seconds are
    CLOCK_MONOTONIC (``time.monotonic``), one clock for every process on the host."""

    def __init__(self, path: str | os.PathLike[str] | None, every_s: float = HEARTBEAT_EVERY_S) -> None:
        self.path = Path(path) if path else None
        self.every_s = every_s
        self.last: dict[str, float] = {}
        self._written = float("-inf")
        self._writing = threading.Lock()

    def beat(self, loop: str = "main") -> None:
        """Cheap enough for every turn of a hot loop: a clock read unless a write is due."""
        if self.path is None:
            return
        now = time.monotonic()
        self.last[loop] = now
        if now - self._written < self.every_s or not self._writing.acquire(blocking=False):
            return
        try:
            self._written = now
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(f"{name} {t:.3f}\n" for name, t in self.last.copy().items()))
            os.replace(tmp, self.path)  # the reader never sees half a file
        except OSError:
            pass  # the supervisor will see a stale beat and say so; the stage keeps serving
        finally:
            self._writing.release()


def read_heartbeat(path: str | os.PathLike[str]) -> dict[str, float] | None:
    """Each loop's last beat (monotonic seconds); None while there is no readable file yet."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    beats: dict[str, float] = {}
    for line in lines:
        name, _, when = line.rpartition(" ")
        try:
            beats[name] = float(when)
        except ValueError:
            return None
    return beats or None


_HEARTBEAT = Heartbeat(os.environ.get(HEARTBEAT_FILE_ENV))
_BEATING: set[asyncio.Task[None]] = set()  # the loops' beat tasks, kept from the garbage collector


def heartbeat(loop: str = "main") -> None:
    """Beat for ``loop`` (a name per working loop of the stage); a no-op when no supervisor
    asked for heartbeats. Call it on each turn of the loop that does the work."""
    _HEARTBEAT.beat(loop)


def beat_on_loop(loop: str) -> None:
    """Beat for ``loop`` from a task on the running asyncio loop, so an event loop that stops
    turning (a blocking call, a busy callback) stops the beat. Call it from a coroutine."""
    if _HEARTBEAT.path is None:
        return

    async def beating() -> None:
        while True:
            _HEARTBEAT.beat(loop)
            await asyncio.sleep(_HEARTBEAT.every_s / 2)

    task = asyncio.get_running_loop().create_task(beating(), name=f"heartbeat {loop}")
    _BEATING.add(task)
    task.add_done_callback(_BEATING.discard)
