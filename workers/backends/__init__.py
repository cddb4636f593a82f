"""Model containers' narrow waist (Clipper §4.4): every backend exposes ``predict_batch``.

``load_model(spec)`` turns a model folder's ``ModelSpec`` into a ``BatchModel`` whatever the
framework, so the worker loop, the tests and the benchmarks never care which one it is.
Backends are imported lazily: a worker serving an ONNX model never pays for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

import numpy as np

from clipstream.errors import ConfigError
from registry.spec import ModelSpec, example_input
from workers.backends.devices import cuda_usable, passive_waits, resolve_device

# backend name -> "module:factory"; each factory is (spec, device, threads) -> BatchModel
BACKENDS: dict[str, str] = {
    "onnx": "workers.backends.onnx_backend:OnnxModel",
    "torch": "workers.backends.torch_backend:TorchModel",
    "python": "workers.backends.python_backend:PythonModel",
    "sklearn": "workers.backends.sklearn_backend:SklearnModel",
    "profile": "workers.backends.profile_backend:ProfileModel",
}


@runtime_checkable
class BatchModel(Protocol):
    """What a worker needs from a model: one call per batch, and where it runs."""

    spec: ModelSpec
    device: str  # "cpu" or "cuda"

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        """``inputs`` is (batch, *spec.input.shape); returns (batch, len(labels)) or (batch,)."""
        ...


def load_model(
    spec: ModelSpec, *, device: str = "auto", threads: int | None = None
) -> BatchModel:
    """Build the backend named in ``spec.backend`` on ``device`` (auto: CUDA when really usable),
    or on the device its model.yaml names, which wins: a small model may stay on the CPU of a
    worker whose other models take the GPU, as Triton's instance kind lets it.

    Only the GPU-capable backends ask about CUDA, so python and profile models start without
    touching the driver.
    """
    target = BACKENDS.get(spec.backend)
    if target is None:
        raise ConfigError(f"unknown backend {spec.backend!r}; known: {sorted(BACKENDS)}")
    passive_waits(spec.config)
    module_name, attr = target.split(":")
    factory = getattr(importlib.import_module(module_name), attr)
    if spec.backend in ("onnx", "torch"):
        device = spec.device or device
        try:
            device = resolve_device(device, cuda_usable() if device != "cpu" else False)
        except ConfigError as exc:
            if spec.device is None:
                raise
            raise ConfigError(f"{spec.path}/model.yaml: {exc}: run its workers where one is, or set `device: auto` "
                              "there (CUDA when there is one)") from None
    else:
        device = "cpu"
    return factory(spec, device=device, threads=threads)


def warm_up(model: BatchModel) -> np.ndarray | None:
    """Run one batch of the model's example (zeros, without one) so the first real batch does
    not pay for lazy initialisation; None for a model of text or bytes with no example."""
    inputs = example_input(model.spec, 1)
    return None if inputs is None else model.predict_batch(inputs)


__all__ = ["BACKENDS", "BatchModel", "load_model", "warm_up"]
