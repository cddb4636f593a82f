"""Plain-Python backend: a class named in model.yaml, imported from the model's own folder.

``class: mymod:MyModel`` imports ``mymod`` with the folder first on ``sys.path`` and builds
``MyModel(path, config)``. Two model folders may both ship a ``model.py``; a same-named module
already imported from elsewhere is dropped from ``sys.modules`` first so each model gets its own.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import numpy as np

from clipstream.errors import ConfigError, ModelError
from registry.spec import ModelSpec


def import_class(folder: Path, target: str) -> type:
    """Import ``package.module:Class`` from ``folder`` (put on sys.path) and return the class."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"class must look like package.module:Class, got {target!r}")
    folder = folder.resolve()
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    _forget_foreign(module_name.split(".")[0], folder)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ModelError(f"cannot import {module_name} from {folder}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigError(f"{module_name} has no attribute {attr!r}")
    return obj  # type: ignore[no-any-return]


def _forget_foreign(top: str, folder: Path) -> None:
    """Drop ``top`` and its submodules from sys.modules unless they were loaded from ``folder``."""
    loaded = sys.modules.get(top)
    if loaded is None:
        return
    origin = getattr(loaded, "__file__", None)
    if origin is not None and Path(origin).resolve().is_relative_to(folder):
        return
    if top in sys.stdlib_module_names:
        raise ConfigError(f"model module {top!r} shadows a standard-library module: rename it")
    for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()


# what a python model is, for a class written to another contract (MLServer's load/predict, say)
CONTRACT = ("A python model is built as Class(folder, config), loading in its constructor, and answers "
            "predict_batch(inputs) with one row per input, a plain method (docs/MODELS.md)")


class PythonModel:
    """Adapts a user class with ``predict_batch`` to the worker's ``BatchModel``."""

    def __init__(self, spec: ModelSpec, *, device: str = "cpu", threads: int | None = None) -> None:
        cls = import_class(spec.path, str(spec.cls))
        try:
            self.impl = cls(spec.path, dict(spec.config))
        except TypeError as exc:  # most often a class written for another server's contract
            raise ModelError(f"{spec.cls}({spec.path}, config) failed: {exc}. {CONTRACT}") from exc
        except Exception as exc:
            raise ModelError(f"{spec.cls}({spec.path}, config) failed: {exc}") from exc
        predict = getattr(self.impl, "predict_batch", None)
        if not callable(predict):
            raise ConfigError(f"{spec.cls} has no predict_batch(inputs) method. {CONTRACT}")
        if inspect.iscoroutinefunction(predict):
            raise ConfigError(f"{spec.cls}.predict_batch is `async def`: the worker calls it as a plain method, "
                              "on a thread of its own beside the batches it reads. Make it a plain `def`")
        self.spec = spec
        self.device = str(getattr(self.impl, "device", device))

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        return np.asarray(self.impl.predict_batch(inputs))
