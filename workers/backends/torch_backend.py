"""PyTorch backend: a TorchScript file (``torch.jit.save``) or a ``torch.export`` program (.pt2).

Both load without the model's Python source, which is what a model repository needs.
Inference runs under ``torch.inference_mode()`` on CUDA when it is usable.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from clipstream.errors import ConfigError, ModelError
from registry.spec import ModelSpec
from workers.backends.devices import thread_count


class TorchModel:
    """A scripted or exported torch module behind ``predict_batch``."""

    def __init__(self, spec: ModelSpec, *, device: str = "cpu", threads: int | None = None) -> None:
        import torch

        path = spec.path / str(spec.file)
        if not path.is_file():
            raise ConfigError(f"{spec.path}/model.yaml names {spec.file}, which does not exist")
        n = thread_count(spec.config, threads)
        if n is not None:
            torch.set_num_threads(n)
        self.torch = torch
        self.spec = spec
        self.device = device
        try:
            self.module: Any = self._load(path)
        except Exception as exc:
            raise ModelError(f"torch cannot load {path}: {exc}") from exc

    def _load(self, path: Any) -> Any:
        torch = self.torch
        if path.suffix == ".pt2":  # torch.export program
            module = torch.export.load(str(path)).module()
            return module.to(self.device)
        with warnings.catch_warnings():  # TorchScript is deprecated in new torch, still supported
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(str(path), map_location=self.device)
        module.eval()
        return module

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        """Copy in, run, copy out; CPU tensors share the numpy buffer (no copy)."""
        torch = self.torch
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(inputs)).to(self.device)
            out = self.module(x)
            if isinstance(out, (tuple, list)):
                out = out[0]
            return out.detach().to("cpu").numpy()
