"""Buffers at the CUDA boundary: device arrays taken as they are, host buffers copied over.

A device array is a CuPy array, or anything CuPy reads without a copy: an object with
`__cuda_array_interface__` (a CUDA tensor of PyTorch, Numba) or a DLPack producer on a CUDA
device (PyTorch, JAX). A host buffer (bytes, bytearray, memoryview, NumPy) is checked by
`accy.backends.buffers`, as on the CPU, and copied to the device; host outputs are copied back
when the run is done. Every failure is an `InvalidInput` naming the program and the argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...core.types import TensorType
from ...errors import InvalidInput
from ..buffers import (
    Layout,
    address_of,
    as_bytes,
    check_buffer_count,
    check_raw,
    check_readable,
)
from .runtime import CudaFragment, cupy_module

DLPACK_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged


def on_device(value: Any) -> bool:
    """Whether `value` is an array in GPU memory that CuPy can use without a copy.

    >>> on_device(b"bytes"), on_device(np.zeros(2))
    (False, False)
    """
    if hasattr(value, "__cuda_array_interface__"):
        return True
    device = getattr(value, "__dlpack_device__", None)
    if device is None:
        return False
    try:
        return device()[0] in DLPACK_CUDA
    except (TypeError, ValueError, RuntimeError, BufferError):
        return False


def as_cupy(value: Any, where: str):
    """A device array as a CuPy array (the same memory)."""
    cupy = cupy_module()
    if isinstance(value, cupy.ndarray):
        return value
    try:
        if hasattr(value, "__cuda_array_interface__"):
            return cupy.asarray(value)
        return cupy.from_dlpack(value)
    except (TypeError, ValueError, RuntimeError, BufferError) as error:
        raise InvalidInput(f"{where}: CuPy cannot read this device array ({error})") from None


def _raw_device(array, t: TensorType, where: str):
    """Check a device array as a raw buffer of `t` (the raw-buffer rules, as on the host)."""
    if not array.flags.c_contiguous:
        raise InvalidInput(f"{where}: the device array is not contiguous; pass a contiguous copy")
    check_raw(array, t, where)
    return array


def raw_input(value: Any, t: TensorType, where: str):
    """A raw device buffer holding input `value` (uploaded if it is on the host)."""
    if on_device(value):
        return _raw_device(as_cupy(value, where), t, where)
    host = as_bytes(value, where)
    check_raw(host, t, where)
    return cupy_module().asarray(host.reshape(-1).view(np.uint8))


class Outputs:
    """The device buffers a run writes, and the host buffers to copy them into afterwards."""

    def __init__(self, values: Sequence[Any], types, program: str):
        cupy = cupy_module()
        self.device, self.host = [], []
        for position, (value, t) in enumerate(zip(values, types, strict=True)):
            where = f"program {program!r}, output {position}"
            if on_device(value):
                self.device.append(_raw_device(as_cupy(value, where), t, where))
                self.host.append(None)
                continue
            host = as_bytes(value, where)
            if not host.flags.writeable:
                raise InvalidInput(f"{where}: the buffer is read-only; outputs must be writable")
            check_raw(host, t, where)
            self.device.append(cupy.empty(t.nbytes, dtype=cupy.uint8))
            self.host.append(host)

    def copy_back(self) -> None:
        """Copy every host output from the device (waits for the run)."""
        for device, host in zip(self.device, self.host, strict=True):
            if host is not None and host.nbytes:
                host.reshape(-1).view(np.uint8)[...] = device.get()


def _pointers(layout: Layout, inputs, outputs) -> list[int]:
    addresses = [a.data.ptr for a in (*inputs, *outputs)]
    layout.check_disjoint(addresses)
    return addresses


def _address_as_given(value: Any) -> int:
    """Where the caller's buffer lives (host or device: CUDA's unified addressing keeps the two
    apart), so that overlapping buffers are refused as on every other device, even though host
    buffers are copied to separate device memory before the run."""
    return as_cupy(value, "").data.ptr if on_device(value) else address_of(as_bytes(value, ""))


def _inputs(layout: Layout, inputs: Sequence[Any]) -> list:
    check_buffer_count("input", inputs, layout.input_types, layout.name)
    return [
        raw_input(v, t, f"program {layout.name!r}, input {i}")
        for i, (v, t) in enumerate(zip(inputs, layout.input_types, strict=True))
    ]


def invoke(
    fragment: CudaFragment, layout: Layout, inputs: Sequence[Any], outputs: Sequence[Any]
) -> None:
    """Check the buffers and run once on the fragment's GPU; host outputs are filled when this
    returns."""
    check_buffer_count("output", outputs, layout.output_types, layout.name)
    with fragment.device.device:  # uploads and the run on the fragment's own GPU
        arrays = _inputs(layout, inputs)
        written = Outputs(outputs, layout.output_types, layout.name)
        layout.check_disjoint([_address_as_given(v) for v in (*inputs, *outputs)])
        fragment.run(_pointers(layout, arrays, written.device))
        written.copy_back()


class Bindings:
    """Inputs bound to a CUDA fragment (copied to the device once), with device outputs of its
    own: `launch()` is one graph launch; `read_output(i, buffer)` copies output `i` out."""

    def __init__(self, fragment: CudaFragment, layout: Layout, inputs: Sequence[Any]):
        cupy = cupy_module()
        self.fragment, self.layout = fragment, layout
        with fragment.device.device:  # the bound buffers live on the fragment's GPU
            self._inputs = _inputs(layout, inputs)
            self._outputs = [cupy.empty(t.nbytes, dtype=cupy.uint8) for t in layout.output_types]
        self._pointers = _pointers(layout, self._inputs, self._outputs)
        self._launched = False

    def launch(self) -> None:
        """Run the program on the bound inputs (asynchronously)."""
        with self.fragment.device.device:
            self.fragment.run(self._pointers)
        self._launched = True

    def read_output(self, index: int, buffer: Any) -> None:
        """Copy output `index` of the last launch into `buffer` (host or device)."""
        check_readable(self._launched, index, len(self._outputs))
        with self.fragment.device.device:
            written = Outputs([buffer], [self.layout.output_types[index]], self.layout.name)
            target = written.device[0].reshape(-1).view(self._outputs[index].dtype)
            target[...] = self._outputs[index]
            written.copy_back()
