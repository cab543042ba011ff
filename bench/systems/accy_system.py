"""accy: `accy.compile(value_and_grad(loss), device)`, or the reference evaluator until the
native backend exists (reported as backend "reference")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import accy
from bench.workloads import Workload

from .memory import DeviceMemory

Step = Callable[..., list[Any]]


def has_compiler() -> bool:
    """True when `accy.compile` (the native backends) exists in this build of accy."""
    return callable(getattr(accy, "compile", None))


def backend(device: str, dtype: str = "f32") -> str:
    return "native" if has_compiler() else "reference"


def device_inputs(workload: Workload, arrays: Sequence[np.ndarray], device: str) -> list[Any]:
    if device == "cuda" and has_compiler():
        return [device_array(a) for a in arrays]
    return list(arrays)


def device_array(array: np.ndarray) -> Any:
    """A CuPy copy of `array`; bf16 as CuPy's `ml_dtypes.bfloat16` arrays (CuPy 14 with
    ml_dtypes), else as the uint16 bit patterns accy's CUDA backend then takes."""
    import cupy

    if array.dtype == accy.bf16.numpy:
        from accy.backends.cuda.executable import cupy_has_bfloat16

        if not cupy_has_bfloat16():
            return cupy.asarray(array.view(np.uint16))
    return cupy.asarray(array)


def build(workload: Workload, scale: str, device: str, dtype: str = "f32") -> Step:
    """Trace, differentiate and compile the workload's value_and_grad program."""
    program = workload.value_and_grad(scale, dtype)
    if not has_compiler():
        return lambda *arrays: accy.reference.run(program, arrays)
    compiled = accy.compile(program, device=device)
    if device != "cuda":
        return compiled
    import cupy

    def synchronized(*arrays: Any) -> list[Any]:
        outputs = compiled(*arrays)
        cupy.cuda.Device().synchronize()  # every stream: accy may launch on its own
        return outputs

    return synchronized


def to_numpy(outputs: Sequence[Any]) -> list[np.ndarray]:
    return [_host(a) for a in outputs]


def _host(array: Any) -> np.ndarray:
    get = getattr(array, "get", None)  # a CuPy array
    host = np.asarray(get() if callable(get) else array)
    # bf16 from a CuPy without bfloat16 comes back as uint16 bit patterns (no workload has an
    # integer output).
    return host.view(accy.bf16.numpy) if host.dtype == np.uint16 else host


def device_memory() -> DeviceMemory | None:
    """Peak bytes handed out by CuPy's memory pool (where accy's CUDA buffers come from)."""
    if not has_compiler():
        return None
    from .cupy_memory import CupyPoolPeak

    return CupyPoolPeak()
