"""A program compiled for a GPU (device "cuda"), and the backend that makes it.

Called with arrays, it takes device arrays (CuPy; PyTorch or JAX through
`__cuda_array_interface__` or DLPack, without a copy) or host values (converted by the rule of
`accy.backends.arguments`, then copied to the device); device arrays are checked by the same
rule's `check_array`, so a call is accepted or refused alike on every device. Results are fresh
CuPy arrays from CuPy's memory pool, one per output, computed on the current CuPy stream (a call
returns as soon as the graph is launched). bf16 arrays are CuPy `ml_dtypes.bfloat16` arrays on
both sides (CuPy 14 with ml_dtypes; a PyTorch bf16 CUDA tensor comes in through DLPack); with a
CuPy that lacks bfloat16 they are `uint16` arrays of the same bits. f16 arrays are float16. Raw
buffers (`run_buffers`, `bind`) are handled by `accy.backends.cuda.arrays`.
"""

from __future__ import annotations

import functools
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


@functools.cache
def cupy_has_bfloat16() -> bool:
    """Whether this CuPy makes `ml_dtypes.bfloat16` arrays (CuPy 14 with ml_dtypes installed)."""
    try:
        cupy_module().empty(1, bf16.numpy)
    except (TypeError, ValueError, NotImplementedError):
        return False
    return True


def device_dtype(t: TensorType) -> np.dtype:
    """The dtype of the device arrays that hold `t`: its held dtype, or for bf16 on a CuPy
    without bfloat16, the uint16 bit patterns."""
    if t.dtype == bf16 and not cupy_has_bfloat16():
        return np.dtype(np.uint16)
    return held_dtype(t)


def device_argument(value: Any, t: TensorType, at: str):
    """`value` as a contiguous device array of `t` (`device_dtype`)."""
    cupy = cupy_module()
    if on_device(value):
        array = as_cupy(value, at)
        check_array(array.dtype, array.shape, t, at)
        return cupy.ascontiguousarray(array)
    host = host_array(value, t, at)
    return cupy.asarray(host.view(device_dtype(t)))


class CudaExecutable(Executable):
    """A compiled program loaded on GPU `ordinal`: one graph launch per call."""

    device = "cuda"

    def __init__(self, compiled: CompiledFragment, ordinal: int = 0, precision: str = "f32"):
        super().__init__(compiled.program)
        self.compiled = compiled
        self.fragment = CudaFragment(compiled, ordinal, tf32=precision == "tf32")
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
    expected = [(t.extents, held_dtype(t)) for t in types]
    shapes = [(t.extents, device_dtype(t)) for t in output_types]

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
        artifact = compile_artifact(self, program, options.kernel_call_registry)
        # The precision of f32 GEMMs is chosen when cuBLAS calls are captured, not in the code.
        return CudaExecutable(artifact, 0, options.precision)


register_backend(CudaBackend())

__all__ = ["CudaBackend", "CudaExecutable", "cupy_has_bfloat16", "device_argument", "device_dtype"]
