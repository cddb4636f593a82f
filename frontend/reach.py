"""Whether the gateway reaches Kafka, checked off the query path every second.

A query published while no broker answers waits in the producer's queue until its SLO is over
and gets the default, which says only that no answer came. Once a few checks in a row have
found no broker, the gateway refuses queries with 503 and ``Retry-After`` instead, saying why,
and its readiness says not ready, as ``/readyz`` does; the first check that finds one again
lets queries in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from time import monotonic

log = logging.getLogger("clipstream.gateway")

# checks in a row that found no broker before queries are refused: one slow metadata answer
# from a busy broker must not turn callers away
MISSES_TO_REFUSE = 2
CHECK_EVERY_S = 1.0
CHECK_TIMEOUT_S = 1.5


class KafkaReach:
    """The last checks' verdict: ``lost`` (why queries are refused now) and ``doubt`` (the last
    check found no broker, so a default now may be Kafka's doing, not the models')."""

    def __init__(self, bootstrap: str, misses_to_refuse: int = MISSES_TO_REFUSE) -> None:
        self.bootstrap, self.needed = bootstrap, misses_to_refuse
        self.lost: str | None = None
        self.misses = 0
        self._since: float | None = None

    @property
    def doubt(self) -> bool:
        return self.misses > 0

    def observe(self, answered: bool, now: float) -> str | None:
        """One check's outcome; the line to log when the verdict changes."""
        if answered:
            self.misses, self._since = 0, None
            if self.lost is None:
                return None
            self.lost = None
            return f"Kafka at {self.bootstrap} answers again: queries are let in"
        self.misses += 1
        self._since = now if self._since is None else self._since
        if self.lost is not None or self.misses < self.needed:
            return None
        self.lost = (f"the gateway cannot reach Kafka at {self.bootstrap} (no broker answered for "
                     f"{now - self._since + CHECK_TIMEOUT_S:.0f} s): queries are refused until one does; "
                     "check the brokers (clipstream infra status for a local one)")
        return self.lost

    async def watch(self, check: Callable[[], Awaitable[bool]], every_s: float | None = None) -> None:
        """Run ``check`` (one metadata round trip) every ``every_s`` (``CHECK_EVERY_S``) for as
        long as the gateway runs."""
        every_s = CHECK_EVERY_S if every_s is None else every_s
        while True:
            try:
                answered = await check()
            except Exception:  # a check that fails in any way found no broker
                answered = False
            said = self.observe(answered, monotonic())
            if said is not None:
                log.warning("%s", said)
            await asyncio.sleep(every_s)
