"""Whether a stage turns away a large share of its work: the gateway refusing queries (503),
a batcher giving requests up before their deadline. Each is counted in the metrics, but a
person running ``clipstream up`` sees only its output: past a share over a window, the stage
says so, with what to do, at most once a minute."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Window:
    start_s: float
    total: float
    away: float
    alerted_s: float | None = None


class Saturation:
    """Per key (an app, a model): cumulative counts in, the share turned away over each window
    out when it calls for an alert."""

    def __init__(self, window_s: float = 10.0, share: float = 0.1, least: int = 20, every_s: float = 60.0) -> None:
        self.window_s, self.share, self.least, self.every_s = window_s, share, least, every_s
        self._windows: dict[str, _Window] = {}

    def check(self, key: str, now_s: float, total: float, away: float) -> float | None:
        """``total`` and ``away``: cumulative counts of ``key`` now. The share turned away over
        the window that ends now, when it is at least ``share`` of at least ``least`` turned
        away and no alert for ``key`` was given in the last ``every_s``; else None."""
        w = self._windows.get(key)
        if w is None:
            self._windows[key] = _Window(now_s, total, away)
            return None
        if now_s - w.start_s < self.window_s:
            return None
        d_total, d_away = total - w.total, away - w.away
        w.start_s, w.total, w.away = now_s, total, away
        if d_away < self.least or d_total <= 0 or d_away / d_total < self.share:
            return None
        if w.alerted_s is not None and now_s - w.alerted_s < self.every_s:
            return None
        w.alerted_s = now_s
        return min(1.0, d_away / d_total)
