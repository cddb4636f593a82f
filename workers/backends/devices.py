"""Which device a model runs on: CUDA only when it really works, else the CPU.

``onnxruntime.get_available_providers()`` lists the CUDA provider whenever the GPU build is
installed, GPU or not; asking for it on a machine without one makes onnxruntime log errors
and fall back. So we ask the CUDA driver itself (or torch, when it is already loaded) and then
choose providers explicitly. The decision is a pure function of availability flags so that
it can be tested on any machine.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from clipstream.errors import ConfigError

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"
THREADS_ENV = "CLIPSTREAM_WORKER_THREADS"
# OpenMP (torch, and the numeric libraries a python model may load) reads it once, at load time
OMP_WAIT_POLICY = "OMP_WAIT_POLICY"

_DRIVER_LIBS = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


def cuda_driver_device_count() -> int:
    """GPUs the CUDA driver can open (0 when there is no driver or no device)."""
    for name in _DRIVER_LIBS:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if lib.cuInit(0) != 0:
                return 0
            count = ctypes.c_int(0)
            if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
                return 0
            return int(count.value)
        except (AttributeError, OSError):
            return 0
    return 0


@functools.cache
def cuda_usable() -> bool:
    """True only when a CUDA device can really be used by this process.

    torch is asked only if something already imported it (importing it costs seconds);
    otherwise the driver is asked directly through ctypes.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return bool(torch.cuda.is_available())
        except Exception:  # a broken CUDA install must not stop a CPU worker
            return False
    return cuda_driver_device_count() > 0


def resolve_device(requested: str, cuda_ok: bool) -> str:
    """``auto`` -> cuda if usable else cpu; an explicit ``cuda`` without a GPU is a ConfigError."""
    if requested == "auto":
        return "cuda" if cuda_ok else "cpu"
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if not cuda_ok:
            raise ConfigError("device cuda was requested but no usable CUDA device was found")
        return "cuda"
    raise ConfigError(f"device must be auto, cpu or cuda, got {requested!r}")


def onnx_providers(device: str, available: Sequence[str]) -> list[str]:
    """The onnxruntime providers for ``device``, given what onnxruntime says it has.

    CPU always comes last so that operators CUDA lacks still run.
    """
    if device == "cuda" and CUDA_EP in available:
        return [CUDA_EP, CPU_EP]
    return [CPU_EP]


def thread_count(config: Mapping[str, Any], override: int | None = None) -> int | None:
    """Intra-op threads: the operator's override, else env, else model.yaml ``threads:``.

    None leaves the framework's default (all cores). Workers sharing a machine should set it.
    """
    if override is not None:
        return _positive(override, "threads")
    env = os.environ.get(THREADS_ENV)
    if env:
        return _positive(env, THREADS_ENV)
    if config.get("threads") is not None:
        return _positive(config["threads"], "model.yaml threads")
    return None


def _positive(value: Any, what: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a positive integer, got {value!r}") from None
    if n < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    return n


def allow_spinning(config: Mapping[str, Any]) -> bool:
    """model.yaml ``allow_spinning:``; off unless asked for.

    A framework's intra-op threads busy-wait after each run by default, which burns the cores
    that the other stages and workers on the same machine need (docs/design/0051).
    """
    value = config.get("allow_spinning", False)
    if not isinstance(value, bool):
        raise ConfigError(f"model.yaml allow_spinning must be true or false, got {value!r}")
    return value


def passive_waits(config: Mapping[str, Any]) -> None:
    """Make OpenMP threads sleep when idle, unless the model allows spinning or the operator set it.

    It must run before the first OpenMP library loads; one already loaded keeps its policy.
    """
    if not allow_spinning(config):
        os.environ.setdefault(OMP_WAIT_POLICY, "PASSIVE")
