"""Every backend on a real model folder built by clipstream/testing/models.py, through ``load_model``."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from clipstream.errors import ConfigError, ModelError
from registry.spec import load_spec
from clipstream.testing.models import (
    CLOCKWORK,
    DIGITS_LABELS,
    digits,
    digits_logreg,
    make_onnx_digits_model,
    make_profile_model,
    make_python_model,
    make_torch_model,
    set_slowdown,
    write_model_yaml,
)
from workers.backends import BatchModel, load_model, warm_up
from workers.backends.devices import CUDA_EP, cuda_usable
from workers.backends.onnx_backend import pick_output
from workers.backends.profile_backend import LatencyProfile

ROOT = Path(__file__).resolve().parents[2]


class Doubler:
    """Regression: twice the sum of the input."""

    def __init__(self, path: Path, config: dict) -> None:
        self.factor = float(config.get("factor", 2.0))

    def predict_batch(self, inputs: np.ndarray) -> np.ndarray:
        return self.factor * inputs.reshape(len(inputs), -1).sum(axis=1)


def test_onnx_round_trip_matches_sklearn(tmp_path: Path) -> None:
    import onnx
    import onnxruntime

    folder = make_onnx_digits_model(tmp_path)
    assert onnx.load(str(folder / "model.onnx")).ir_version <= 8
    model = load_model(load_spec(folder), device="auto")
    assert isinstance(model, BatchModel)
    # CUDA only when a GPU is really usable and this onnxruntime build has the CUDA provider; the
    # GPU build lists that provider even on a machine without a GPU
    on_gpu = cuda_usable() and CUDA_EP in onnxruntime.get_available_providers()
    assert model.device == ("cuda" if on_gpu else "cpu")
    x, _ = digits()
    scores = model.predict_batch(x)
    assert scores.shape == (len(x), len(DIGITS_LABELS)) and scores.dtype == np.float32
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-4)
    np.testing.assert_array_equal(scores.argmax(axis=1), digits_logreg().predict(x))


def test_onnx_label_kind_answers_labels(tmp_path: Path) -> None:
    model = load_model(load_spec(make_onnx_digits_model(tmp_path, kind="label")))
    x, _ = digits()
    np.testing.assert_array_equal(model.predict_batch(x[:50]), digits_logreg().predict(x[:50]))


def _onnx_of_words(folder: Path, dtype: str) -> Path:
    """An ONNX graph whose input is a string tensor: each word's number (0 for any other)."""
    import onnx
    from onnx import TensorProto, helper

    from clipstream.testing.models import ONNX_IR_VERSION, ONNX_ML_OPSET, ONNX_OPSET

    node = helper.make_node("LabelEncoder", ["text"], ["variable"], domain="ai.onnx.ml", keys_strings=["cat", "dog"],
                            values_floats=[1.0, 2.0], default_float=0.0)
    graph = helper.make_graph([node], "words", [helper.make_tensor_value_info("text", TensorProto.STRING, [None])],
                              [helper.make_tensor_value_info("variable", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, ir_version=ONNX_IR_VERSION, opset_imports=[
        helper.make_opsetid("", ONNX_OPSET), helper.make_opsetid("ai.onnx.ml", ONNX_ML_OPSET)])
    write_model_yaml(folder, {"backend": "onnx", "file": "words.onnx", "input": {"dtype": dtype, "shape": []},
                              "output": {"kind": "regression"}})
    onnx.save(model, folder / "words.onnx")
    return folder


def test_an_onnx_string_input_takes_the_batch_of_str(tmp_path: Path) -> None:
    model = load_model(load_spec(_onnx_of_words(tmp_path / "words", "string")))
    assert warm_up(model) is None  # no example: an empty string is no input to try a model of text on
    (tmp_path / "words" / "example.txt").write_text("dog")
    config = yaml.safe_load((tmp_path / "words" / "model.yaml").read_text())
    write_model_yaml(tmp_path / "words", {**config, "example": "example.txt"})
    assert warm_up(load_model(load_spec(tmp_path / "words"))).tolist() == [2.0]
    with pytest.raises(ConfigError, match=r"declares input shape \[1\], and the graph's input 'text' is \[None\]: "
                                          r"declare `shape: \[\]`"):
        write_model_yaml(tmp_path / "words", {**config, "input": {"dtype": "string", "shape": [1]}})
        load_model(load_spec(tmp_path / "words"))
    assert model.predict_batch(np.array(["dog", "cat", "emu"], dtype=object)).tolist() == [2.0, 1.0, 0.0]
    for dtype in ("bytes", "float32"):  # the graph's string input is declared as one, and only it is
        with pytest.raises(ConfigError, match=f"declares input dtype {dtype}, and the graph's input 'text' is "
                                              r"tensor\(string\)"):
            load_model(load_spec(_onnx_of_words(tmp_path / dtype, dtype)))
    with pytest.raises(ConfigError, match=r"declares input dtype string, and the graph's input .* is tensor\(float\)"):
        spec = load_spec(make_onnx_digits_model(tmp_path / "digits"))
        load_model(dataclasses.replace(spec, input=dataclasses.replace(spec.input, dtype="string")))


def _with_device(folder: Path, device: str) -> Path:
    config = yaml.safe_load((folder / "model.yaml").read_text())
    write_model_yaml(folder, {**config, "device": device})
    return folder


def test_a_models_own_device_wins_over_the_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.backends as backends

    monkeypatch.setattr(backends, "cuda_usable", lambda: True)  # as on a GPU machine: the worker's auto means CUDA
    small = load_model(load_spec(_with_device(make_onnx_digits_model(tmp_path / "small"), "cpu")), device="cuda")
    assert small.device == "cpu"
    x, _ = digits()
    np.testing.assert_array_equal(small.predict_batch(x[:8]).argmax(axis=1), digits_logreg().predict(x[:8]))

    monkeypatch.setattr(backends, "cuda_usable", lambda: False)
    needs_gpu = load_spec(_with_device(make_onnx_digits_model(tmp_path / "big"), "cuda"))
    assert needs_gpu.device == "cuda"
    with pytest.raises(ConfigError, match=r"big/logreg/1/model.yaml: device cuda was requested but no usable CUDA "
                                          r"device was found: run its workers where one is, or set `device: auto`"):
        load_model(needs_gpu, device="cpu")


def test_device_is_for_the_gpu_capable_backends(tmp_path: Path) -> None:
    folder = make_python_model(tmp_path, "py", "class Model:\n    pass\n", labels=[0, 1])
    with pytest.raises(ConfigError, match="device is for onnx and torch models; a python model picks its own"):
        load_spec(_with_device(folder, "cuda"))
    assert load_spec(_with_device(folder, "auto")).device == "auto"
    with pytest.raises(ConfigError, match="device must be one of auto, cpu, cuda, got 'gpu'"):
        load_spec(_with_device(folder, "gpu"))


def test_pick_output() -> None:
    assert pick_output("class_scores", ["label", "probabilities"]) == "probabilities"
    assert pick_output("label", ["label", "probabilities"]) == "label"
    assert pick_output("class_scores", ["label", "p"]) == "p"
    assert pick_output("regression", ["y"]) == "y"
    with pytest.raises(ConfigError):
        pick_output("label", ["label"], requested="nope")


def test_onnx_threads_do_not_spin_unless_model_yaml_allows_it(tmp_path: Path) -> None:
    entry = "session.intra_op.allow_spinning"
    quiet = load_model(load_spec(make_onnx_digits_model(tmp_path, "quiet")))
    assert quiet.session.get_session_options().get_session_config_entry(entry) == "0"
    folder = make_onnx_digits_model(tmp_path, "spinning")
    config = yaml.safe_load((folder / "model.yaml").read_text())
    write_model_yaml(folder, {**config, "allow_spinning": True})
    spinning = load_model(load_spec(folder))
    assert spinning.session.get_session_options().get_session_config_entry(entry) == "1"
    write_model_yaml(folder, {**config, "allow_spinning": "sometimes"})
    with pytest.raises(ConfigError, match="allow_spinning"):
        load_model(load_spec(folder))


@pytest.mark.parametrize(("allowed", "policy"), [(False, "PASSIVE"), (True, None)])
def test_a_torch_model_loads_openmp_with_sleeping_threads_unless_spinning_is_allowed(
    tmp_path: Path, allowed: bool, policy: str | None
) -> None:
    pytest.importorskip("torch")
    folder = make_torch_model(tmp_path)
    config = yaml.safe_load((folder / "model.yaml").read_text())
    write_model_yaml(folder, {**config, "allow_spinning": allowed})
    script = (
        "import os, sys\n"
        "from registry.spec import load_spec\n"
        "from workers.backends import load_model\n"
        "assert 'torch' not in sys.modules\n"
        f"model = load_model(load_spec({str(folder)!r}), device='cpu')\n"
        "assert model.predict_batch(__import__('numpy').zeros((3, 64), 'float32')).shape == (3, 10)\n"
        "print(os.environ.get('OMP_WAIT_POLICY'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == str(policy)


def test_torch_torchscript(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import warnings

    warnings.simplefilter("ignore", FutureWarning)
    folder = make_torch_model(tmp_path)
    model = load_model(load_spec(folder), device="cpu")
    x, _ = digits()
    out = model.predict_batch(x[:7])
    assert out.shape == (7, 10) and model.device == "cpu"
    with torch.inference_mode():
        ref = torch.jit.load(str(folder / "model.pt"))(torch.from_numpy(x[:7])).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_torch_export_program_matches_torchscript(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    scripted = load_model(load_spec(make_torch_model(tmp_path, "ts")), device="cpu")
    exported = load_model(load_spec(make_torch_model(tmp_path, "ex", fmt="export")), device="cpu")
    x, _ = digits()
    for n in (1, 5):  # the batch axis is dynamic
        np.testing.assert_allclose(exported.predict_batch(x[:n]), scripted.predict_batch(x[:n]), rtol=1e-5)


def test_python_backend_from_class(tmp_path: Path) -> None:
    folder = make_python_model(tmp_path, "doubler", Doubler, shape=[3], extra={"factor": 3})
    model = load_model(load_spec(folder))
    out = model.predict_batch(np.ones((4, 3), dtype=np.float32))
    np.testing.assert_allclose(out, [9.0] * 4)
    assert warm_up(model).shape == (1,)


def test_python_backend_same_module_name_in_two_folders(tmp_path: Path) -> None:
    src = "import numpy as np\nclass Model:\n    def __init__(self, path, config): pass\n" \
          "    def predict_batch(self, x): return np.full(len(x), {v})\n"
    a = make_python_model(tmp_path / "a", "same", src.format(v=1.0), shape=[1])
    b = make_python_model(tmp_path / "b", "same", src.format(v=2.0), shape=[1])
    ma, mb = load_model(load_spec(a)), load_model(load_spec(b))
    x = np.zeros((2, 1), dtype=np.float32)
    assert ma.predict_batch(x).tolist() == [1.0, 1.0]
    assert mb.predict_batch(x).tolist() == [2.0, 2.0]


def test_python_backend_errors(tmp_path: Path) -> None:
    broken = make_python_model(tmp_path, "broken", "raise RuntimeError('boom')\n")
    with pytest.raises(ModelError, match="boom"):
        load_model(load_spec(broken))
    nomethod = make_python_model(tmp_path, "nomethod", "class Model:\n    def __init__(self, p, c): pass\n")
    with pytest.raises(ConfigError, match="predict_batch"):
        load_model(load_spec(nomethod))


def test_a_class_written_to_another_contract_is_told_this_one(tmp_path: Path) -> None:
    mlserver_style = make_python_model(tmp_path, "mls", "class Model:\n    async def load(self): pass\n"
                                                           "    async def predict(self, payload): pass\n")
    with pytest.raises(ModelError, match=r"takes no arguments\. A python model is built as Class\(folder, config\)"):
        load_model(load_spec(mlserver_style))
    asynchronous = make_python_model(tmp_path, "asy", "class Model:\n    def __init__(self, p, c): pass\n"
                                                        "    async def predict_batch(self, x): return x\n")
    with pytest.raises(ConfigError, match="predict_batch is `async def`: .* Make it a plain `def`"):
        load_model(load_spec(asynchronous))


def test_latency_profile_interpolates_and_extrapolates() -> None:
    p = LatencyProfile(CLOCKWORK)
    assert p.latency_ms(1) == pytest.approx(2.61)
    assert p.latency_ms(16) == pytest.approx(15.67)
    assert p.latency_ms(3) == pytest.approx((3.78 + 5.61) / 2)
    assert p.latency_ms(12) == pytest.approx((9.13 + 15.67) / 2)
    assert p.latency_ms(32) == pytest.approx(15.67 + 16 * (15.67 - 9.13) / 8)
    svm = LatencyProfile.linear(5.0, 0.05)
    assert svm.latency_ms(1) == pytest.approx(5.05) and svm.latency_ms(100) == pytest.approx(10.0)
    assert LatencyProfile({4: 7.0}).latency_ms(9) == 7.0
    with pytest.raises(ConfigError):
        LatencyProfile({})


def test_profile_model_sleeps_its_table_and_answers_deterministically(tmp_path: Path) -> None:
    import time

    folder = make_profile_model(tmp_path, speed=2.0)
    model = load_model(load_spec(folder))
    x, _ = digits()
    start = time.perf_counter()
    out = model.predict_batch(x[:8])
    elapsed = time.perf_counter() - start
    assert model.last_sleep_s == pytest.approx(CLOCKWORK[8] / 1000 / 2)
    assert elapsed >= model.last_sleep_s * 0.9  # it really waited (never asserts an upper bound)
    assert out.shape == (8, 10)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)
    again = load_model(load_spec(folder)).compute(x[:8])
    np.testing.assert_array_equal(out, again)


def test_profile_slowdown_is_read_at_run_time(tmp_path: Path) -> None:
    folder = make_profile_model(tmp_path, fixed_ms=5.0, per_item_ms=0.05)
    model = load_model(load_spec(folder))
    assert model.service_time_s(10) == pytest.approx(0.0055)
    set_slowdown(folder, 2)
    assert model.service_time_s(10) == pytest.approx(0.011)
    set_slowdown(folder, 1)
    assert model.service_time_s(10) == pytest.approx(0.0055)


def test_profile_label_and_regression_kinds(tmp_path: Path) -> None:
    lab = load_model(load_spec(make_profile_model(tmp_path, "lab", kind="label", labels=[3, 5, 7], table={1: 0.0})))
    out = lab.predict_batch(np.ones((4, 64), dtype=np.float32))
    assert out.shape == (4,) and set(out.tolist()) <= {3, 5, 7}
    reg = load_model(load_spec(make_profile_model(tmp_path, "reg", kind="regression", table={1: 0.0})))
    assert reg.predict_batch(np.ones((2, 64), dtype=np.float32)).shape == (2,)


def _joblib_model(root: Path, name: str, estimator: Any, kind: str, labels: list[Any] | None = None,
                  dtype: str = "float32", shape: list[int] | None = None) -> Path:
    import joblib

    folder = root / name / "1"
    folder.mkdir(parents=True)
    joblib.dump(estimator, folder / "model.joblib")
    output: dict[str, Any] = {"kind": kind, **({"labels": labels} if labels is not None else {})}
    return write_model_yaml(folder, {"backend": "sklearn", "file": "model.joblib", "output": output,
                                     "input": {"dtype": dtype, "shape": [64] if shape is None else shape}})


def test_an_sklearn_estimator_is_served_from_its_joblib_file_without_a_class(tmp_path: Path) -> None:
    from sklearn.linear_model import LinearRegression

    x, y = digits()
    logreg = digits_logreg()
    scores = load_model(load_spec(_joblib_model(tmp_path, "p", logreg, "class_scores", list(range(10)))))
    np.testing.assert_allclose(scores.predict_batch(x[:5]), logreg.predict_proba(x[:5]), rtol=1e-6)
    assert warm_up(scores).shape == (1, 10)
    labels = load_model(load_spec(_joblib_model(tmp_path, "l", logreg, "label")))
    assert labels.predict_batch(x[:5]).tolist() == logreg.predict(x[:5]).tolist()
    linear = LinearRegression().fit(x[:200], y[:200].astype(float))
    values = load_model(load_spec(_joblib_model(tmp_path, "r", linear, "regression")))
    np.testing.assert_allclose(values.predict_batch(x[:3]), linear.predict(x[:3]))


def test_an_sklearn_pipeline_of_text_takes_its_strings(tmp_path: Path) -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    texts, ys = ["good fun", "great film", "bad plot", "awful acting"] * 5, ["pos", "pos", "neg", "neg"] * 5
    pipe = make_pipeline(TfidfVectorizer(), LogisticRegression()).fit(texts, ys)
    for shape in ([], [1]):  # one string per query, or skl2onnx's [1]
        model = load_model(load_spec(_joblib_model(tmp_path / str(len(shape)), "t", pipe, "class_scores",
                                                   ["neg", "pos"], dtype="string", shape=shape)))
        rows = np.array(["great fun", "awful plot"], dtype=object).reshape(2, *shape)
        np.testing.assert_allclose(model.predict_batch(rows), pipe.predict_proba(["great fun", "awful plot"]))


def test_an_sklearn_model_that_does_not_fit_its_model_yaml_is_refused_saying_what_to_write(tmp_path: Path) -> None:
    from sklearn.linear_model import LinearRegression

    x, y = digits()
    with pytest.raises(ConfigError, match=r"output.labels \[9, 8.*\] are not the estimator's classes_ \[0, 1, 2"):
        load_model(load_spec(_joblib_model(tmp_path, "a", digits_logreg(), "class_scores", list(range(9, -1, -1)))))
    linear = LinearRegression().fit(x[:50], y[:50].astype(float))
    with pytest.raises(ConfigError, match="a LinearRegression has no predict_proba, .* use kind: label"):
        load_model(load_spec(_joblib_model(tmp_path, "b", linear, "class_scores", [0, 1])))
    from sklearn.linear_model import LogisticRegression

    named = LogisticRegression(max_iter=2000).fit(x[:100], np.where(y[:100] > 4, "high", "low"))
    with pytest.raises(ConfigError, match="classes are named .* use kind: class_scores with those names as labels"):
        load_model(load_spec(_joblib_model(tmp_path, "c", named, "label")))
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    unnamed = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(x[:100, :4], y[:100] % 3)
    with pytest.raises(ConfigError, match=r"the Pipeline was fitted on 4 features, and input.shape \[5\] gives 5 "
                                          r"values per example: set shape: \[4\]"):
        load_model(load_spec(_joblib_model(tmp_path, "e", unnamed, "class_scores", [0, 1, 2], shape=[5])))
    (tmp_path / "d" / "1").mkdir(parents=True)
    (tmp_path / "d" / "1" / "model.joblib").write_bytes(b"not a joblib file")
    write_model_yaml(tmp_path / "d" / "1", {"backend": "sklearn", "file": "model.joblib",
                                            "input": {"dtype": "float32", "shape": [64]}, "output": {"kind": "label"}})
    with pytest.raises(ModelError, match="cannot load .*model.joblib with joblib"):
        load_model(load_spec(tmp_path / "d" / "1"))


def test_an_estimator_fitted_on_named_columns_takes_them_in_order_without_a_warning_per_batch(tmp_path: Path) -> None:
    import warnings

    from sklearn.linear_model import LogisticRegression

    x, y = digits()
    fitted = LogisticRegression(max_iter=2000).fit(x[:300, :4], y[:300] % 2)
    fitted.feature_names_in_ = np.array(["age", "income", "score", "visits"], dtype=object)  # as a DataFrame leaves it
    model = load_model(load_spec(_joblib_model(tmp_path, "t", fitted, "class_scores", [0, 1], shape=[4])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", append=True)  # after the model's own filters: shown every time
        np.testing.assert_allclose(model.predict_batch(x[:5, :4]), fitted.predict_proba(x[:5, :4]), rtol=1e-6)
    assert not [w for w in caught if "feature names" in str(w.message)], [str(w.message) for w in caught]
    with pytest.raises(ConfigError, match=r"fitted on 4 columns \(\['age', 'income', 'score', 'visits'\]\), and "
                                          r"input.shape \[3\] gives 3 values per example: set shape: \[4\]"):
        load_model(load_spec(_joblib_model(tmp_path / "narrow", "t", fitted, "class_scores", [0, 1], shape=[3])))
