"""A consumer's queue that wakes an event loop itself, through a pipe librdkafka writes to.

A consumer thread that blocks in ``poll`` and hands each fetch to the loop costs a thread
wake-up and a GIL hand-off per fetch, on top of the loop's own wake-up. librdkafka can write
to a file descriptor whenever a queue that was empty gets an entry
(``rd_kafka_queue_io_event_enable``), so the loop can watch that descriptor and poll the
consumer itself with no wait. confluent-kafka does not expose that call; it is reached through
the librdkafka library the process already loaded, and the consumer's handle is checked before
anything is enabled: it must point into readable memory, and librdkafka must give it the
consumer's client name. When any part of that is missing,
``attach`` answers None and the caller keeps its thread (docs/design/0053).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from typing import Any

import confluent_kafka  # loads librdkafka into the process
from confluent_kafka import Consumer

log = logging.getLogger("clipstream.topics")

RD_KAFKA_CONSUMER = 1  # rd_kafka_type_t
# confluent-kafka's Handle struct begins with the rd_kafka_t pointer, right after the object
# header, whose size this interpreter's build gives as ``object.__basicsize__``
_HANDLE_OFFSET = object.__basicsize__
# the confluent-kafka major versions whose Handle starts that way
_KNOWN_MAJORS = frozenset({"1", "2"})
# bytes from the handle that librdkafka reads to name it; a pointer into less readable memory
# than this is not a client handle, and is never passed to librdkafka
_HANDLE_SPAN = 4096


def _mappings() -> list[list[str]]:
    """This process's memory map (``/proc/self/maps``), a line's fields each: address range,
    permissions, offset, device, inode and, for a file, its path."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        return [line.split() for line in maps]


def readable(address: int, span: int) -> bool:
    """Whether ``span`` bytes from ``address`` lie in one readable mapping of this process: a
    pointer read from a layout that moved must not reach librdkafka, which would fault on it."""
    try:
        for fields in _mappings():
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address and address + span <= high:
                return fields[1].startswith("r")
    except (OSError, ValueError):
        return False
    return False


@functools.cache
def librdkafka() -> Any:
    """The librdkafka this process loaded for confluent-kafka (the same copy, from the
    process's own map of loaded files), with the calls used here typed; None when not found."""
    try:
        paths = {fields[-1] for fields in _mappings() if len(fields) > 5 and "librdkafka" in fields[-1]}
        if len(paths) != 1:
            return None
        lib = ctypes.CDLL(paths.pop())
        lib.rd_kafka_name.restype, lib.rd_kafka_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        lib.rd_kafka_type.restype, lib.rd_kafka_type.argtypes = ctypes.c_int, [ctypes.c_void_p]
        lib.rd_kafka_queue_get_consumer.restype = ctypes.c_void_p
        lib.rd_kafka_queue_get_consumer.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_queue_io_event_enable.restype = None
        lib.rd_kafka_queue_io_event_enable.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.rd_kafka_queue_destroy.restype, lib.rd_kafka_queue_destroy.argtypes = None, [ctypes.c_void_p]
    except (OSError, AttributeError) as exc:
        log.info("librdkafka's queue events are not reachable (%s): consumers keep a thread", exc)
        return None
    return lib


class QueueWakeup:
    """The read end of a pipe that librdkafka writes to when the consumer's queue gets work.

    Watch ``fd`` for reading; once it is readable, ``drain`` it and poll the consumer with no
    wait until it returns nothing: librdkafka writes again only when the queue was empty."""

    def __init__(self, lib: Any, queue: int) -> None:
        self._lib, self._queue = lib, queue
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)
        lib.rd_kafka_queue_io_event_enable(queue, self._write_fd, b"1", 1)

    def drain(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Stop the writes, then close the pipe: a descriptor number librdkafka still held
        could belong to another file by then."""
        if self._queue:
            self._lib.rd_kafka_queue_io_event_enable(self._queue, -1, None, 0)
            self._lib.rd_kafka_queue_destroy(self._queue)
            self._queue = 0
            os.close(self.fd)
            os.close(self._write_fd)


def attach(consumer: Any, client_id: str) -> QueueWakeup | None:
    """A ``QueueWakeup`` on ``consumer``'s queue (a confluent-kafka ``Consumer`` made with
    ``client.id`` = ``client_id``), or None: not such a consumer, or librdkafka not reachable."""
    lib = librdkafka()
    if lib is None or type(consumer) is not Consumer or confluent_kafka.version()[0].split(".")[0] not in _KNOWN_MAJORS:
        return None
    handle = ctypes.c_void_p.from_address(id(consumer) + _HANDLE_OFFSET).value
    if not handle or not readable(handle, _HANDLE_SPAN):
        return None
    name = lib.rd_kafka_name(handle) or b""
    if not name.startswith(f"{client_id}#consumer-".encode()) or lib.rd_kafka_type(handle) != RD_KAFKA_CONSUMER:
        log.warning("a consumer's handle is not where confluent-kafka kept it (%r): it keeps a thread", name)
        return None
    queue = lib.rd_kafka_queue_get_consumer(handle)
    if not queue:  # no group.id: no consumer queue
        return None
    return QueueWakeup(lib, queue)
