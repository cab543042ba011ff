"""`accy.compile` and `accy.run`: programs as functions of NumPy arrays, on a chosen device.

Arrays go in (NumPy, or any DLPack producer such as a CPU tensor of PyTorch or JAX, without a
copy when it is contiguous), fresh NumPy arrays come out, one per output, axes in layout order.
An array must have the parameter's dtype and extents: accy never converts dtypes silently
(Python lists and scalars are converted, as they have no dtype of their own). bf16 values are
float32 arrays on both sides, as in the reference evaluator.

Devices: "cpu" (native code), "cuda" (a GPU: CuPy arrays come out, see
`accy.backends.cuda.api`) and "reference" (the NumPy evaluator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .boundary import address_of
from .core import Program
from .core.types import TensorType, bf16, round_to_bf16
from .custom import kernel_registry_for
from .errors import AccyError, InvalidInput


def _from_dlpack(value: Any, where: str) -> np.ndarray:
    try:
        return np.from_dlpack(value)
    except (TypeError, RuntimeError, BufferError, ValueError) as error:
        raise InvalidInput(f"{where}: cannot read this DLPack array on the CPU ({error})") from None


def _held_dtype(t: TensorType) -> np.dtype:
    """The NumPy dtype that holds `t`'s values in arrays (float32 for bf16)."""
    return np.dtype(np.float32) if t.dtype == bf16 else t.dtype.numpy


def as_argument(value: Any, t: TensorType, where: str) -> np.ndarray:
    """`value` as a contiguous array in the raw layout of `t` (bf16 as uint16 bit patterns)."""
    if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        value = _from_dlpack(value, where)
    held = _held_dtype(t)
    if isinstance(value, np.ndarray):
        if value.dtype != held:
            raise InvalidInput(
                f"{where}: an array of dtype {value.dtype} was given for {t}, which needs "
                f"{held}; convert it explicitly (accy does not promote dtypes silently)"
            )
    else:
        value = np.asarray(value, dtype=held)
    if value.shape != t.extents:
        raise InvalidInput(
            f"{where}: an array of shape {value.shape} was given for {t}, which has shape "
            f"{t.extents} (axes in layout order: {', '.join(t.axes) or 'none, a scalar'})"
        )
    value = np.ascontiguousarray(value)
    if t.dtype == bf16:
        return (round_to_bf16(value).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return value


def _result(raw: np.ndarray, t: TensorType) -> np.ndarray:
    if t.dtype == bf16:
        return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return raw


class CompiledProgram:
    """A program compiled for a device; call it with one array per parameter.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=3)], lambda b, a: a[0] * 2.0)
    >>> twice = accy.compile(p)
    >>> twice(np.array([1, 2, 3], np.float32))[0].tolist()
    [2.0, 4.0, 6.0]
    """

    def __init__(self, program: Program, device: str, call: Callable[..., list[np.ndarray]]):
        self.program = program
        self.device = device
        self._call = call

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        return self._call(*arrays)

    def __repr__(self) -> str:
        return f"<CompiledProgram {self.program.name!r} on {self.device}>"


def _cpu(program: Program, kernel_call_registry: Any) -> Callable[..., list[np.ndarray]]:
    from .execute import fragment_for
    from .lower.fragment import FragmentCompilerOptions

    fragment = fragment_for(
        program, FragmentCompilerOptions(kernel_call_registry=kernel_call_registry)
    )
    parameter_types, output_types = program.parameter_types, program.output_types
    # Looked up once: the checks below run on every call, where microseconds count.
    expected = [
        (t, t.extents, None if t.dtype == bf16 else np.dtype(t.dtype.numpy))
        for t in parameter_types
    ]
    shapes = [
        (t.extents, np.dtype(np.uint16 if t.dtype == bf16 else t.dtype.numpy)) for t in output_types
    ]
    any_bf16 = any(t.dtype == bf16 for t in output_types)

    def argument(value: Any, position: int) -> np.ndarray:
        t, extents, dtype = expected[position]
        if (
            type(value) is np.ndarray
            and value.dtype == dtype
            and value.shape == extents
            and value.flags.c_contiguous
        ):
            return value
        return as_argument(value, t, f"program {program.name!r}, argument {position}")

    def wrong_count(arrays: tuple) -> InvalidInput:
        return InvalidInput(
            f"program {program.name!r} takes {len(expected)} arrays "
            f"({', '.join(map(str, parameter_types))}), got {len(arrays)}"
        )

    def call(*arrays: Any) -> list[np.ndarray]:
        if len(arrays) != len(expected):
            raise wrong_count(arrays)
        inputs = [argument(a, i) for i, a in enumerate(arrays)]
        outputs = [np.empty(extents, dtype) for extents, dtype in shapes]
        fragment.call([address_of(a) for a in inputs], [address_of(o) for o in outputs])
        if any_bf16:
            return [_result(o, t) for o, t in zip(outputs, output_types, strict=True)]
        return outputs

    if any_bf16 or not fragment.takes_arrays:
        return call
    return _array_call(fragment, expected, shapes, argument, wrong_count)


def _array_call(fragment, expected, shapes, argument, wrong_count) -> Callable[..., list]:
    """The call for the common case, where every microsecond is the caller's: arrays of the
    right dtype, shape and layout pass with four comparisons each and native code reads their
    addresses (`Fragment.array_runner`); anything else goes through `argument`'s checks and
    conversions, which raise `InvalidInput` before native code runs."""
    checks = [(extents, dtype) for _, extents, dtype in expected]
    count, ndarray, empty, run = len(checks), np.ndarray, np.empty, fragment.array_runner()

    def call(*arrays: Any) -> list[np.ndarray]:
        if len(arrays) != count:
            raise wrong_count(arrays)
        objects = []
        # Lengths are equal (checked above): strict=True would only add its own check.
        for position, (value, (extents, dtype)) in enumerate(zip(arrays, checks, strict=False)):
            if not (
                type(value) is ndarray
                and value.dtype == dtype
                and value.shape == extents
                and value.flags.c_contiguous
            ):
                value = argument(value, position)
            objects.append(value)
        outputs = [empty(extents, dtype) for extents, dtype in shapes]
        run(objects + outputs)
        return outputs

    return call


def _reference(program: Program, kernel_call_registry: Any) -> Callable[..., list[np.ndarray]]:
    from .reference import run as reference_run

    def call(*arrays: Any) -> list[np.ndarray]:
        converted = [
            _from_dlpack(a, f"argument {i}") if hasattr(a, "__dlpack__") else a
            for i, a in enumerate(arrays)
        ]
        return reference_run(program, converted)

    return call


def _cuda(program: Program, kernel_call_registry: Any) -> Callable[..., list[Any]]:
    from .backends.cuda.api import compiled_call

    return compiled_call(program, kernel_call_registry)


DEVICES: dict[str, Callable[[Program, Any], Callable[..., list[Any]]]] = {
    "cpu": _cpu,
    "cuda": _cuda,
    "reference": _reference,
}


def compile(
    program: Program, device: str = "cpu", *, kernel_call_registry: Any = None
) -> CompiledProgram:
    """Compile `program` for `device` ("cpu", "cuda" or "reference"); returns a callable on
    arrays. Custom calls link to the kernels of `kernel_call_registry`, else to those of their
    registered `accy.CustomCall` records.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("dot", [accy.spec(accy.f32, k=2)] * 2,
    ...                       lambda b, a: a[0].contract(a[1], "k"))
    >>> accy.compile(p, device="cpu")(np.ones(2, np.float32), np.ones(2, np.float32))[0]
    array(2., dtype=float32)
    """
    if not isinstance(program, Program):
        raise AccyError(
            f"accy.compile needs a Program (accy.trace.define makes one), got {program!r}"
        )
    if device not in DEVICES:
        raise AccyError(f"unknown device {device!r}; the devices are {', '.join(DEVICES)}")
    if device != "reference":  # the kernels of registered accy.CustomCall records join in
        kernel_call_registry = kernel_registry_for(program, device, kernel_call_registry)
    return CompiledProgram(program, device, DEVICES[device](program, kernel_call_registry))


def run(
    program: Program, *arrays: Any, device: str = "cpu", kernel_call_registry: Any = None
) -> list[np.ndarray]:
    """Run `program` once on `arrays` (compiled programs are remembered per program object).

    >>> import accy, numpy as np
    >>> p = accy.trace.define("total", [accy.spec(accy.f32, lane=3)], lambda b, a: a[0].sum())
    >>> accy.run(p, np.array([1, 2, 3], np.float32))[0].item()
    6.0
    """
    compiled = compile(program, device, kernel_call_registry=kernel_call_registry)
    return compiled(*arrays)


__all__ = ["CompiledProgram", "compile", "run"]
