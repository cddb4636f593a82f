"""The simulated ResNet-50 accelerator of ``bench.cost`` as a plain python-backend class.

Both systems of the side-by-side benchmark load this very file: clipstream's python backend as
``accel_model:Model`` and MLServer through the runtime ``bench.cost`` writes next to it. It
imports nothing but numpy, so MLServer's own virtualenv can load it.

A batch holds the device lock, then sleeps for Clockwork's ResNet-50 batch latency (linear
between the table's points, and beyond the last one along its last segment): one device, so
batches from two threads queue as they would on a GPU. The answer is a fixed projection of
the input, cheap next to the sleep.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

CLOCKWORK_MS: dict[int, float] = {1: 2.61, 2: 3.78, 4: 5.61, 8: 9.13, 16: 15.67}
LABELS = 10


def latency_ms(batch_size: int, table: dict[int, float] = CLOCKWORK_MS) -> float:
    """Clockwork's latency for a batch, linear between points and beyond the ends."""
    xs = sorted(table)
    ys = [table[k] for k in xs]
    b = float(batch_size)
    if xs[0] <= b <= xs[-1]:
        return float(np.interp(b, xs, ys))
    i = 0 if b < xs[0] else len(xs) - 2
    return max(0.0, ys[i] + (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) * (b - xs[i]))


class Model:
    """``Model(folder, config).predict_batch(x)``: one row of class scores per input."""

    _device = threading.Lock()  # one device per process

    def __init__(self, path: Any = None, config: dict[str, Any] | None = None) -> None:
        rng = np.random.default_rng(50)
        self.weights: np.ndarray | None = None
        self.rng = rng
        self.busy_s = 0.0

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        x = np.asarray(inputs, dtype=np.float32).reshape(len(inputs), -1)
        if self.weights is None or self.weights.shape[0] != x.shape[1]:
            self.weights = self.rng.standard_normal((x.shape[1], LABELS)).astype(np.float32)
        with self._device:
            t0 = time.perf_counter()
            time.sleep(latency_ms(len(x)) / 1000.0)
            self.busy_s += time.perf_counter() - t0
        z = x @ self.weights
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)
