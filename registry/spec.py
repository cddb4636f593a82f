"""``model.yaml``: what a model folder declares (backend, input, output).

This is the contract between a model's author and every stage: the worker checks inputs
against ``input``, the selector reads ``output`` to combine answers.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clipstream.errors import ClipstreamError, ConfigError, DecodeError, InputError
from clipstream.yamlfile import read_mapping
from schemas.records import OutputKind
from schemas.tensor import DTYPES, VARIABLE, dtype_name

BACKENDS = ("onnx", "torch", "python", "sklearn", "profile")


def not_finite(array: np.ndarray) -> bool:
    """Whether a float array holds a NaN or an infinity: no answer can be scored against one,
    and JSON carries neither (an output of NaN would read as null)."""
    return array.dtype.kind == "f" and bool(array.size) and not np.isfinite(array).all()


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: tuple[int, ...]

    def check(self, array: np.ndarray, finite: bool = False) -> None:
        """Raise InputError unless ``array`` is one example of this spec; ``finite``: with only
        finite numbers, as JSON can carry (where an input enters from a Kafka client, so that
        a NaN is refused as the caller's, not answered as the model's failure)."""
        try:
            name = dtype_name(array)
        except DecodeError as exc:
            raise InputError(f"input {exc}; the model takes {self.dtype}") from None
        if name != self.dtype:
            raise InputError(f"input dtype {name} does not match the model's {self.dtype}")
        if tuple(array.shape) != self.shape:
            raise InputError(
                f"input shape {list(array.shape)} does not match the model's {list(self.shape)}"
            )
        if finite and not_finite(array):
            raise InputError("input has values that are not finite numbers (NaN or infinity)")


@dataclass(frozen=True)
class OutputSpec:
    kind: OutputKind
    labels: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class ModelSpec:
    path: Path
    backend: str
    input: TensorSpec
    output: OutputSpec
    file: str | None = None
    cls: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    device: str | None = None  # where the model runs, over the worker's default (onnx and torch)
    example: str | None = None  # a file in the folder holding one real input, for the start's check


def load_spec(folder: str | Path) -> ModelSpec:
    """Read and validate ``<folder>/model.yaml``; every problem is a ConfigError naming the field."""
    folder = Path(folder).resolve()
    path = folder / "model.yaml"
    raw = read_mapping(path, missing_hint=": a model folder needs a model.yaml")
    spec = parse_spec(raw, folder, path)
    for key, name in (("file", spec.file), ("example", spec.example)):
        if name and not (folder / name).is_file():
            raise ConfigError(f"{path}: {key} {name!r} is not in {folder}")
    return spec


def example_input(spec: ModelSpec, rows: int) -> np.ndarray | None:
    """``rows`` copies of the model's ``example`` (a ``.npy`` array of one input, a ``.json``
    one as nested lists, or, for a ``string`` or ``bytes`` input of one element, the file's
    contents), or zeros; None for a
    ``string`` or ``bytes`` input without one: an empty string is no input a model of text or
    encoded images need take, so such a model is not tried on it."""
    if spec.example is None:
        return None if spec.input.dtype in VARIABLE else np.zeros((rows, *spec.input.shape), spec.input.dtype)
    path = spec.path / spec.example
    try:
        if path.suffix == ".npy":
            one = np.load(path, allow_pickle=False)
        elif path.suffix == ".json":  # text of several elements, which .npy holds only as pickles
            one = _json_input(json.loads(path.read_text()), spec.input.dtype)
        elif spec.input.dtype in VARIABLE and int(np.prod(spec.input.shape)) == 1:
            raw = path.read_bytes()
            one = np.empty(1, dtype=object)
            one[0] = raw.decode() if spec.input.dtype == "string" else raw
            one = one.reshape(spec.input.shape)
        else:
            raise ConfigError("a model of numbers takes its example as a .npy file (numpy.save) or a .json file of "
                              "one input")
        spec.input.check(one)
    except (OSError, ValueError, TypeError, ClipstreamError) as exc:
        raise ConfigError(f"{spec.path}/model.yaml: example {spec.example!r} is not one input of the model: "
                          f"{exc}") from None
    return np.stack([one] * rows)


def _json_input(values: Any, dtype: str) -> np.ndarray:
    """One input written as JSON: numbers, or strings (UTF-8 bytes for a ``bytes`` input)."""
    if dtype not in VARIABLE:
        return np.asarray(values, dtype=dtype)
    one = np.array(values, dtype=object)
    if dtype == "bytes":
        one = np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(one)
    return one


# the keys clipstream itself reads; a python model's class may read any others (``config``)
KNOWN_KEYS = ("backend", "input", "output", "file", "class", "output_name", "threads", "allow_spinning", "device",
              "example")
DEVICES = ("auto", "cpu", "cuda")
# the app file's serving knobs, and MLServer's and Triton's names for them: never a model's own
SERVING_KEYS = ("replicas", "max_batch_size", "batch_delay_ms", "latency_objective_ms", "max_batch_time",
                "max_queue_delay_microseconds", "dynamic_batching", "instance_group", "parallel_workers")


SERVING_HINT = ("`{}` is not read from model.yaml: how a model is served (replicas, max_batch_size, "
                "batch_delay_ms, latency_objective_ms) goes in its entry of the app file, then `clipstream apply -f "
                "FILE` (replicas also: `clipstream set-replicas`)")


def _misspelt(keys: Any, known: tuple[str, ...], where: str, after: Callable[[str], str] = lambda _: "") -> None:
    """Refuse a key that is a near miss of a known one the mapping lacks (``ouptut``,
    ``allow_spinnig``, ``Input``): read as given, the known one would silently take its
    default. ``after(meant)``: what to add about the key meant."""
    for key in keys:
        lower = str(key).lower()
        close = [lower] if lower in known else difflib.get_close_matches(lower, known, n=1, cutoff=0.8)
        if key not in known and close and close[0] not in keys:
            raise ConfigError(f"{where}: unknown key `{key}`: did you mean `{close[0]}`?{after(close[0])}")


def parse_spec(raw: dict[str, Any], folder: Path, path: str | Path) -> ModelSpec:
    """Validate a ``model.yaml`` mapping read from ``path`` (a file, or a URL in a model
    repository); ``folder`` is where the model's files are, or will be, on this host."""
    _misspelt(raw, KNOWN_KEYS + SERVING_KEYS, str(path),
              lambda meant: f" {SERVING_HINT.format(meant)}" if meant in SERVING_KEYS else "")
    serving = [k for k in SERVING_KEYS if k in raw]
    if serving:  # MLServer and Triton keep batching in the model's settings; here the app file does
        raise ConfigError(f"{path}: {SERVING_HINT.format(serving[0])}")
    for part, keys in (("input", ("dtype", "shape")), ("output", ("kind", "labels"))):
        extra = [k for k in (raw.get(part) or {}) if k not in keys] if isinstance(raw.get(part), dict) else []
        if extra:
            raise ConfigError(f"{path}: {part} has the unknown key `{extra[0]}`; its keys are {', '.join(keys)}")
    backend = raw.get("backend")
    if backend not in BACKENDS:
        raise ConfigError(f"{path}: backend must be one of {BACKENDS}, got {backend!r}")
    inp = raw.get("input") or {}
    dtype = inp.get("dtype")
    if dtype not in DTYPES:
        raise ConfigError(f"{path}: input.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if dtype in VARIABLE and backend == "torch":
        raise ConfigError(f"{path}: a torch model takes numbers, not input.dtype {dtype}: serve a model of text or "
                          "bytes with the python backend (or onnx, for an ONNX string input)")
    shape = inp.get("shape", [])
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ConfigError(f"{path}: input.shape must be a list of non-negative integers, the shape of one "
                          "example (leave the batch axis out)")
    out = raw.get("output") or {}
    kind = out.get("kind")
    if kind not in ("class_scores", "label", "regression"):
        raise ConfigError(f"{path}: output.kind must be class_scores, label or regression")
    labels = out.get("labels")
    if kind == "class_scores" and not labels:
        raise ConfigError(f"{path}: output.labels is required for class_scores")
    if labels is not None and not isinstance(labels, list):
        raise ConfigError(f"{path}: output.labels must be a list")
    file = raw.get("file")
    if backend in ("onnx", "torch", "sklearn") and not file:
        raise ConfigError(f"{path}: backend {backend} needs `file`" + (" (the estimator saved with joblib.dump)"
                                                                      if backend == "sklearn" else ""))
    cls = raw.get("class")
    if backend == "python" and not cls:
        raise ConfigError(f"{path}: backend python needs `class: package.module:Class`")
    example = raw.get("example")
    if example is not None and not (isinstance(example, str) and example and "/" not in example):
        raise ConfigError(f"{path}: example must name a file in the model's folder, got {example!r}")
    threads = raw.get("threads")
    if threads is not None and (type(threads) is not int or threads < 1):  # refused at deploy, not at load
        raise ConfigError(f"{path}: threads must be a positive integer, got {threads!r}")
    device = raw.get("device")
    if device is not None and device not in DEVICES:
        raise ConfigError(f"{path}: device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device not in (None, "auto") and backend not in ("onnx", "torch"):
        raise ConfigError(f"{path}: device is for onnx and torch models; a {backend} model picks its own")
    return ModelSpec(
        path=folder,
        backend=backend,
        input=TensorSpec(dtype, tuple(shape)),
        output=OutputSpec(kind, tuple(labels) if labels is not None else None),
        file=file,
        cls=cls,
        config=raw,
        device=device,
        example=example,
    )
