"""Checks on the buffers handed to compiled programs, made before any native code runs.

A buffer is any object with the buffer protocol (bytes, bytearray, memoryview, NumPy arrays). It
must be contiguous and hold exactly the parameter's bytes; an output must also be writable, and
no output may overlap an input or another output. A NumPy array must have the parameter's dtype
(bf16 as uint16 bit patterns), or be uint8 (raw bytes). Every failure is an `InvalidInput`
that names the program, the argument and what was expected.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .core.types import DType, TensorType, bf16
from .errors import AccyError, InvalidInput

RAW_BYTES = np.dtype(np.uint8)
BF16_BIT_PATTERNS = (np.dtype(np.uint16), np.dtype(np.int16))


def expected_numpy(dtype: DType) -> tuple[np.dtype, ...]:
    """NumPy dtypes whose arrays hold raw elements of `dtype` (besides uint8 bytes)."""
    return BF16_BIT_PATTERNS if dtype == bf16 else (dtype.numpy,)


def address_of(array: np.ndarray) -> int:
    """The address of a contiguous array's first byte."""
    try:
        # The fast way (a third of a microsecond); it needs a writable, non-empty buffer.
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):
        return array.ctypes.data


@functools.cache
def numpy_data_offset() -> int | None:
    """Where an ndarray object keeps its data pointer, in bytes from the object's start (NumPy's
    `PyArrayObject.data`, 16 on 64-bit CPython), or None if this NumPy does not look like that.

    Native code can then read an array's address itself: `ctypes` and `__array_interface__`
    take a microsecond per array, longer than a small program runs.
    """
    probes = [np.empty(2), np.zeros(3, np.int8)[1:], np.ones((2, 2), np.float32).T]
    for offset in range(ctypes.sizeof(ctypes.c_void_p), 8 * ctypes.sizeof(ctypes.c_void_p), 8):
        if all(ctypes.c_void_p.from_address(id(a) + offset).value == a.ctypes.data for a in probes):
            return offset
    return None


def _as_bytes(value: Any, where: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            raise InvalidInput(
                f"{where}: the array is not contiguous (strides {value.strides}); pass "
                f"numpy.ascontiguousarray(x)"
            )
        return value
    try:
        return np.frombuffer(value, dtype=np.uint8)
    except TypeError:
        raise InvalidInput(
            f"{where}: {type(value).__name__} is not a buffer (bytes, bytearray, memoryview or "
            f"a NumPy array)"
        ) from None
    except (ValueError, BufferError):
        raise InvalidInput(f"{where}: the buffer is not contiguous; copy it first") from None


def _check(array: np.ndarray, expected: TensorType, where: str) -> None:
    if array.dtype != RAW_BYTES and array.dtype not in expected_numpy(expected.dtype):
        wanted = " or ".join(str(d) for d in expected_numpy(expected.dtype))
        raise InvalidInput(
            f"{where}: an array of dtype {array.dtype} was given for {expected}, which needs "
            f"{wanted} (or raw bytes as uint8)"
        )
    if array.nbytes != expected.nbytes:
        raise InvalidInput(
            f"{where}: the buffer has {array.nbytes} bytes, but {expected} takes "
            f"{expected.nbytes} ({expected.size} elements of {expected.dtype.itemsize} bytes)"
        )


def _count(kind: str, values: Sequence[Any], types, program: str) -> None:
    if len(values) != len(types):
        listed = ", ".join(map(str, types)) or "none"
        raise InvalidInput(
            f"program {program!r} takes {len(types)} {kind}s ({listed}), got {len(values)}"
        )


def check_readable(launched: bool, index: int, outputs: int) -> None:
    """The checks of `read_output` (CPU and CUDA bindings): a launch has run; output `index`
    is one of the `outputs`."""
    if not launched:
        raise AccyError("read_output: call launch() first; nothing has run yet")
    if not 0 <= index < outputs:
        raise InvalidInput(
            f"read_output: output {index} does not exist; the program has {outputs} outputs"
        )


def input_addresses(program: str, types, values: Sequence[Any]) -> tuple[list[int], list]:
    """Addresses of checked input buffers, and the arrays to keep alive while they are used."""
    _count("input", values, types, program)
    arrays = []
    for position, (value, expected) in enumerate(zip(values, types, strict=True)):
        where = f"program {program!r}, input {position}"
        array = _as_bytes(value, where)
        _check(array, expected, where)
        arrays.append(array)
    return [address_of(a) for a in arrays], arrays


def output_addresses(program: str, types, values: Sequence[Any]) -> tuple[list[int], list]:
    """Addresses of checked, writable output buffers, and the arrays to keep alive."""
    _count("output", values, types, program)
    arrays = []
    for position, (value, expected) in enumerate(zip(values, types, strict=True)):
        where = f"program {program!r}, output {position}"
        array = _as_bytes(value, where)
        if not array.flags.writeable:
            raise InvalidInput(f"{where}: the buffer is read-only; outputs must be writable")
        _check(array, expected, where)
        arrays.append(array)
    return [address_of(a) for a in arrays], arrays


def check_no_overlap(
    program: str, inputs: list[int], input_types, outputs: list[int], output_types
):
    """Refuse an output that shares memory with an input or another output."""
    spans = [
        (address, address + t.nbytes, f"input {i}")
        for i, (address, t) in enumerate(zip(inputs, input_types, strict=True))
        if t.nbytes
    ]
    for j, (address, t) in enumerate(zip(outputs, output_types, strict=True)):
        if t.nbytes == 0:
            continue
        end = address + t.nbytes
        for start, stop, name in spans:
            if start < end and address < stop:
                raise InvalidInput(
                    f"program {program!r}: output {j} overlaps {name}; outputs must be "
                    f"separate memory"
                )
        spans.append((address, end, f"output {j}"))
