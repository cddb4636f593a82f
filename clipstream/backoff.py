"""The pause before ``up`` restarts a stage that died (docs/design/0014)."""

from __future__ import annotations


class Backoff:
    """The pause before a restart: ``first_s`` doubling with each death in a row up to
    ``max_s``, never a give-up (a stage that cannot start keeps being tried, slowly, and says
    why each time). A stage that served ``healthy_s`` before it died starts over at ``first_s``."""

    def __init__(self, first_s: float = 0.1, max_s: float = 30.0, healthy_s: float = 60.0) -> None:
        if not 0 < first_s <= max_s or healthy_s <= 0:
            raise ValueError(f"backoff needs 0 < first_s <= max_s and healthy_s > 0, "
                             f"got {first_s}, {max_s}, {healthy_s}")
        self.first_s, self.max_s, self.healthy_s = first_s, max_s, healthy_s
        self.streak = 0  # deaths in a row without a healthy while between them

    def next_delay(self, healthy_for_s: float) -> float:
        """The pause before restarting a stage that served ``healthy_for_s`` before it died."""
        if healthy_for_s >= self.healthy_s:
            self.streak = 0
        delay = min(self.max_s, self.first_s * 2.0 ** min(self.streak, 64))
        self.streak += 1
        return delay
