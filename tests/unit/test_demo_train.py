"""The demo's ONNX exports: the k-nearest-neighbours model uses onnxruntime's CDist kernel and
answers exactly as scikit-learn does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from clipstream.demo.train import _options, _to_onnx, load_digits_split


def _run(model: bytes, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


def test_the_knn_export_computes_distances_with_cdist_and_answers_as_sklearn_does() -> None:
    x_train, x_test, y_train, _ = load_digits_split()
    knn = KNeighborsClassifier(n_neighbors=5).fit(x_train, y_train)
    model = _to_onnx(knn)
    ops = {(node.domain, node.op_type) for node in onnx.load_from_string(model).graph.node}
    assert ("com.microsoft", "CDist") in ops
    labels, scores = _run(model, x_test)
    assert (labels == knn.predict(x_test)).all()
    np.testing.assert_allclose(scores, knn.predict_proba(x_test), atol=1e-6)


def test_other_models_keep_the_default_graph_without_zipmap() -> None:
    x_train, x_test, y_train, _ = load_digits_split()
    logreg = LogisticRegression(max_iter=200).fit(x_train, y_train)
    assert _options(logreg) == {"zipmap": False}
    labels, scores = _run(_to_onnx(logreg), x_test)
    assert (labels == logreg.predict(x_test)).all() and scores.shape == (len(x_test), 10)
