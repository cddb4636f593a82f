"""When a model's batches move to a new version (docs/design/0021).

The registry names the version to serve as soon as ``deploy-model`` or ``rollback`` writes it,
but the new version's workers still have to start, load and warm their model. Batches stamped
with the new version before then would wait for them, past the straggler cutoff. So the
batcher keeps stamping the old version, which its workers still serve, until every replica of
the new one has said it is ready with a readiness marker (``topics.markers``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

# a marker may be written this long before the batcher itself reads the registry change that
# asked for it (the worker's registry reader can be ahead of the batcher's)
MARKER_LEAD_US = 10_000_000


def start_version(wanted: str | None, known: Iterable[str], carried: Iterable[str | None]) -> str | None:
    """The version a batcher starts stamping: the registry's (``wanted``), unless the batches
    sent before this start (``carried``, one per replica) carry another version the model has
    had (``known``). A batcher that starts while a new version's workers are still loading
    (a restart, or the batcher process begun again for a model added beside it) then keeps
    sending to the workers that serve, and moves once the new ones are ready, as the batcher
    before it would have."""
    sent = [v for v in carried if v is not None]
    if not sent or wanted in sent:
        return wanted
    most = Counter(sent).most_common(1)[0][0]
    return most if most in set(known) else wanted


@dataclass
class VersionSwitch:
    """The version a model's batches carry, and when it moves to the one the registry names.

    It moves once every replica of the new version has a marker made since the registry named
    it, or after ``timeout_us`` without them: a worker that never gets ready (or one too old to
    write markers) must not pin the old version for ever. A worker that said it could not load
    the new version (a failure marker) does: the old version serves on until every replica is
    ready after all, or the registry names another version.
    """

    current: str | None
    timeout_us: int
    target: str | None = None
    target_replicas: int = 0
    since_us: int = 0
    _marks: dict[tuple[str, int], int] = field(default_factory=dict)  # (version, replica) -> made at
    _failed: dict[str, int] = field(default_factory=dict)  # version -> when a replica last said it failed to load
    # more replicas of the current version: the new ones, from ``grow_from`` up to ``grow_to``,
    # get batches once their workers say they are ready too (0: no growth waits)
    grow_from: int = 0
    grow_to: int = 0
    grow_since_us: int = 0

    def want(self, version: str | None, replicas: int, now_us: int) -> None:
        """The registry's version and replica count, as often as it is read."""
        if version == self.current:
            self.target = None  # a deploy undone before its workers were ready: nothing moves
            return
        if version != self.target:
            self.target, self.since_us = version, now_us
        self.target_replicas = replicas

    def want_more(self, before: int, replicas: int, now_us: int) -> None:
        """The registry asks for more replicas of the current version than are served."""
        if replicas != self.grow_to:
            self.grow_from, self.grow_to, self.grow_since_us = before, replicas, now_us

    def growth_due(self, now_us: int) -> str | None:
        """Why the new replicas should get batches now ("ready" or "timeout"), else None: a
        batch sent to a worker still loading its model would wait past its deadline."""
        if not self.grow_to or self.current is None:
            return "ready" if self.grow_to else None
        floor = self.grow_since_us - MARKER_LEAD_US
        if all(self._marks.get((self.current, r), floor - 1) >= floor for r in range(self.grow_from, self.grow_to)):
            return "ready"
        return "timeout" if now_us - self.grow_since_us >= self.timeout_us else None

    def grown(self) -> None:
        """The growth took effect, or the registry no longer asks for it."""
        self.grow_from = self.grow_to = 0

    def mark_ready(self, version: str, replica: int, made_us: int) -> None:
        key = (version, replica)
        self._marks[key] = max(made_us, self._marks.get(key, made_us))

    def mark_failed(self, version: str, made_us: int) -> None:
        self._failed[version] = max(made_us, self._failed.get(version, made_us))

    def failed(self) -> bool:
        """A replica of the target version said, since the registry named it, that it could not
        load it."""
        return self.target is not None and self._failed.get(self.target, 0) >= self.since_us - MARKER_LEAD_US

    def missing(self) -> list[int]:
        """Replicas of the target version that have not said they are ready (since it was named)."""
        if self.target is None:
            return []
        floor = self.since_us - MARKER_LEAD_US
        return [r for r in range(self.target_replicas) if self._marks.get((self.target, r), floor - 1) < floor]

    def due(self, now_us: int) -> str | None:
        """Why the batches should move to the target now ("ready" or "timeout"), else None."""
        if self.target is None:
            return None
        if not self.missing():
            return "ready"
        return "timeout" if now_us - self.since_us >= self.timeout_us and not self.failed() else None

    def switch(self) -> str | None:
        """Move to the target; returns the version left. Its workers are told to leave, so
        their markers no longer say anything: a rollback to it waits for new ones, even within
        ``MARKER_LEAD_US`` of the old."""
        left, self.current, self.target = self.current, self.target, None
        self._marks = {key: made for key, made in self._marks.items() if key[0] != left}
        return left
