"""A group's batcher: one queue, one AIMD limit and one batch for several models (docs/design/0088).

An ensemble's query asks each of its models. Served one by one, every model batches its share
of the query, and the worker of each answers and reports on its own. A group's service takes
the query's request for all of its members at once, looks each member's cache key up in the
same MGET, and queues the query once with the members that missed (``BatchItem.models``); its
worker runs every member on the batch and answers with one record. Everything else (deadline
queue, dispatch, credit, the version handover) is ``BatcherService``'s, with the group's
version, which changes with any member's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from batchers.core import Pending, prediction
from batchers.offsets import Where
from batchers.service import BatcherService, ModelSetup
from batchers.settings import BatcherSettings
from clipstream.cachekey import input_digest, key_of
from clipstream.clock import now_us
from clipstream.settings import Settings
from schemas import ModelRequest, Prediction, Tensor


class GroupService(BatcherService):
    """The batcher of a group: a request names the members it asks, and the rest pass on."""

    def __init__(self, settings: Settings, bs: BatcherSettings, model: ModelSetup, *args: Any, **kwargs: Any) -> None:
        super().__init__(settings, bs, model, *args, **kwargs)
        # a query's members share one item, so there is no one key for identical misses to wait on
        self.core.coalesce = False
        self.known: dict[str | None, dict[str, str | None]] = {model.version: dict(model.members)}

    def follow(self, version: str, members: dict[str, str]) -> None:
        """The registry's members for ``version``: cache keys take them when batches do."""
        self.known[version] = dict(members)

    def _others(self, request: ModelRequest) -> list[str]:
        return [name for name in request.also if name not in self.model.members]

    def _asked(self, request: ModelRequest) -> tuple[str, ...]:
        return tuple(n for n in dict.fromkeys((request.model, *request.also)) if n in self.model.members)

    def _take(self, request: ModelRequest, arrival: int, where: Where, value: bytes | None) -> None:
        if not self._asked(request):
            self.counts["errors"] += 1
            self.outbox.append(self._deadletter_record(
                f"bad request: group {self.model.name} serves {sorted(self.model.members)}, and the "
                f"request asks {[request.model, *request.also]}", value, where, request.query_id, serves=True))
            return
        super()._take(request, arrival, where, value)

    def _answers(self, pendings: list[Pending], status: str, now: int, output: Tensor | None = None,
                 error: str | None = None) -> list[tuple[Pending, Prediction]]:
        members = self.model.members
        return [(p, prediction(p, m, members.get(m), status, now, output, error)) for p in pendings for m in p.models]

    async def _look_up(self, arrived: list[tuple[ModelRequest, int, Where]]
                       ) -> tuple[list[tuple[Pending, Prediction]], list[Pending]]:
        """Each member's key of each request in one MGET; a request is queued once, with the
        members that missed (its input's digest lets the worker fill their keys)."""
        members = self.model.members
        pendings = [Pending(r, None, t, w, self._asked(r)) for r, t, w in arrived]
        digests = [input_digest(p.request.input) if self.redis else None for p in pendings]
        keys = [key_of(m, members.get(m), d) for p, d in zip(pendings, digests) if d is not None for m in p.models]
        values = iter(await self._mget(keys)) if keys else iter(())
        hits: list[tuple[Pending, Prediction]] = []
        misses: list[Pending] = []
        now = now_us()
        for p, digest in zip(pendings, digests):
            missing = []
            for m in p.models:
                output = self._decode_cached(next(values)) if digest is not None else None
                if output is None:
                    missing.append(m)
                else:
                    hits.append((p, prediction(p, m, members.get(m), "cached", now, output)))
            if not missing:
                continue
            if len(missing) < len(p.models) and self.offsets is not None and p.where is not None:
                self.offsets.more(p.where, 1)  # answered in two records: the hits', and the batch's
            misses.append(replace(p, key=digest, models=tuple(missing)))
        return hits, misses

    def _maybe_switch(self, now: int) -> None:
        super()._maybe_switch(now)
        self.model.members = self.known.get(self.core.version, self.model.members)
