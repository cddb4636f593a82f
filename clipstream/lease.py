"""One ``up`` per topic prefix: a lease in Redis that a second ``up`` finds and stops at.

Two ``up`` runs that share a Kafka and a topic prefix start the same stages: their selectors
and batchers share static member names, so each fences the other's members, and the second
one's app file rewrites the first one's registry. The running ``up`` holds a short-lived key
naming itself, refreshed while it runs; a second ``up`` that finds it refuses to start, before
it touches the registry. The key outlives a killed ``up`` by at most ``TTL_S``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from typing import Any

from clipstream.errors import InfraError
from clipstream.redisclient import REDIS_AWAY

log = logging.getLogger(__name__)

TTL_S = 6.0  # how long a killed up keeps its prefix
EVERY_S = 2.0  # the refresh: three tries before the key runs out


def lease_key(prefix: str) -> str:
    return f"cs:up:{prefix}"


class UpLease:
    """The prefix's lease for this ``up``: ``claim`` once, then refreshed on a thread until ``release``."""

    def __init__(self, redis: Any, prefix: str, gateway: str) -> None:
        self.redis, self.prefix, self.key = redis, prefix, lease_key(prefix)
        self.value = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "gateway": gateway})
        self._stop = threading.Event()

    def claim(self) -> UpLease:
        """Take the lease, or InfraError naming the ``up`` that holds it and the ways out."""
        try:
            taken, raw = self._take()
            if not taken and raw is None:  # it ran out between the two steps: once more
                taken, raw = self._take()
        except REDIS_AWAY as exc:
            raise InfraError(f"Redis did not answer while up took the topic prefix {self.prefix!r} ({exc}): "
                             "check that it runs and answers, then start up again") from None
        if not taken:
            held = _holder(raw)
            raise InfraError(
                f"another clipstream up ({held}) serves topic prefix {self.prefix!r} on this Kafka and Redis: "
                f"a second one would fence its stages and rewrite its registry. Stop it (its Ctrl-C), or run "
                f"this one beside it with another CLIPSTREAM_TOPIC_PREFIX; a killed up's hold ends within "
                f"{TTL_S:g} s")
        threading.Thread(target=self._refresh, name="up-lease", daemon=True).start()
        return self

    def _take(self) -> tuple[bool, Any]:
        """Set the key if nobody holds it; else what the holder wrote."""
        if self.redis.set(self.key, self.value, nx=True, px=int(TTL_S * 1000)):
            return True, None
        return False, self.redis.get(self.key)

    def _refresh(self) -> None:
        while not self._stop.wait(EVERY_S):
            try:
                self.redis.set(self.key, self.value, px=int(TTL_S * 1000))
            except Exception as exc:  # Redis away: up's watch says so; the lease is retried
                log.debug("the up lease was not refreshed: %s", exc)

    def release(self) -> None:
        """Stop refreshing, and drop the key if it is still this ``up``'s."""
        self._stop.set()
        try:
            if _text(self.redis.get(self.key)) == self.value:
                self.redis.delete(self.key)
        except Exception as exc:  # it runs out by itself
            log.debug("the up lease was not released: %s", exc)


def _text(raw: Any) -> str | None:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def _holder(raw: Any) -> str:
    try:
        held = json.loads(_text(raw) or "{}")
        return f"pid {held['pid']} on {held['host']}, gateway {held['gateway']}"
    except (ValueError, KeyError, TypeError):
        return "one that did not say where"
