"""scikit-learn estimators and pipelines saved with joblib, served without a wrapper class, as
MLServer's sklearn runtime serves them: a ``class_scores`` model answers ``predict_proba`` (in
the order of ``labels``, which must be the estimator's ``classes_``), and a ``label`` or
``regression`` model answers ``predict``.

Loading a joblib file runs code that it names, as a ``python`` model's class does: a model
folder is trusted as code is.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from clipstream.errors import ConfigError, ModelError
from registry.spec import ModelSpec
from schemas.tensor import VARIABLE


# what scikit-learn says on every call of an estimator fitted on a DataFrame and given an array:
# clipstream gives arrays, whose values are the columns in the order fitted (docs/design/0120)
NAMELESS_INPUT = "X does not have valid feature names"


class SklearnModel:
    """An estimator loaded with ``joblib.load``, asked for the method its output kind names."""

    def __init__(self, spec: ModelSpec, *, device: str = "cpu", threads: int | None = None) -> None:
        try:
            import joblib
        except ImportError:
            raise ConfigError("backend sklearn needs scikit-learn and joblib: pip install 'clipstream[models]'") from None
        path = spec.path / str(spec.file)
        try:
            self.estimator = joblib.load(path)
        except Exception as exc:  # a missing module, a file of another version: joblib's own types
            raise ModelError(f"cannot load {path} with joblib: {type(exc).__name__}: {exc}") from exc
        kind, name = spec.output.kind, type(self.estimator).__name__
        method = "predict_proba" if kind == "class_scores" else "predict"
        predict = getattr(self.estimator, method, None)
        if not callable(predict):
            raise ConfigError(f"{spec.path}/model.yaml: a {name} has no {method}, which output kind {kind} asks; "
                              + ("use kind: label for its predict" if kind == "class_scores" else
                                 "use kind: class_scores for a classifier's predict_proba"))
        classes = getattr(self.estimator, "classes_", None)
        if kind == "class_scores" and classes is not None:
            _same_labels(spec, list(classes))
        if kind == "label" and classes is not None and np.asarray(classes).dtype.kind not in "biuf":
            named = _plain(classes)
            raise ConfigError(f"{spec.path}/model.yaml: the {name}'s classes are named ({named[:4]}"
                              f"{'...' if len(named) > 4 else ''}), and a label model answers numbers: use kind: "
                              "class_scores with those names as labels")
        self._predict = predict
        self.spec, self.device = spec, "cpu"
        # a text input of one element (skl2onnx's [1]) goes to a vectorizer as a list of strings
        self._flat = spec.input.dtype in VARIABLE and int(np.prod(spec.input.shape)) == 1
        columns = getattr(self.estimator, "feature_names_in_", None)
        if columns is not None:
            _same_width(spec, name, [str(c) for c in columns])
            warnings.filterwarnings("ignore", message=NAMELESS_INPUT, category=UserWarning)
        elif isinstance(fitted := getattr(self.estimator, "n_features_in_", None), int) and not self._flat:
            _same_width(spec, name, [f"feature {i}" for i in range(fitted)], "features")

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        n = len(inputs)
        x = inputs.reshape(n) if self._flat else inputs.reshape(n, -1) if inputs.ndim > 2 else inputs
        return np.asarray(self._predict(x))


def _same_width(spec: ModelSpec, name: str, columns: list[str], what: str = "columns") -> None:
    """An estimator fitted on named columns (or on ``n_features_in_`` unnamed features) takes as
    many values per example, in that order."""
    width = int(np.prod(spec.input.shape))
    if width != len(columns):
        named = f" ({columns[:4]}{'...' if len(columns) > 4 else ''})" if what == "columns" else ""
        raise ConfigError(f"{spec.path}/model.yaml: the {name} was fitted on {len(columns)} {what}{named}, and "
                          f"input.shape {list(spec.input.shape)} gives {width} values per example: set shape: "
                          f"[{len(columns)}], the {what} in that order")


def _same_labels(spec: ModelSpec, classes: list[Any]) -> None:
    """``predict_proba``'s columns are in ``classes_``' order: the labels must be those, so
    that each score lands on its label."""
    labels = list(spec.output.labels or ())
    if [str(c) for c in classes] != [str(label) for label in labels]:
        raise ConfigError(f"{spec.path}/model.yaml: output.labels {labels} are not the estimator's classes_ "
                          f"{_plain(classes)} in their order: write those")


def _plain(classes: Any) -> list[Any]:
    """Classes as YAML writes them (numpy's scalars as Python's)."""
    return [c.item() if hasattr(c, "item") else c for c in classes]
