"""A program compiled for a GPU (device "cuda"), and the backend that makes it.

Called with arrays, it takes device arrays (CuPy; PyTorch or JAX through
`__cuda_array_interface__` or DLPack, without a copy) or host values (converted by the rule of
`accy.backends.arguments`, then copied to the device); device arrays are checked by the same
rule's `check_array`, so a call is accepted or refused alike on every device. Results are fresh
CuPy arrays from CuPy's memory pool, one per output, computed on the current CuPy stream (a call
returns as soon as the graph is launched); bf16 values are float32 arrays on both sides. Raw
buffers (`run_buffers`, `bind`) are handled by `accy.backends.cuda.arrays`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...core import Program
from ...core.types import TensorType, bf16
from ..arguments import check_array, check_count, held_dtype, host_array, where
from ..base import CompileOptions, Executable, compile_artifact, register_backend
from .arrays import Bindings, as_cupy, invoke, on_device
from .compile import CompiledFragment, compile_program
from .device import open_device
from .runtime import CudaFragment, cupy_module


def to_bf16_bits(cupy, values):
    """float32 device values as bf16 bit patterns (round to nearest even; NaN stays NaN)."""
    bits = values.view(cupy.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(cupy.uint16)
    quiet = ((bits >> 16) | 0x40).astype(cupy.uint16)
    return cupy.where(cupy.isnan(values), quiet, rounded)


def from_bf16_bits(cupy, bits):
    return (bits.astype(cupy.uint32) << 16).view(cupy.float32)


def device_argument(value: Any, t: TensorType, at: str):
    """`value` as a contiguous device array in the raw layout of `t` (bf16 as bit patterns)."""
    cupy = cupy_module()
    if on_device(value):
        array = as_cupy(value, at)
        check_array(array.dtype, array.shape, t, at)
        array = cupy.ascontiguousarray(array)
    else:
        array = cupy.asarray(host_array(value, t, at))
    return to_bf16_bits(cupy, array) if t.dtype == bf16 else array


class CudaExecutable(Executable):
    """A compiled program loaded on GPU `ordinal`: one graph launch per call."""

    device = "cuda"

    def __init__(self, compiled: CompiledFragment, ordinal: int = 0):
        super().__init__(compiled.program)
        self.compiled = compiled
        self.fragment = CudaFragment(compiled, ordinal)
        self._call = _array_call(self.fragment, self.program)

    def __call__(self, *arrays: Any) -> list[Any]:
        return self._call(*arrays)

    def run_buffers(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Check the buffers and run once; host outputs are filled when this returns."""
        invoke(self.fragment, self.layout, inputs, outputs)

    def bind(self, inputs: Sequence[Any]) -> Bindings:
        return Bindings(self.fragment, self.layout, inputs)

    def run(self, addresses: Sequence[int], stream: Any = None) -> None:
        """Run on device buffers at `addresses` (inputs, then outputs), unchecked."""
        self.fragment.run(addresses, stream)


def _array_call(fragment: CudaFragment, program: Program) -> Callable[..., list[Any]]:
    """The function `CudaExecutable.__call__` runs (it holds `fragment`)."""
    cupy = cupy_module()
    name, types, output_types = program.name, program.parameter_types, program.output_types
    expected = [(t.extents, None if t.dtype == bf16 else held_dtype(t)) for t in types]
    shapes = [
        (t.extents, np.dtype(np.uint16) if t.dtype == bf16 else held_dtype(t)) for t in output_types
    ]
    any_bf16 = any(t.dtype == bf16 for t in output_types)

    def argument(value: Any, position: int):
        extents, dtype = expected[position]
        if (
            type(value) is cupy.ndarray
            and value.dtype == dtype
            and value.shape == extents
            and value.flags.c_contiguous
        ):
            return value
        return device_argument(value, types[position], where(name, position))

    def call(*arrays: Any) -> list[Any]:
        check_count(name, types, len(arrays))
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


class CudaBackend:
    """Compiles programs to CUDA C and schedules (no GPU needed), and loads them on a GPU."""

    device = "cuda"
    artifact_format = "cuda_ptx"

    def compile_artifact(
        self, program: Program, kernel_call_registry: Any = None
    ) -> CompiledFragment:
        return compile_program(program, kernel_call_registry)

    def load(self, artifact: CompiledFragment, ordinal: int = 0) -> CudaExecutable:
        return CudaExecutable(artifact, ordinal)

    def compile(self, program: Program, options: CompileOptions) -> CudaExecutable:
        open_device(0)
        return self.load(compile_artifact(self, program, options.kernel_call_registry))


register_backend(CudaBackend())

__all__ = ["CudaBackend", "CudaExecutable", "device_argument", "from_bf16_bits", "to_bf16_bits"]
