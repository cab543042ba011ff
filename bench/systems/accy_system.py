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


def backend(device: str) -> str:
    return "native" if has_compiler() else "reference"


def device_inputs(workload: Workload, arrays: Sequence[np.ndarray], device: str) -> list[Any]:
    if device == "cuda" and has_compiler():
        import cupy

        return [cupy.asarray(a) for a in arrays]
    return list(arrays)


def build(workload: Workload, scale: str, device: str) -> Step:
    """Trace, differentiate and compile the workload's value_and_grad program."""
    program = workload.value_and_grad(scale)
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
    return np.asarray(get() if callable(get) else array)


def device_memory() -> DeviceMemory | None:
    """Peak bytes handed out by CuPy's memory pool (where accy's CUDA buffers come from)."""
    if not has_compiler():
        return None
    from .cupy_memory import CupyPoolPeak

    return CupyPoolPeak()
