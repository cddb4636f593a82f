"""How long a replica takes for a batch of a given size, learnt from its workers' reports.

Clipper observed that batch latency is close to linear in the batch size for most
frameworks (its Figure 3) and tried quantile regression on it before settling on AIMD for
the *maximum* size. The batcher still needs the curve below that maximum: under overload,
which requests can still make their deadline depends on the size of the batch they go in.
A small batch answers the oldest request in time but wastes the device (a fixed cost per
batch); a full one keeps the device efficient but only fresh requests make it. Fitting
``service = fixed + per_item * size`` over the recent reports lets the dispatcher choose.
The fit is Tukey's resistant line (medians), so a few batches slowed by something else on
the machine do not move it.

A fixed cost small against the noise can make the fitted slope negative: the curve is then
taken as flat (the median), which is what those reports say; a negative fixed cost, as a
line through the origin. When the recent batches all had the same size, or all but a few,
the slope is unknown; the estimate is then the conservative one: a smaller batch takes as long as the observed one
(it cannot take longer on a device that batches), a larger one proportionally longer.
"""

from __future__ import annotations

from collections import deque
from statistics import median


class LatencyModel:
    """``service_us(size)`` of one replica, from its last ``window`` reports."""

    def __init__(self, window: int = 32) -> None:
        self._obs: deque[tuple[int, int]] = deque(maxlen=window)
        self._fit: tuple[float, float] | None = None  # (fixed_us, per_item_us); None: one size seen
        self._median: tuple[float, float] = (0.0, 0.0)  # (size, service_us)
        self._dirty = False  # refitted when next asked, not on every report

    @property
    def known(self) -> bool:
        return bool(self._obs)

    def observe(self, size: int, service_us: int) -> None:
        if size < 1 or service_us < 0:
            return
        self._obs.append((int(size), int(service_us)))
        self._dirty = True

    def _refit(self) -> None:
        """Tukey's resistant line: the slope joins the medians of the smaller and the larger
        half of the batches, the fixed cost is the median residual. Medians, not means: one
        batch slowed by a pause elsewhere on the machine must not tilt the line (a least-squares
        line would, and the batcher would drop requests that could still make it)."""
        self._dirty = False
        obs = sorted(self._obs)
        sizes = [s for s, _ in obs]
        self._median = (float(median(sizes)), float(median(t for _, t in obs)))
        self._fit = None
        if sizes[0] == sizes[-1]:
            return
        half = len(obs) // 2
        low, high = obs[:half], obs[len(obs) - half:]
        if median(s for s, _ in high) == median(s for s, _ in low):
            split = _split_at_median_size(obs, self._median[0])
            if split is None:
                return  # too few batches off the median size to draw a line through: conservative
            low, high = split
        run = median(s for s, _ in high) - median(s for s, _ in low)
        slope = (median(t for _, t in high) - median(t for _, t in low)) / run
        if slope <= 0:  # within the noise, size does not matter here: a flat curve
            self._fit = (self._median[1], 0.0)
            return
        fixed = median(t - slope * s for s, t in obs)
        if fixed < 0:  # no fixed cost visible: through the origin
            fixed, slope = 0.0, median(t / s for s, t in obs)
        self._fit = (fixed, slope)

    @property
    def median_us(self) -> float:
        """The median service time of the recent batches, whatever their size (0 before any)."""
        if self._dirty:
            self._refit()
        return self._median[1]

    def service_us(self, size: int) -> float:
        """The expected service time of a batch of ``size`` (0 before any report)."""
        if not self._obs:
            return 0.0
        if self._dirty:
            self._refit()
        if self._fit is not None:
            fixed, slope = self._fit
            return fixed + slope * size
        m_size, m_time = self._median
        return m_time if size <= m_size else m_time * size / m_size


MIN_GROUP = 3  # batches on each side of a split by size before a slope is drawn from them


def _split_at_median_size(obs: list[tuple[int, int]], m_size: float) -> tuple[list[tuple[int, int]], ...] | None:
    """Split by size, not by count, when most batches have the median size.

    AIMD moving between two sizes (2 and 3, say: a miss, then a full batch, then a miss)
    leaves most reports at one size; halves by count then both have that size for their
    median, and the line comes out flat, so a batch of 3 is expected to take as long as one of
    2 and the requests in it and behind it are late. The ties go to whichever side leaves the
    smaller group larger; a side with fewer than ``MIN_GROUP`` batches is too open to one
    slowed batch to tilt the line, and the caller keeps the conservative curve.
    """
    splits = ([o for o in obs if o[0] <= m_size], [o for o in obs if o[0] > m_size]), \
             ([o for o in obs if o[0] < m_size], [o for o in obs if o[0] >= m_size])
    low, high = max(splits, key=lambda lh: min(len(lh[0]), len(lh[1])))
    return (low, high) if min(len(low), len(high)) >= MIN_GROUP else None
