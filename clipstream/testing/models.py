"""Small real model folders for tests and benchmarks, built in a temporary directory.

Every builder writes ``<root>/<name>/<version>/`` with a ``model.yaml`` (the layout of a model
repository) and returns that folder. Nothing is downloaded: the digits set ships inside
scikit-learn, the torch weights come from a fixed seed. Training and export are cached per
process, so calling a builder in many tests costs a file copy.

    folder = make_onnx_digits_model(tmp_path)                 # sklearn logistic regression, ONNX
    folder = make_torch_model(tmp_path)                       # tiny MLP, TorchScript
    folder = make_python_model(tmp_path, "echo", SOURCE, labels=[0, 1])
    folder = make_profile_model(tmp_path, table=CLOCKWORK)    # simulated GPU
    x, y = digits()                                           # inputs (n, 64) float32, labels
"""

from __future__ import annotations

import functools
import inspect
import re
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

CLOCKWORK: dict[int, float] = {1: 2.61, 2: 3.78, 4: 5.61, 8: 9.13, 16: 15.67}
# a linear profile like the paper's SVM: a fixed cost per batch plus a small cost per item
SVM_FIXED_MS, SVM_PER_ITEM_MS = 5.0, 0.05
DIGITS_LABELS: list[int] = list(range(10))
# onnxruntime refuses IR versions newer than it knows; opset 17 with IR 8 is read by every
# onnxruntime >= 1.14 (the round trip is tested in tests/unit/test_workers_backends.py)
ONNX_OPSET, ONNX_ML_OPSET, ONNX_IR_VERSION = 17, 3, 8


def write_model_yaml(folder: Path, config: Mapping[str, Any]) -> Path:
    """Write ``model.yaml`` (creating the folder) and return the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.yaml").write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return folder


@functools.cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits: float32 inputs (n, 64) with values 0..16, int64 labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data.astype(np.float32), data.target.astype(np.int64)


@functools.cache
def digits_logreg() -> Any:
    """A logistic regression fitted on the first 1500 digits (deterministic, and quick)."""
    from sklearn.linear_model import LogisticRegression

    x, y = digits()
    return LogisticRegression(max_iter=2000).fit(x[:1500], y[:1500])


@functools.cache
def digits_onnx_bytes() -> bytes:
    """``digits_logreg`` exported by skl2onnx with plain probabilities (zipmap=False)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    clf = digits_logreg()
    onx = convert_sklearn(
        clf,
        initial_types=[("input", FloatTensorType([None, 64]))],
        target_opset={"": ONNX_OPSET, "ai.onnx.ml": ONNX_ML_OPSET},
        options={id(clf): {"zipmap": False}},
    )
    onx.ir_version = min(onx.ir_version, ONNX_IR_VERSION)
    return onx.SerializeToString()


def make_onnx_digits_model(
    root: Path, name: str = "logreg", version: str = "1", *, kind: str = "class_scores",
    threads: int | None = 1,
) -> Path:
    """Digits logistic regression as ONNX; ``kind`` class_scores (probabilities) or label."""
    folder = Path(root) / name / version
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(digits_onnx_bytes())
    config: dict[str, Any] = {
        "backend": "onnx",
        "file": "model.onnx",
        "input": {"dtype": "float32", "shape": [64]},
        "output": {"kind": kind, "labels": DIGITS_LABELS},
    }
    if threads is not None:
        config["threads"] = threads
    return write_model_yaml(folder, config)


def _torch_mlp() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10), torch.nn.Softmax(dim=1)
    ).eval()


@functools.cache
def _torch_mlp_bytes(fmt: str) -> bytes:
    import io
    import warnings

    import torch

    mlp, buf = _torch_mlp(), io.BytesIO()
    if fmt == "export":  # torch.export program with a dynamic batch axis
        batch = torch.export.Dim("batch", min=1, max=1 << 16)
        program = torch.export.export(mlp, (torch.zeros(2, 64),), dynamic_shapes=({0: batch},))
        torch.export.save(program, buf)
    else:
        with warnings.catch_warnings():  # TorchScript is deprecated in torch >= 2.10, still loads
            warnings.simplefilter("ignore", FutureWarning)
            torch.jit.save(torch.jit.script(mlp), buf)
    return buf.getvalue()


def make_torch_model(
    root: Path, name: str = "mlp", version: str = "1", *, fmt: str = "torchscript",
    threads: int | None = 1,
) -> Path:
    """A seeded 64-32-10 MLP with softmax (class_scores over 0..9).

    ``fmt`` torchscript writes ``model.pt`` (torch.jit), export writes ``model.pt2`` (torch.export).
    """
    folder = Path(root) / name / version
    folder.mkdir(parents=True, exist_ok=True)
    file = "model.pt2" if fmt == "export" else "model.pt"
    (folder / file).write_bytes(_torch_mlp_bytes(fmt))
    config: dict[str, Any] = {
        "backend": "torch",
        "file": file,
        "input": {"dtype": "float32", "shape": [64]},
        "output": {"kind": "class_scores", "labels": DIGITS_LABELS},
    }
    if threads is not None:
        config["threads"] = threads
    return write_model_yaml(folder, config)


def make_python_model(
    root: Path,
    name: str,
    code_or_class: str | type,
    labels: Sequence[Any] | None = None,
    *,
    version: str = "1",
    class_name: str | None = None,
    kind: str | None = None,
    dtype: str = "float32",
    shape: Sequence[int] = (64,),
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """A python-backend model from module source text or from a class defined in a test.

    A class is written out with ``inspect.getsource`` under a header importing numpy as ``np``
    and ``Path``; it must not use other names from its test module. Source text must define
    ``class_name`` (default ``Model``). ``kind`` defaults to class_scores when labels are given,
    else regression. ``extra`` lands in model.yaml (the class receives it as ``config``).
    """
    folder = Path(root) / name / version
    folder.mkdir(parents=True, exist_ok=True)
    module = re.sub(r"\W", "_", f"model_{name}_{version}")
    if isinstance(code_or_class, str):
        source, cls_name = textwrap.dedent(code_or_class), class_name or "Model"
    else:
        header = "import numpy as np\nfrom pathlib import Path\n\n\n"
        source, cls_name = header + textwrap.dedent(inspect.getsource(code_or_class)), code_or_class.__name__
    (folder / f"{module}.py").write_text(source)
    kind = kind or ("class_scores" if labels is not None else "regression")
    output: dict[str, Any] = {"kind": kind}
    if labels is not None:
        output["labels"] = list(labels)
    config: dict[str, Any] = {
        "backend": "python",
        "class": f"{module}:{cls_name}",
        "input": {"dtype": dtype, "shape": list(shape)},
        "output": output,
    }
    config.update(extra or {})
    return write_model_yaml(folder, config)


def make_profile_model(
    root: Path,
    name: str = "resnet50",
    version: str = "1",
    *,
    table: Mapping[int, float] | None = CLOCKWORK,
    fixed_ms: float | None = None,
    per_item_ms: float | None = None,
    speed: float = 1.0,
    labels: Sequence[Any] = DIGITS_LABELS,
    kind: str = "class_scores",
    dtype: str = "float32",
    shape: Sequence[int] = (64,),
) -> Path:
    """A simulated accelerator: ``table`` (batch size -> ms) or ``fixed_ms`` + ``per_item_ms``.

    Write a number into ``<folder>/slowdown`` while it runs to multiply its latency.
    """
    folder = Path(root) / name / version
    config: dict[str, Any] = {
        "backend": "profile",
        "input": {"dtype": dtype, "shape": list(shape)},
        "output": {"kind": kind, "labels": list(labels)} if kind != "regression" else {"kind": kind},
        "speed": speed,
    }
    if fixed_ms is not None or per_item_ms is not None:
        config["fixed_ms"] = float(fixed_ms or 0.0)
        config["per_item_ms"] = float(per_item_ms or 0.0)
    elif table is not None:
        config["latency_ms"] = {int(k): float(v) for k, v in table.items()}
    return write_model_yaml(folder, config)


def set_slowdown(folder: Path, factor: float) -> None:
    """Make a running profile model ``factor`` times slower (1 restores it)."""
    tmp = Path(folder) / "slowdown.tmp"
    tmp.write_text(str(float(factor)))
    tmp.replace(Path(folder) / "slowdown")  # atomic: a batch never reads half a number


STALLING_SOURCE = '''
import time

import numpy as np


class Model:
    """Two class scores from the mean of the input past its first feature. Sleeps ``stall_ms``
    on any batch holding an input whose first feature is at least 1, so the caller decides
    which queries meet a stall (a straggler that tests and benchmarks can replay)."""

    def __init__(self, path, config):
        self.stall = float(config.get("stall_ms", 0)) / 1000

    def predict_batch(self, inputs):
        x = inputs.reshape(len(inputs), -1)
        if self.stall and bool((x[:, 0] >= 1).any()):
            time.sleep(self.stall)
        p = (x[:, 1:].mean(axis=1) > 0.5).astype(np.float32)
        return np.stack([1 - p, p], axis=1)
'''


def make_stalling_model(root: Path, name: str, stall_ms: float = 0.0) -> Path:
    """A quick two-class python model; with ``stall_ms`` it stalls on batches holding a flagged
    input (first feature >= 1), without it never: the fast members of a straggler ensemble."""
    return make_python_model(root, name, STALLING_SOURCE, labels=[0, 1], extra={"stall_ms": float(stall_ms)})
