"""How one model's batcher follows the registry: a new replica count, or a new version whose
workers must be ready before batches move to it (``batchers.version``, docs/design/0021 and 0093).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from batchers.core import BatcherCore
from batchers.outputs import Out
from batchers.version import VersionSwitch
from clipstream.clock import now_us
from registry.spec import ModelSpec
from schemas import encode

log = logging.getLogger("clipstream.batcher")


class Follow:
    """The registry-following half of ``BatcherService``, which sets these attributes and
    provides ``_send_all`` (through ``Outputs``)."""

    model: Any  # ModelSetup: its ``name`` and ``spec``
    core: BatcherCore
    switch: VersionSwitch
    topic_batches: str
    wake: asyncio.Event
    _wanted: tuple[int, ModelSpec | None]
    _send_all: Callable[[list[Out]], None]

    def resize(self, replicas: int, version: str | None, spec: ModelSpec | None = None) -> None:
        """Follow the registry: a new replica count or a new version (new cache keys, and
        the new version's input check when the registry gives one). A new version takes
        effect, replica count and input check included, only once its workers are ready
        (``batchers.version``); until then the old version's workers keep serving."""
        now = now_us()
        self._wanted = (replicas, spec)
        self.switch.want(version, replicas, now)
        before = len(self.core.dispatcher.replicas)
        if self.switch.target is None and replicas > before:  # new replicas wait for their workers
            self.switch.want_more(before, replicas, now)
            self._maybe_grow(now)
        elif self.switch.target is None:
            self.switch.grown()
            self._apply(replicas, spec)
            # a removed replica's worker serves what was sent to it, then stops
            self._send_all([(self.topic_batches, encode(b), r, None)
                            for r, b in self.core.retirements(replicas, before, now)])
        else:
            self.switch.grown()  # the new version's replicas all wait for their markers anyway
            self._maybe_switch(now)

    def _maybe_grow(self, now: int) -> None:
        """Give the new replicas of the current version batches once their workers are ready
        (or waited for too long)."""
        why = self.switch.growth_due(now)
        if why is None:
            return
        if why == "timeout":
            log.warning("batcher %s: no ready marker from new replicas %d..%d after %.0f s; sending them batches "
                        "anyway (are their workers running? see their logs)", self.model.name,
                        self.switch.grow_from, self.switch.grow_to - 1, (now - self.switch.grow_since_us) / 1e6)
        self.switch.grown()
        self._apply(*self._wanted)

    def _apply(self, replicas: int, spec: ModelSpec | None) -> None:
        if replicas != len(self.core.dispatcher.replicas):
            self.core.dispatcher.resize(replicas)
            log.warning("batcher %s: now %d replicas", self.model.name, replicas)
        if spec is not None:
            self.model.spec = spec
        self.wake.set()

    def _maybe_switch(self, now: int) -> None:
        """Move the batches to the registry's version if its workers are ready (or waited for
        too long), and tell the old version's workers with one empty batch per partition."""
        why = self.switch.due(now)
        if why is None:
            return
        if why == "timeout":
            log.warning("batcher %s: no ready marker from replicas %s of version %s after %.0f s; moving "
                        "its batches anyway (are its workers running? see their logs)", self.model.name,
                        self.switch.missing(), self.switch.target, (now - self.switch.since_us) / 1e6)
        before = len(self.core.dispatcher.replicas)
        left = self.switch.switch()
        self.core.serve_version(self.switch.current)
        self._apply(*self._wanted)
        replicas = max(before, len(self.core.dispatcher.replicas))
        self._send_all([(self.topic_batches, encode(b), r, None) for r, b in self.core.handovers(replicas, now)])
        log.warning("batcher %s: batches move from version %s to %s (%s)", self.model.name, left,
                    self.core.version, why)
