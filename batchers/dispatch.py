"""Per-replica dispatch: credit, choice of replica, delayed batching (Clipper 4.3.1-4.3.2).

* Credit. Each replica may have at most ``max_in_flight`` batches outstanding (default 2:
  one running, one waiting at the worker so the GPU never idles between batches). A batch's
  credit comes back with the worker's ``BatchStats``. This keeps the queue in the batcher,
  ordered by deadline, and never a backlog in the Kafka topic in front of the worker.
* Just in time. A replica that is busy gets its next batch only shortly (``lead``) before its
  device should be free, not the moment credit allows: the batch still reaches the worker in
  time (the Kafka hop is the same both ways and ``lead`` covers the jitter), and requests
  arriving meanwhile wait here, ordered by deadline, and can still join it, rather than
  behind a batch already parked at the worker. A full batch is the exception: nothing can
  join it, so it goes as soon as credit allows and waits at the worker, and under a backlog
  the Kafka hop never leaves the device idle (just in time alone would, whenever the hop takes
  longer than ``lead``; docs/design/0003).
  When the device frees is tracked per replica: each batch sent starts when the previous one
  ends and takes the service time of its size (``batchers/latency.py``); a worker's report
  resets the estimate (the batches still out run one after another from then).
* Lost credit. If a worker dies, its stats never come: a batch outstanding longer than
  ``credit_timeout_us`` is reclaimed, and the replica is marked suspect so that healthy
  replicas are preferred until it reports again.
* Choice. The next batch goes to a replica with credit, least loaded first (fewest items
  in flight), ties to the one that was sent a batch longest ago (round robin when idle).
* Delayed batching. With fewer requests queued than the replica's current maximum, wait up
  to ``batch_delay_us`` measured from the oldest queued request's arrival for more to come;
  worth it when a batch has a high fixed cost (Nagle's argument). A request that came alone
  (more than the delay after the one before it) does not wait: the gap says the next is not
  due within the delay, so waiting would add latency and no batch (as Nagle's algorithm sends
  at once when nothing is outstanding). Requests in a run wait as before.

Each replica has its own AIMD state. Time is always passed in, so tests inject the clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from batchers.aimd import AIMD
from batchers.latency import LatencyModel


@dataclass
class InFlight:
    """A batch sent and not yet reported."""

    batch_id: str
    replica: int
    size: int
    limit: int
    sent_us: int
    keys: tuple[str, ...] = ()


@dataclass
class Replica:
    index: int
    aimd: AIMD
    max_in_flight: int
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    last_sent_us: int = -1
    suspect: bool = False
    batches: int = 0
    items: int = 0
    free_at_us: int = 0  # when the device should have finished every batch sent so far
    # service time by batch size, from the last reports; medians, so one straggling batch
    # neither stops the batcher sending (every request looking hopeless, and no report coming
    # to correct it) nor skews when the next batch is due
    latency: LatencyModel = field(default_factory=LatencyModel)

    @property
    def service_us(self) -> float:
        """The replica's speed: the median service time of its recent batches (0 before any)."""
        return self.latency.median_us

    def ready_at_us(self, lead_us: int, lead_fraction: float) -> int | None:
        """When this replica may take another batch: None without credit; at once when idle
        or before its speed is known; else ``lead`` before its device should be free."""
        if self.credit <= 0:
            return None
        if not self.in_flight or self.service_us <= 0:
            return 0
        return self.free_at_us - int(max(lead_us, lead_fraction * self.service_us))

    def batch_us(self, size: int) -> int:
        """The expected service time of a batch of ``size`` (0 before any report)."""
        return int(self.latency.service_us(size))

    def wait_us(self, now_us: int) -> int:
        """How long a batch sent now waits at the worker for the batches already sent (each
        timed by its size, from the sends and the last report). Overestimating this drops
        requests that would have made their deadline, and the batch leaves short."""
        return max(0, self.free_at_us - now_us) if self.in_flight else 0

    @property
    def credit(self) -> int:
        return self.max_in_flight - len(self.in_flight)

    @property
    def items_in_flight(self) -> int:
        return sum(b.size for b in self.in_flight.values())


@dataclass(frozen=True)
class Decision:
    """What to do now: send ``size`` items to ``replica``, or wait until ``wake_us``."""

    replica: int | None = None
    size: int = 0
    wake_us: int | None = None

    @property
    def send(self) -> bool:
        return self.replica is not None and self.size > 0


IDLE = Decision()


class Dispatcher:
    """Credit, AIMD and delayed-batching state of all replicas of one model."""

    def __init__(
        self,
        replicas: int,
        aimd_factory: Callable[[], AIMD],
        max_in_flight: int = 2,
        batch_delay_us: int = 2000,
        credit_timeout_us: int = 5_000_000,
        credit_lead_us: int | None = 3000,
        credit_lead_fraction: float = 0.1,
    ) -> None:
        """``credit_lead_us`` None: a free credit is used at once (no just-in-time gating)."""
        if replicas < 1 or max_in_flight < 1:
            raise ValueError("need at least one replica and one batch in flight")
        self._factory = aimd_factory
        self.max_in_flight = max_in_flight
        self.batch_delay_us = max(0, int(batch_delay_us))
        self.credit_timeout_us = int(credit_timeout_us)
        self.credit_lead_us = credit_lead_us
        self.credit_lead_fraction = credit_lead_fraction
        self.replicas: list[Replica] = []
        self._last_arrival_us: int | None = None
        self.alone = False  # the latest request came more than the delay after the one before
        self._by_batch: dict[str, InFlight] = {}
        self._reclaimed: dict[str, InFlight] = {}
        self.resize(replicas)

    def resize(self, replicas: int) -> None:
        """Grow or shrink the replica set (a shrunk replica's in-flight batches are forgotten)."""
        while len(self.replicas) < replicas:
            self.replicas.append(Replica(len(self.replicas), self._factory(), self.max_in_flight))
        for gone in self.replicas[replicas:]:
            for batch_id in gone.in_flight:
                self._by_batch.pop(batch_id, None)
        del self.replicas[replicas:]

    def retune(self, aimd_factory: Callable[[], AIMD], objective_us: int, cap: int, batch_delay_us: int) -> None:
        """New batching knobs for every replica, those to come (``aimd_factory``) included."""
        self._factory = aimd_factory
        self.batch_delay_us = max(0, int(batch_delay_us))
        for r in self.replicas:
            r.aimd.retune(objective_us, cap)

    def set_credit(self, max_in_flight: int) -> None:
        """Batches this batcher may have outstanding at each replica (a member's share of a
        replica's credit when several batcher members feed it; docs/design/0024)."""
        self.max_in_flight = max(1, int(max_in_flight))
        for r in self.replicas:
            r.max_in_flight = self.max_in_flight

    def ready_at_us(self, r: Replica) -> int | None:
        if self.credit_lead_us is None:
            return 0 if r.credit > 0 else None
        return r.ready_at_us(self.credit_lead_us, self.credit_lead_fraction)

    def pick(self, now_us: int | None = None, queued: int = 0) -> Replica | None:
        """The replica to receive the next batch: ready (credit, and due when busy, or ``queued``
        fills its batch: nothing more could join it), not suspect, least loaded. Without
        ``now_us`` any replica with credit counts as ready."""
        ready = self.ready(now_us, queued)
        if not ready:
            return None
        return min(ready, key=lambda r: (r.suspect, r.items_in_flight, r.last_sent_us, r.index))

    def ready(self, now_us: int | None = None, queued: int = 0) -> list[Replica]:
        """The replicas that may take a batch now (as ``pick`` judges them)."""
        return [r for r in self.replicas
                if (t := self.ready_at_us(r)) is not None
                and (now_us is None or t <= now_us or queued >= r.aimd.max_batch_size)]

    def next_ready_us(self) -> int | None:
        """When the earliest replica with credit becomes due (None: no credit anywhere)."""
        times = [t for t in (self.ready_at_us(r) for r in self.replicas) if t is not None]
        return min(times) if times else None

    def arrived(self, arrival_us: int) -> None:
        """A request joined the queue at ``arrival_us``: note whether it came alone."""
        last = self._last_arrival_us
        self.alone = last is None or arrival_us - last > self.batch_delay_us
        self._last_arrival_us = arrival_us if last is None else max(last, arrival_us)

    def decide(self, queued: int, oldest_arrival_us: int | None, now_us: int) -> Decision:
        """Send now, wait (delayed batching), or stay idle.

        A full batch (``queued >= max``) goes at once, to a busy replica too if it has credit.
        A short queue waits until the oldest request has been queued ``batch_delay_us`` (not
        one request that came alone), and for a busy replica until just in time; then whatever
        is there goes.
        """
        if queued <= 0:
            return IDLE
        replica = self.pick(now_us, queued)
        if replica is None:  # no credit anywhere (the next BatchStats or reclaim wakes us),
            return Decision(None, 0, self.next_ready_us())  # or not yet due
        limit = replica.aimd.max_batch_size
        if queued >= limit:
            return Decision(replica.index, limit)
        if queued == 1 and self.alone:
            return Decision(replica.index, 1)
        start = now_us if oldest_arrival_us is None else oldest_arrival_us
        send_at = start + self.batch_delay_us
        if now_us >= send_at:
            return Decision(replica.index, queued)
        return Decision(None, 0, send_at)

    def sent(
        self, replica: int, batch_id: str, size: int, now_us: int, keys: tuple[str, ...] = ()
    ) -> InFlight:
        """Record a batch sent to ``replica``: it takes one credit."""
        r = self.replicas[replica]
        flight = InFlight(batch_id, replica, size, r.aimd.max_batch_size, now_us, keys)
        r.in_flight[batch_id] = flight
        r.free_at_us = max(now_us, r.free_at_us) + r.batch_us(size)
        r.last_sent_us = now_us
        r.batches += 1
        r.items += size
        self._by_batch[batch_id] = flight
        return flight

    def completed(self, batch_id: str, batch_size: int, service_us: int, now_us: int | None = None,
                  learn: bool = True) -> InFlight | None:
        """A worker reported a batch: return its credit and feed its replica's AIMD.

        Stats for a batch reclaimed earlier still feed AIMD (a slow batch is exactly the
        evidence AIMD needs) but return no credit twice. Unknown batches (another batcher
        instance's, or from before a restart) are ignored. ``learn`` False: a batch of another
        version than the one served now, which says nothing of this one's speed.
        """
        flight = self._by_batch.pop(batch_id, None)
        if flight is not None:
            replica = self.replicas[flight.replica]
            replica.in_flight.pop(batch_id, None)
        else:
            flight = self._reclaimed.pop(batch_id, None)
            if flight is None or flight.replica >= len(self.replicas):
                return None
            replica = self.replicas[flight.replica]
        replica.suspect = False
        if learn:
            replica.latency.observe(batch_size, service_us)
        if now_us is not None:  # the batches still out run one after another from about now
            replica.free_at_us = now_us + sum(replica.batch_us(f.size) for f in replica.in_flight.values())
        if learn:
            replica.aimd.observe(batch_size, service_us, flight.limit)
        return flight

    def reclaim(self, now_us: int) -> list[InFlight]:
        """Take back the credit of batches outstanding longer than the credit timeout."""
        lost = [
            f for f in self._by_batch.values() if now_us - f.sent_us >= self.credit_timeout_us
        ]
        for flight in lost:
            del self._by_batch[flight.batch_id]
            replica = self.replicas[flight.replica]
            replica.in_flight.pop(flight.batch_id, None)
            replica.suspect = True
            self._reclaimed[flight.batch_id] = flight
        while len(self._reclaimed) > 1024:  # bounded memory of late stats
            del self._reclaimed[next(iter(self._reclaimed))]
        return lost

    def next_reclaim_us(self) -> int | None:
        """When the oldest outstanding batch would be reclaimed, or None."""
        if not self._by_batch:
            return None
        return min(f.sent_us for f in self._by_batch.values()) + self.credit_timeout_us

    def stats(self) -> list[dict[str, int | bool]]:
        """A small per-replica summary for log lines and tests."""
        return [
            {
                "replica": r.index,
                "max_batch_size": r.aimd.max_batch_size,
                "in_flight": len(r.in_flight),
                "batches": r.batches,
                "items": r.items,
                "suspect": r.suspect,
            }
            for r in self.replicas
        ]
