"""The CUDA path where a GPU exists: ``device: auto`` puts a torch model on it and the answers
match the CPU's. Skipped on a machine without a usable CUDA device, such as CI's."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from clipstream.testing.models import digits, make_torch_model, write_model_yaml
from registry.spec import load_spec
from workers.backends import load_model
from workers.backends.devices import cuda_usable

pytestmark = pytest.mark.skipif(not cuda_usable(), reason="no usable CUDA device on this machine")


@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_auto_runs_a_torch_model_on_the_gpu_with_the_cpus_answers(tmp_path: Path, fmt: str) -> None:
    pytest.importorskip("torch")
    warnings.simplefilter("ignore", FutureWarning)
    folder = make_torch_model(tmp_path, fmt=fmt)
    gpu = load_model(load_spec(folder), device="auto")
    cpu = load_model(load_spec(folder), device="cpu")
    assert gpu.device == "cuda"
    assert all(p.is_cuda for p in gpu.module.parameters())  # type: ignore[attr-defined]
    x, _ = digits()
    for n in (1, 33):
        out = gpu.predict_batch(x[:n])
        assert isinstance(out, np.ndarray) and out.shape == (n, 10)  # back on the host
        np.testing.assert_allclose(out, cpu.predict_batch(x[:n]), rtol=1e-4, atol=1e-6)


def test_an_explicit_cuda_device_is_honoured(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model = load_model(load_spec(make_torch_model(tmp_path)), device="cuda")
    assert model.device == "cuda"
    assert model.predict_batch(np.zeros((4, 64), np.float32)).shape == (4, 10)


def test_a_model_yaml_device_cpu_keeps_a_model_off_the_gpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    folder = make_torch_model(tmp_path)
    write_model_yaml(folder, {**yaml.safe_load((folder / "model.yaml").read_text()), "device": "cpu"})
    model = load_model(load_spec(folder), device="auto")
    assert model.device == "cpu"
    assert not any(p.is_cuda for p in model.module.parameters())  # type: ignore[attr-defined]
