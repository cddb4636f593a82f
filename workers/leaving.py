"""When a worker whose partition was handed over or retired may stop.

Several batcher members may send to one partition (docs/design/0025), and each writes its own
handover or retirement when it reads the registry change, a moment apart. A worker that
stopped at the first one would leave a later member's last batches unread, and their queries
would get the default. So it stops once every batcher that sent to it lately has handed over,
or a bounded wait after the first one, for a member that died before it could.
"""

from __future__ import annotations

# a sender counts as present when it sent within this long before the first handover
RECENT_US = 10_000_000
# the longest a worker waits for the other senders after the first handover
WAIT_US = 5_000_000


class SendersLeft:
    """The batchers that sent to this partition lately, and which of them handed over."""

    def __init__(self, recent_us: int = RECENT_US, wait_us: int = WAIT_US) -> None:
        self.recent_us, self.wait_us = recent_us, wait_us
        self._last_us: dict[str, int] = {}
        self._done: set[str] = set()
        self.since_us: int | None = None  # the first handover, or None before it

    def sent(self, sender: str, now_us: int) -> None:
        self._last_us[sender] = now_us

    def handed_over(self, sender: str, now_us: int) -> None:
        self._last_us[sender] = now_us
        self._done.add(sender)
        if self.since_us is None:
            self.since_us = now_us

    def waiting_for(self) -> list[str]:
        """The senders present at the first handover that have not handed over yet."""
        if self.since_us is None:
            return []
        start = self.since_us - self.recent_us
        return sorted(s for s, t in self._last_us.items() if t >= start and s not in self._done)

    def may_stop(self, now_us: int) -> bool:
        if self.since_us is None:
            return False
        return not self.waiting_for() or now_us - self.since_us >= self.wait_us
