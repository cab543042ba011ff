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

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...caches import memoized
from ...core import Program
from ...core.types import TensorType, bf16
from ...errors import DonationError
from ...lower.buffers import donation_aliases
from ..arguments import check_array, check_count, held_dtype, host_array, is_exact, where
from ..base import CompileOptions, Executable, compile_artifact, register_backend
from ..buffers import check_donated_apart, donated_positions
from ..devices import device
from .arrays import Bindings, as_cupy, invoke, on_device
from .compile import CompiledFragment, compile_program
from .device import open_device
from .runtime import CudaFragment, cupy_module


@memoized("cupy bfloat16 support")
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


def device_argument(value: Any, t: TensorType, at: str, ordinal: int = 0):
    """`value` as a contiguous array of `t` (`device_dtype`) in GPU `ordinal`'s memory: copied
    there from the host or from another GPU (a copy loses nothing)."""
    cupy = cupy_module()
    with cupy.cuda.Device(ordinal):
        if on_device(value):
            array = as_cupy(value, at)
            check_array(array.dtype, array.shape, t, at)
            if array.data.device_id != ordinal:
                return cupy.array(array, order="C", copy=True)
            return cupy.ascontiguousarray(array)
        host = host_array(value, t, at)
        return cupy.asarray(host.view(device_dtype(t)))


class CudaExecutable(Executable):
    """A compiled program loaded on GPU `ordinal`: one graph launch per call."""

    def __init__(self, compiled: CompiledFragment, ordinal: int = 0, precision: str = "f32"):
        super().__init__(compiled.program)
        self.device = device("cuda:" + str(ordinal))
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


def _argument_reader(program: Program, ordinal: int) -> Callable[[Any, int], Any]:
    """`argument(value, position)`: input `position` as a contiguous CuPy array of its type on
    GPU `ordinal` (itself when it already is one; else checked by the one argument rule and
    copied there)."""
    cupy = cupy_module()
    name, types = program.name, program.parameter_types
    expected = [(t.extents, held_dtype(t)) for t in types]

    def argument(value: Any, position: int):
        extents, dtype = expected[position]
        if is_exact(value, cupy.ndarray, extents, dtype) and value.data.device_id == ordinal:
            return value
        return device_argument(value, types[position], where(name, position), ordinal)

    return argument


def _array_call(fragment: CudaFragment, program: Program) -> Callable[..., list[Any]]:
    """The function `CudaExecutable.__call__` runs (it holds `fragment`)."""
    cupy = cupy_module()
    name, types = program.name, program.parameter_types
    shapes = [(t.extents, device_dtype(t)) for t in program.output_types]
    ordinal = fragment.device.ordinal
    argument = _argument_reader(program, ordinal)
    gpu = cupy.cuda.Device(ordinal)  # outputs are allocated, and the graph runs, on this GPU

    def call(*arrays: Any) -> list[Any]:
        check_count(name, types, len(arrays))
        with gpu:
            inputs = [argument(a, i) for i, a in enumerate(arrays)]
            outputs = [cupy.empty(extents, dtype) for extents, dtype in shapes]
            fragment.run([a.data.ptr for a in inputs] + [o.data.ptr for o in outputs])
        return outputs

    return call


class DonatingCudaExecutable:
    """`executable` called with some inputs donated (`accy.compile(..., device="cuda",
    donate=...)`), as on the CPU (`accy.backends.cpu.DonatingExecutable`) and as JAX's
    `donate_argnums`: each output that the plan lets take a donated input's buffer
    (`accy.lower.buffers.donation_aliases`, the CPU's rule) is written into that input's
    device memory, and that very CuPy array is returned for it.

    Nothing is recaptured: the graph reads every input and output address from the pointer
    pool, filled per call, so the donated array's address is simply given as the output's.
    A donated array must not be used by the caller afterwards (it holds an output's values,
    or, if no output took it, the same values until a later call donates it again; the
    launch is asynchronous, on CuPy's current stream, as any call). It must be a C-contiguous
    CuPy array that owns its memory (not a view), of exactly the parameter's dtype and
    extents, and no other argument of the call may share its memory; else `DonationError`,
    raised before anything runs.

    >>> import accy
    >>> t = accy.spec(accy.f32, n=3)
    >>> step = accy.trace.define("sgd", [t, t], lambda b, a: a[0] - a[1] * 0.5)
    >>> update = accy.compile(step, device="cuda", donate=(0,))  # doctest: +SKIP
    >>> import cupy  # doctest: +SKIP
    >>> w = cupy.ones(3, cupy.float32)  # doctest: +SKIP
    >>> (new,) = update(w, cupy.ones(3, cupy.float32))  # doctest: +SKIP
    >>> new is w, new.tolist()  # doctest: +SKIP
    (True, [0.5, 0.5, 0.5])
    """

    def __init__(self, executable: CudaExecutable, donate: Sequence[int]):
        program = executable.program
        self.executable = executable
        self.program = program
        self.donated = donated_positions(program.name, donate, len(program.parameter_types))
        self.aliases = donation_aliases(executable.compiled.plan, self.donated)
        self._types = program.parameter_types
        self._sizes = [t.nbytes for t in self._types]
        self._ordinal = executable.fragment.device.ordinal
        self._argument = _argument_reader(program, self._ordinal)
        # Per input: how to take it (a donated array is taken itself, never a converted copy).
        self._takers = [
            _donated_taker(program.name, i, t, self._ordinal)
            if i in self.donated
            else self._argument
            for i, t in enumerate(program.parameter_types)
        ]
        # Per output: the input whose array it is, or its (extents, dtype) to allocate.
        self._outputs = [
            self.aliases.get(k, (t.extents, device_dtype(t)))
            for k, t in enumerate(program.output_types)
        ]
        # The last call's arguments that were taken as themselves, and every input's address.
        self._kept: list[Any] = [None] * len(self._types)
        self._addresses: list[int] = [0] * len(self._types)
        # The last input addresses found apart: a training loop passes the same ones each call.
        self._apart: list[int] | None = None

    def __call__(self, *arrays: Any) -> list[Any]:
        cupy = cupy_module()
        check_count(self.program.name, self._types, len(arrays))
        with cupy.cuda.Device(self._ordinal):
            return self._call_here(cupy, arrays)

    def _call_here(self, cupy: Any, arrays: Sequence[Any]) -> list[Any]:
        """The call, with this executable's GPU current."""
        inputs, addresses = self._take_all(arrays)
        if addresses != self._apart:
            check_donated_apart(self.program.name, addresses, self._sizes, self.donated)
            self._apart = addresses
        outputs = [inputs[o] if type(o) is int else cupy.empty(*o) for o in self._outputs]
        self.executable.fragment.run(addresses + [o.data.ptr for o in outputs])
        return outputs

    def _take_all(self, arrays: Sequence[Any]) -> tuple[list[Any], list[int]]:
        """The arrays the call runs on, and their addresses. A training step passes a few
        hundred arrays on every call, checked before the graph launches; an argument that is
        the very array of its position in the last call, taken as itself then, has the same
        address and passed the same checks, so it is not checked again (a training loop passes
        back the donated arrays it got). The last call's arguments are kept alive until the
        next call for that."""
        kept, known = self._kept, self._addresses
        if len(arrays) == len(kept) and all(map(operator.is_, arrays, kept)):
            return list(arrays), known  # a training loop's call: every array the last one's
        inputs, addresses, keep = [], [], []
        for i, (take, a) in enumerate(zip(self._takers, arrays, strict=True)):
            if a is kept[i]:
                inputs.append(a)
                addresses.append(known[i])
                keep.append(a)
                continue
            taken = take(a, i)
            inputs.append(taken)
            addresses.append(taken.data.ptr)
            keep.append(a if taken is a else None)
        self._kept, self._addresses = keep, addresses
        return inputs, addresses

    def __getattr__(self, name: str) -> Any:
        return getattr(self.executable, name)


def _donated_taker(
    program: str, position: int, t: TensorType, ordinal: int
) -> Callable[[Any, int], Any]:
    """`take(value, position)`: donated input `position`, checked: the CuPy array itself on GPU
    `ordinal`, never a converted copy."""
    cupy = cupy_module()
    extents, expected = t.extents, device_dtype(t)

    def take(value: Any, _: int) -> Any:
        if (
            is_exact(value, cupy.ndarray, extents, expected)
            and value.base is None
            and value.data.device_id == ordinal
        ):
            return value
        raise _refused_donation(value, t, expected, where(program, position))

    return take


def _refused_donation(value: Any, t: TensorType, expected: np.dtype, at: str) -> DonationError:
    cupy = cupy_module()
    what = type(value).__name__
    if isinstance(value, cupy.ndarray):
        what = (
            f"{value.dtype}{list(value.shape)} CuPy array"
            + ("" if value.base is None else ", a view of another array")
            + ("" if value.flags.c_contiguous else ", not C-contiguous")
            + f" on GPU {value.data.device_id}"
        )
    elif isinstance(value, np.ndarray):
        what = f"{value.dtype}{list(value.shape)} NumPy array (host memory)"
    return DonationError(
        f"{at} is donated, so it must be a C-contiguous CuPy array on the device that owns its "
        f"memory (the executable's GPU), of dtype {expected} and shape {t.extents} (it is "
        f"overwritten in place); got a {what}"
    )


class CudaBackend:
    """Compiles programs to CUDA C and schedules (no GPU needed), and loads them on a GPU."""

    device = "cuda"
    artifact_format = "cuda_c"

    def compile_artifact(
        self, program: Program, kernel_call_registry: Any = None
    ) -> CompiledFragment:
        return compile_program(program, kernel_call_registry)

    def load(self, artifact: CompiledFragment, ordinal: int = 0) -> CudaExecutable:
        return CudaExecutable(artifact, ordinal)

    def compile(
        self, program: Program, options: CompileOptions, ordinal: int = 0
    ) -> CudaExecutable:
        open_device(ordinal)
        artifact = compile_artifact(self, program, options.kernel_call_registry)
        # The precision of f32 GEMMs is chosen when cuBLAS calls are captured, not in the code.
        return CudaExecutable(artifact, ordinal, options.precision)

    def donating(self, executable: CudaExecutable, donate: Sequence[int]) -> Any:
        """`executable` taking the memory of inputs `donate` (`accy.compile(..., donate=)`)."""
        return DonatingCudaExecutable(executable, donate)


register_backend(CudaBackend())

__all__ = [
    "CudaBackend",
    "CudaExecutable",
    "DonatingCudaExecutable",
    "cupy_has_bfloat16",
    "device_argument",
    "device_dtype",
]
