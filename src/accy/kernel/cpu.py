"""Running a kernel's C on NumPy arrays through a shared library and ctypes: the test oracle's
other half, and a reference implementation of a custom call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from ..caches import memoized
from ..core.types import DType, TensorType, bf16, bool_, f16
from .errors import KernelCallMismatch
from .ir import RESULT
from .toolchain import load_shared_library


class KernelCall(Protocol):
    """What running a kernel call on the CPU reads of it (`accy.kernel.call.KernelCall` has it
    all; this module sits below that one, which runs its calls through `run_on_cpu`)."""

    symbol: str
    c_source: str
    parameters: tuple[tuple[str, DType], ...]

    @property
    def where(self) -> str: ...

    @property
    def operand_parameters(self) -> tuple[tuple[str, DType], ...]: ...

    @property
    def result_dtype(self) -> DType: ...

    def extent_of(self, parameter: str) -> int: ...

    def check_call(self, operand_types: Sequence[TensorType], result_type: TensorType) -> None: ...


class CpuLibrary:
    """Kernel calls compiled together into one shared library: one translation unit, as the CPU
    backend would include them.

    >>> import numpy as np
    >>> import accy
    >>> from accy.kernel.examples import custom_double_kernel
    >>> call = custom_double_kernel().create_kernel_call_artifact(
    ...     accy.kernel.Limits.testing, None, target="double", version=1).call
    >>> CpuLibrary([call]).run(call, [np.ones(4, np.float32)]).tolist()
    [2.0, 2.0, 2.0, 2.0]
    """

    def __init__(self, calls: Iterable[KernelCall]):
        self.calls = tuple(calls)
        source = "".join(call.c_source for call in self.calls)
        symbols = ", ".join(call.symbol for call in self.calls)
        names = [call.symbol for call in self.calls]
        self._library = load_shared_library(source, f"kernels {symbols}", names)

    def run(
        self,
        call: KernelCall,
        operands: Sequence[np.ndarray],
        result_type: TensorType | None = None,
    ) -> np.ndarray:
        """`call`'s result on `operands` (NumPy arrays, in the order of its operand parameters).

        Without `result_type` the result is 1-D, with the elements the kernel writes.
        """
        arrays = [np.asarray(a) for a in operands]
        types = [_tensor_type(call, name, dtype, a) for (name, dtype), a in _bind(call, arrays)]
        if result_type is None:
            result_type = TensorType(call.result_dtype, (("element", call.extent_of(RESULT)),))
        call.check_call(types, result_type)
        buffers = {
            name: _to_storage(array, t)
            for (name, _), array, t in zip(call.operand_parameters, arrays, types, strict=True)
        }
        buffers[RESULT] = np.zeros(result_type.size, storage_numpy(result_type.dtype))
        function = getattr(self._library, call.symbol)
        function.restype = None
        function(*(buffers[name].ctypes.data_as(ctypes.c_void_p) for name, _ in call.parameters))
        return _from_storage(buffers[RESULT], result_type.dtype).reshape(result_type.extents)


def run_on_cpu(
    call: KernelCall, operands: Sequence[np.ndarray], result_type: TensorType | None = None
) -> np.ndarray:
    """`call`'s result on `operands`, from a library of its own (built once per process)."""
    return _library_of(call).run(call, operands, result_type)


@memoized("custom call cpu libraries", "kernels_max_entries")
def _library_of(call: KernelCall) -> CpuLibrary:
    return CpuLibrary([call])


def _bind(call: KernelCall, arrays: list[np.ndarray]):
    if len(arrays) != len(call.operand_parameters):
        raise KernelCallMismatch(
            f"{call.where} takes {len(call.operand_parameters)} operands, got {len(arrays)} arrays"
        )
    return zip(call.operand_parameters, arrays, strict=True)


def _tensor_type(call: KernelCall, name: str, dtype: DType, array: np.ndarray) -> TensorType:
    # An array of any dtype but the parameter's (ml_dtypes.bfloat16 for bf16) is a mismatch.
    if array.dtype != dtype.numpy:
        raise KernelCallMismatch(
            f"{call.where}: parameter {name!r} is {dtype.name}, but the array is {array.dtype}"
        )
    return TensorType(dtype, tuple((f"axis{k}", n) for k, n in enumerate(array.shape)))


def storage_numpy(dtype: DType) -> np.dtype:
    """The NumPy dtype of a kernel buffer's elements: 16-bit floats as their raw bits, bool as
    one byte.

    >>> import accy
    >>> storage_numpy(accy.f16), storage_numpy(accy.bool_)
    (dtype('uint16'), dtype('uint8'))
    """
    if dtype in (f16, bf16):
        return np.dtype(np.uint16)
    return np.dtype(np.uint8) if dtype == bool_ else np.dtype(dtype.numpy)


def _to_storage(array: np.ndarray, t: TensorType) -> np.ndarray:
    flat = np.ascontiguousarray(array).reshape(-1)
    if t.dtype in (f16, bf16):
        return flat.view(np.uint16)
    return flat.astype(storage_numpy(t.dtype))


def _from_storage(buffer: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype in (f16, bf16):
        return buffer.view(dtype.numpy)
    return buffer.astype(np.bool_) if dtype == bool_ else buffer
