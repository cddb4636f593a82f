"""A simulated accelerator: sleeps for a measured per-batch-size latency profile.

It stands in for a GPU in tests and benchmarks, where the shape of the latency curve matters
(a fixed cost plus a per-item cost, Clipper §4.3) and the arithmetic does not. The default is
Clockwork's ResNet-50 profile; ``fixed_ms`` + ``per_item_ms`` gives a linear one such as the
paper's SVM. ``speed`` scales it (2 = twice as fast); a ``slowdown`` file in the model folder
(or ``CLIPSTREAM_PROFILE_SLOWDOWN``), read at every batch, multiplies the latency at run time
so a benchmark can halve a replica's speed mid-run. Outputs are a deterministic function of
the input (a fixed random projection seeded by the model's name), so answers can be checked.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from clipstream.errors import ConfigError
from registry.spec import ModelSpec

# Clockwork (OSDI'20) ResNet-50 on a V100: batch size -> ms
CLOCKWORK_RESNET50: dict[int, float] = {1: 2.61, 2: 3.78, 4: 5.61, 8: 9.13, 16: 15.67}
SLOWDOWN_FILE = "slowdown"
SLOWDOWN_ENV = "CLIPSTREAM_PROFILE_SLOWDOWN"


class LatencyProfile:
    """Batch size -> latency (ms) by piecewise-linear interpolation, linear beyond the ends."""

    def __init__(self, table: Mapping[Any, Any]) -> None:
        try:
            points = sorted((int(k), float(v)) for k, v in table.items())
        except (TypeError, ValueError):
            raise ConfigError(f"latency_ms must map batch sizes to milliseconds, got {table!r}") from None
        if not points or any(b < 1 or ms < 0 for b, ms in points):
            raise ConfigError("latency_ms needs at least one entry, batch sizes >= 1, ms >= 0")
        self.sizes = np.array([b for b, _ in points], dtype=np.float64)
        self.ms = np.array([ms for _, ms in points], dtype=np.float64)

    @classmethod
    def linear(cls, fixed_ms: float, per_item_ms: float) -> "LatencyProfile":
        return cls({1: fixed_ms + per_item_ms, 2: fixed_ms + 2 * per_item_ms})

    def latency_ms(self, batch_size: int) -> float:
        b, xs, ys = float(batch_size), self.sizes, self.ms
        if len(xs) == 1:
            return float(ys[0])
        if b <= xs[0]:
            i = 0
        elif b >= xs[-1]:
            i = len(xs) - 2
        else:
            return float(np.interp(b, xs, ys))
        slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
        return max(0.0, float(ys[i] + slope * (b - xs[i])))


def profile_of(config: Mapping[str, Any]) -> LatencyProfile:
    """The profile model.yaml describes: ``latency_ms`` table, or ``fixed_ms`` + ``per_item_ms``."""
    if config.get("latency_ms") is not None:
        table = config["latency_ms"]
        if not isinstance(table, Mapping):
            raise ConfigError("latency_ms must be a mapping {batch_size: ms}")
        return LatencyProfile(table)
    if config.get("fixed_ms") is not None or config.get("per_item_ms") is not None:
        return LatencyProfile.linear(float(config.get("fixed_ms", 0.0)), float(config.get("per_item_ms", 0.0)))
    return LatencyProfile(CLOCKWORK_RESNET50)


class ProfileModel:
    """``predict_batch`` sleeps for the profile's latency and answers deterministically."""

    def __init__(self, spec: ModelSpec, *, device: str = "cpu", threads: int | None = None) -> None:
        self.spec = spec
        self.device = "cpu"
        self.profile = profile_of(spec.config)
        self.speed = float(spec.config.get("speed", 1.0))
        if self.speed <= 0:
            raise ConfigError("speed must be > 0")
        self.last_sleep_s = 0.0
        self._slowdown_path = spec.path / SLOWDOWN_FILE
        self._slowdown_cache: tuple[float, float] = (-1.0, 1.0)  # (mtime, factor)
        name = str(spec.config.get("name") or spec.path.parent.name or "profile")
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        dim = int(np.prod(spec.input.shape)) if spec.input.shape else 1
        width = len(spec.output.labels) if spec.output.kind == "class_scores" and spec.output.labels else 1
        if spec.output.kind == "label" and spec.output.labels:
            width = len(spec.output.labels)
        self.weights = rng.standard_normal((dim, width)) / np.sqrt(max(dim, 1))

    def slowdown(self) -> float:
        """Run-time latency multiplier: the ``slowdown`` file (re-read when it changes), else env."""
        try:
            mtime = self._slowdown_path.stat().st_mtime
        except FileNotFoundError:
            return float(os.environ.get(SLOWDOWN_ENV, "1") or 1)
        if mtime != self._slowdown_cache[0]:
            try:
                factor = float(self._slowdown_path.read_text().strip() or 1)
            except (OSError, ValueError):
                factor = self._slowdown_cache[1]
            self._slowdown_cache = (mtime, factor if factor > 0 else 1.0)
        return self._slowdown_cache[1]

    def service_time_s(self, batch_size: int) -> float:
        """Seconds the simulated device takes for a batch of this size, right now."""
        return self.profile.latency_ms(batch_size) / 1000.0 * self.slowdown() / self.speed

    def compute(self, inputs: np.ndarray) -> np.ndarray:
        """The answer without the wait: a fixed projection of the flattened inputs."""
        x = inputs.reshape(len(inputs), -1).astype(np.float64)
        z = x @ self.weights
        kind = self.spec.output.kind
        if kind == "class_scores":
            z = np.exp(z - z.max(axis=1, keepdims=True))
            return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)
        if kind == "label":
            labels = self.spec.output.labels
            idx = z.argmax(axis=1)
            return np.asarray([labels[i] for i in idx]) if labels else idx
        return z[:, 0]

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        self.last_sleep_s = self.service_time_s(len(inputs))
        out = self.compute(inputs)
        remaining = self.last_sleep_s - (time.perf_counter() - start)
        if remaining > 0:
            time.sleep(remaining)
        return out
