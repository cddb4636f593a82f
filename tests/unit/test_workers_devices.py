"""CUDA selection: decided from availability flags, never from get_available_providers alone."""

from __future__ import annotations

import os
from typing import Any

import pytest

from clipstream.errors import ConfigError
from workers.backends import devices
from workers.backends.devices import (
    CPU_EP,
    CUDA_EP,
    OMP_WAIT_POLICY,
    THREADS_ENV,
    allow_spinning,
    cuda_driver_device_count,
    onnx_providers,
    passive_waits,
    resolve_device,
    thread_count,
)

ALL = ["TensorrtExecutionProvider", CUDA_EP, CPU_EP]


@pytest.mark.parametrize(
    ("requested", "cuda_ok", "expected"),
    [("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("cuda", True, "cuda")],
)
def test_resolve_device(requested: str, cuda_ok: bool, expected: str) -> None:
    assert resolve_device(requested, cuda_ok) == expected


def test_explicit_cuda_without_gpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no usable CUDA"):
        resolve_device("cuda", False)
    with pytest.raises(ConfigError):
        resolve_device("tpu", True)


def test_providers_listed_but_no_gpu_means_cpu_only() -> None:
    # the GPU build lists CUDA even without a GPU: the device decision wins
    assert onnx_providers("cpu", ALL) == [CPU_EP]


def test_providers_on_a_gpu() -> None:
    assert onnx_providers("cuda", ALL) == [CUDA_EP, CPU_EP]
    # a CPU-only onnxruntime build on a GPU machine: CPU, no failed-provider noise
    assert onnx_providers("cuda", [CPU_EP]) == [CPU_EP]


class _Driver:
    """A stand-in for libcuda: ``cuInit``'s status, then ``cuDeviceGetCount``'s status and count."""

    def __init__(self, init: int = 0, status: int = 0, count: int = 0) -> None:
        self.init, self.status, self.count = init, status, count

    def cuInit(self, flags: int) -> int:  # noqa: N802 - the driver's own name
        return self.init

    def cuDeviceGetCount(self, ref: Any) -> int:  # noqa: N802
        ref._obj.value = self.count
        return self.status


def _with_driver(monkeypatch: pytest.MonkeyPatch, driver: object | None) -> int:
    def cdll(name: str) -> object:
        if driver is None:
            raise OSError(f"{name}: cannot open shared object file")
        return driver

    monkeypatch.setattr(devices.ctypes, "CDLL", cdll)
    return cuda_driver_device_count()


def test_driver_probe_reads_the_drivers_count(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _with_driver(monkeypatch, _Driver(count=3)) == 3
    assert _with_driver(monkeypatch, None) == 0  # no driver library
    assert _with_driver(monkeypatch, _Driver(init=100, count=3)) == 0  # cuInit failed: no device
    assert _with_driver(monkeypatch, _Driver(status=1, count=3)) == 0  # the count call failed
    assert _with_driver(monkeypatch, object()) == 0  # a library without the driver's calls


def test_thread_count_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert thread_count({}) is None
    assert thread_count({"threads": 2}) == 2
    monkeypatch.setenv(THREADS_ENV, "3")
    assert thread_count({"threads": 2}) == 3
    assert thread_count({"threads": 2}, override=4) == 4
    with pytest.raises(ConfigError):
        thread_count({}, override=0)
    monkeypatch.delenv(THREADS_ENV)
    with pytest.raises(ConfigError):
        thread_count({"threads": "many"})


def test_spinning_is_off_unless_model_yaml_allows_it() -> None:
    assert allow_spinning({}) is False
    assert allow_spinning({"allow_spinning": True}) is True
    with pytest.raises(ConfigError, match="allow_spinning"):
        allow_spinning({"allow_spinning": "yes"})


def test_openmp_threads_sleep_unless_spinning_is_allowed_or_the_operator_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(OMP_WAIT_POLICY, raising=False)
    passive_waits({"allow_spinning": True})
    assert OMP_WAIT_POLICY not in os.environ
    passive_waits({})
    assert os.environ[OMP_WAIT_POLICY] == "PASSIVE"
    monkeypatch.setenv(OMP_WAIT_POLICY, "ACTIVE")
    passive_waits({})
    assert os.environ[OMP_WAIT_POLICY] == "ACTIVE"
