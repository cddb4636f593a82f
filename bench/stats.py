"""The benchmarks' one percentile definition.

A percentile is a value that really occurred: numpy's "higher" method, the sorted value at rank
ceil(q / 100 * (n - 1)). A latency percentile is then a latency some query really had, and an
infinite value (a miss counted as infinitely slow) stays infinite instead of turning the
interpolation into NaN. NaN values (no answer at all) are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def _values(values: Iterable[float] | np.ndarray) -> np.ndarray:
    v = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    return v[~np.isnan(v)]


def percentile(values: Iterable[float] | np.ndarray, q: float, empty: Any = None) -> Any:
    """The ``q``-th percentile (0..100) of ``values``; ``empty`` (None: JSON null) when there are none."""
    v = _values(values)
    return float(np.percentile(v, q, method="higher")) if v.size else empty


def percentiles(values: Iterable[float] | np.ndarray, qs: Sequence[float] = PERCENTILES,
                empty: Any = math.nan) -> dict[str, Any]:
    """{"p50": ..., "p99.9": ...} of ``values``; ``empty`` (NaN) for each when there are none."""
    v = _values(values)
    return {f"p{q:g}": float(np.percentile(v, q, method="higher")) if v.size else empty for q in qs}
