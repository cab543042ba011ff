"""`accy.compile(program, device="cuda")`: a program as a function of arrays on the GPU.

Arguments are device arrays (CuPy; PyTorch or JAX through `__cuda_array_interface__` or
DLPack, without a copy) or host arrays (copied to the device); results are fresh CuPy arrays
from CuPy's memory pool, one per output, computed on the current CuPy stream (a call returns as
soon as the graph is launched). As on the CPU, an array must have the parameter's dtype and
extents, and bf16 values are float32 arrays on both sides.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ...api_compile import as_argument
from ...core import Program
from ...core.types import TensorType, bf16
from ...errors import InvalidInput
from ...lower.fragment import FragmentCompilerOptions, compile_fragment
from .arrays import as_cupy, on_device
from .runtime import CudaFragment, cupy_module

_fragments: dict[tuple[int, int], tuple[weakref.ref, CudaFragment]] = {}
_lock = threading.Lock()


def fragment_for(program: Program, kernel_call_registry: Any = None) -> CudaFragment:
    """The loaded CUDA fragment of `program`, compiled on first use and remembered while the
    program object lives."""
    from ...gpu.cuda import State

    key = (id(program), id(kernel_call_registry))
    with _lock:
        entry = _fragments.get(key)
        if entry is not None and entry[0]() is program:
            return entry[1]
    handle = State.init_device(0).handle()
    options = FragmentCompilerOptions("cuda_ptx", kernel_call_registry)
    from ...executable import load_fragment

    fragment = load_fragment(handle, compile_fragment(handle, program, options), options)
    with _lock:
        _fragments[key] = (weakref.ref(program, _forgetter(key)), fragment)
    return fragment


def _forgetter(key: tuple[int, int]):
    table = _fragments

    def forget(reference: weakref.ref) -> None:
        entry = table.get(key)
        if entry is not None and entry[0] is reference:
            del table[key]

    return forget


def to_bf16_bits(cupy, values):
    """float32 device values as bf16 bit patterns (round to nearest even; NaN stays NaN)."""
    bits = values.view(cupy.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(cupy.uint16)
    quiet = ((bits >> 16) | 0x40).astype(cupy.uint16)
    return cupy.where(cupy.isnan(values), quiet, rounded)


def from_bf16_bits(cupy, bits):
    return (bits.astype(cupy.uint32) << 16).view(cupy.float32)


def _held(t: TensorType) -> np.dtype:
    return np.dtype(np.float32) if t.dtype == bf16 else np.dtype(t.dtype.numpy)


def device_argument(value: Any, t: TensorType, where: str):
    """`value` as a contiguous device array in the raw layout of `t` (bf16 as bit patterns)."""
    cupy = cupy_module()
    if not on_device(value):
        return cupy.asarray(as_argument(value, t, where))
    array = as_cupy(value, where)
    if array.dtype != _held(t):
        raise InvalidInput(
            f"{where}: an array of dtype {array.dtype} was given for {t}, which needs "
            f"{_held(t)}; convert it explicitly (accy does not promote dtypes silently)"
        )
    if array.shape != t.extents:
        raise InvalidInput(
            f"{where}: an array of shape {array.shape} was given for {t}, which has shape "
            f"{t.extents} (axes in layout order: {', '.join(t.axes) or 'none, a scalar'})"
        )
    array = cupy.ascontiguousarray(array)
    return to_bf16_bits(cupy, array) if t.dtype == bf16 else array


def compiled_call(program: Program, kernel_call_registry: Any) -> Callable[..., list[Any]]:
    """The function `accy.compile(program, device="cuda")` returns."""
    cupy = cupy_module()
    fragment = fragment_for(program, kernel_call_registry)
    parameter_types, output_types = program.parameter_types, program.output_types
    expected = [(t, t.extents, None if t.dtype == bf16 else _held(t)) for t in parameter_types]
    shapes = [
        (t.extents, np.dtype(np.uint16) if t.dtype == bf16 else _held(t)) for t in output_types
    ]
    any_bf16 = any(t.dtype == bf16 for t in output_types)

    def argument(value: Any, position: int):
        t, extents, dtype = expected[position]
        if (
            type(value) is cupy.ndarray
            and value.dtype == dtype
            and value.shape == extents
            and value.flags.c_contiguous
        ):
            return value
        return device_argument(value, t, f"program {program.name!r}, argument {position}")

    def call(*arrays: Any) -> list[Any]:
        if len(arrays) != len(expected):
            raise InvalidInput(
                f"program {program.name!r} takes {len(expected)} arrays "
                f"({', '.join(map(str, parameter_types))}), got {len(arrays)}"
            )
        inputs = [argument(a, i) for i, a in enumerate(arrays)]
        outputs = [cupy.empty(extents, dtype) for extents, dtype in shapes]
        fragment.run([a.data.ptr for a in inputs] + [o.data.ptr for o in outputs])
        if any_bf16:
            return [
                from_bf16_bits(cupy, o) if t.dtype == bf16 else o
                for o, t in zip(outputs, output_types, strict=True)
            ]
        return outputs

    return call
