"""Train five digit classifiers of different kinds and write them as a model repository.

Data is scikit-learn's bundled digits (no download). The sklearn models go out as ONNX (with an
IR version the installed onnxruntime reads), the PyTorch network as TorchScript. A sixth folder,
version 2 of the best model, wraps version 1 and rotates its class scores: deploying it is how
the demo "breaks" a model, and `rollback` is how it recovers.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import yaml

LABELS = list(range(10))
# the demo's models, in the order they are trained; docker-compose.yml runs the same five
MODELS = ("logreg", "linsvm", "forest", "knn", "mlp")
SLO_MS = 150.0  # the app's latency objective: the ensemble answers within it, stragglers or not
ONNX_IR_VERSION = 9  # onnxruntime >= 1.16 reads IR 9
ONNX_OPSET = {"": 17, "ai.onnx.ml": 3}


def load_digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = data.data.astype(np.float32)
    y = data.target.astype(np.int64)
    return tuple(train_test_split(x, y, test_size=0.5, random_state=seed, stratify=y))  # type: ignore[return-value]


def _to_onnx(clf: Any) -> bytes:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onx = convert_sklearn(
        clf,
        initial_types=[("input", FloatTensorType([None, 64]))],
        target_opset=ONNX_OPSET,
        options={id(clf): _options(clf)},
    )
    onx.ir_version = min(onx.ir_version, ONNX_IR_VERSION)
    return onx.SerializeToString()


def _options(clf: Any) -> dict[str, Any]:
    """Plain class scores (no ZipMap). A k-nearest-neighbours model computes its distances with
    onnxruntime's CDist kernel: the default graph broadcasts the input against every training
    row, at a far higher cost per batch for the same scores (docs/design/0077)."""
    from sklearn.neighbors import KNeighborsClassifier

    options: dict[str, Any] = {"zipmap": False}
    if isinstance(clf, KNeighborsClassifier):
        options["optim"] = "cdist"
    return options


def _write(folder: Path, files: dict[str, bytes], config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "model.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def _spec(backend: str, **extra: Any) -> dict[str, Any]:
    return {
        "backend": backend,
        **extra,
        "input": {"dtype": "float32", "shape": [64]},
        "output": {"kind": "class_scores", "labels": LABELS},
        "threads": 1,
    }


def train_torch_mlp(x: np.ndarray, y: np.ndarray, seed: int = 0) -> bytes:
    import torch

    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(x / 16.0), torch.from_numpy(y)
    for _ in range(150):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xt), yt)
        loss.backward()
        opt.step()

    class Scaled(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.inner(inputs / 16.0), dim=1)

    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(Scaled(net).eval()), buf)
    return buf.getvalue()


DEGRADED_CODE = '''"""Version 2 of a model that answers wrongly: version 1's class scores, rotated by one class."""
from pathlib import Path

import numpy as np

from workers.backends import load_model
from registry.spec import load_spec


class Degraded:
    def __init__(self, path: Path, config: dict):
        self.base = load_model(load_spec(path.parent / str(config["base_version"])), device="cpu")

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        return np.roll(self.base.predict_batch(inputs), 1, axis=1)
'''


def train_all(repo: Path, progress: Any = print) -> dict[str, float]:
    """Write ``repo/<name>/1`` for five models; return each one's held-out accuracy."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.svm import SVC

    x_train, x_test, y_train, y_test = load_digits_split()
    sklearn_models = {
        "logreg": LogisticRegression(max_iter=3000),
        "linsvm": SVC(kernel="linear", probability=True, random_state=0),
        "forest": RandomForestClassifier(n_estimators=40, max_depth=8, random_state=0),
        "knn": KNeighborsClassifier(n_neighbors=5),
    }
    accuracy: dict[str, float] = {}
    for name, clf in sklearn_models.items():
        clf.fit(x_train, y_train)
        accuracy[name] = float(clf.score(x_test, y_test))
        _write(repo / name / "1", {"model.onnx": _to_onnx(clf)}, _spec("onnx", file="model.onnx"))
        progress(f"  trained {name:7s} (ONNX)        held-out accuracy {accuracy[name]:.3f}")
    assert (*sklearn_models, "mlp") == MODELS, "keep MODELS (and docker-compose.yml) in step"
    pt = train_torch_mlp(x_train, y_train)
    _write(repo / "mlp" / "1", {"model.pt": pt}, _spec("torch", file="model.pt"))
    from registry.spec import load_spec
    from workers.backends import load_model

    mlp = load_model(load_spec(repo / "mlp" / "1"), device="cpu")
    accuracy["mlp"] = float((mlp.predict_batch(x_test).argmax(1) == y_test).mean())
    progress(f"  trained mlp     (TorchScript) held-out accuracy {accuracy['mlp']:.3f}")
    return accuracy


def write_degraded(repo: Path, name: str) -> Path:
    """``repo/<name>/2``: a python-backend model that wraps version 1 and answers wrongly."""
    return _write(
        repo / name / "2",
        {"degraded.py": DEGRADED_CODE.encode()},
        {**_spec("python", **{"class": "degraded:Degraded"}), "base_version": 1},
    )


GROUP = "digits-models"


def write_app_file(path: Path, models: list[str], slo_ms: float = SLO_MS, group: str | None = GROUP) -> Path:
    """The demo's Exp4 app over ``models``, served as one group (docs/design/0088) unless
    ``group`` is None."""
    app = {
        "apps": [
            {
                "name": "digits",
                "policy": "exp4",
                # a demo of 2,400 queries: weights that move within a few hundred of them, and
                # a floor a recovered model climbs back from before the demo ends
                "policy_config": {"eta": 0.3, "max_log_ratio": 3.0},
                "slo_ms": slo_ms,
                "default_output": -1,
                "models": models,
            }
        ],
        "models": [
            {"name": m, "version": "1", "path": f"models/{m}/1", "replicas": 1, **({"group": group} if group else {})}
            for m in models
        ],
    }
    path.write_text(yaml.safe_dump(app, sort_keys=False))
    return path
