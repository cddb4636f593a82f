"""ONNX Runtime backend: CUDA provider when the GPU is really there, else CPU, chosen explicitly.

sklearn classifiers exported by skl2onnx (with ``zipmap=False``) have two outputs, ``label``
and ``probabilities``; a class_scores model answers with the probabilities, a label model
with the label. ``output_name:`` in model.yaml picks another output by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clipstream.errors import ConfigError, ModelError
from registry.spec import ModelSpec
from workers.backends.devices import CUDA_EP, allow_spinning, onnx_providers, thread_count

# onnxruntime's type strings -> numpy dtypes, to feed the graph what it declares
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
_PREFERRED = {
    "class_scores": ("probabilities", "output_probability", "scores", "probs", "logits"),
    "label": ("label", "output_label"),
    "regression": ("variable", "prediction", "output"),
}


def pick_output(kind: str, names: list[str], requested: str | None = None) -> str:
    """The graph output that answers a ``kind`` model: requested name, a known name, or the first."""
    if requested is not None:
        if requested not in names:
            raise ConfigError(f"output_name {requested!r} is not an output of the graph: {names}")
        return requested
    for name in _PREFERRED.get(kind, ()):
        if name in names:
            return name
    if kind == "class_scores" and len(names) > 1 and names[0] == "label":
        return names[1]
    return names[0]


def _check_shape(spec: ModelSpec, graph_input: Any) -> None:
    """The graph's input is a batch of model.yaml's shape: its rank one more, and each fixed
    dimension after the batch the same (a mismatch would fail every batch, once loaded)."""
    dims = graph_input.shape
    if not isinstance(dims, list) or not dims:
        return
    fixed = [d if isinstance(d, int) else None for d in dims[1:]]
    if len(fixed) != len(spec.input.shape) or any(d is not None and d != s for d, s in zip(fixed, spec.input.shape)):
        want = ["n" if d is None else d for d in fixed]
        raise ConfigError(f"{spec.path}/model.yaml declares input shape {list(spec.input.shape)}, and the graph's "
                          f"input {graph_input.name!r} is {dims}: declare `shape: {want}`, the graph's without "
                          "its batch dimension".replace("'n'", "n"))


class OnnxModel:
    """An ``onnxruntime.InferenceSession`` behind ``predict_batch``."""

    def __init__(self, spec: ModelSpec, *, device: str = "cpu", threads: int | None = None) -> None:
        import onnxruntime as ort

        path = spec.path / str(spec.file)
        if not path.is_file():
            raise ConfigError(f"{spec.path}/model.yaml names {spec.file}, which does not exist")
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: provider choice is ours, not a warning
        options.inter_op_num_threads = 1
        n = thread_count(spec.config, threads)
        if n is not None:
            options.intra_op_num_threads = n
        spin = "1" if allow_spinning(spec.config) else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        providers = onnx_providers(device, ort.get_available_providers())
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise ModelError(f"onnxruntime cannot load {path}: {exc}") from exc
        self.spec = spec
        self.device = "cuda" if CUDA_EP in self.session.get_providers() else "cpu"
        graph_input = self.session.get_inputs()[0]
        self.input_name: str = graph_input.name
        self.input_dtype: Any = _ORT_TYPES.get(graph_input.type)
        _check_shape(spec, graph_input)
        if (graph_input.type == "tensor(string)") != (spec.input.dtype == "string"):
            raise ConfigError(f"{spec.path}/model.yaml declares input dtype {spec.input.dtype}, and the graph's input "
                              f"{graph_input.name!r} is {graph_input.type}: a graph's string input is `dtype: string`, "
                              "and only a string input is")
        outputs = [o.name for o in self.session.get_outputs()]
        self.output_name = pick_output(spec.output.kind, outputs, spec.config.get("output_name"))

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        """One session run over the whole batch; the output keeps the batch axis first."""
        if self.input_dtype is not None and inputs.dtype != self.input_dtype:
            inputs = inputs.astype(self.input_dtype)
        (out,) = self.session.run([self.output_name], {self.input_name: inputs})
        return np.asarray(out)
