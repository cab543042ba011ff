"""Loaded fragments and their invocation over raw buffers (the seed's executable API).

`load_fragment(handle, compiled)` loads a compiled fragment once; `invoke(fragment, inputs,
outputs)` checks every buffer (`accy.boundary`) and then makes exactly one native call, which
runs the whole program. `prepare_invocation(fragment, inputs)` binds inputs to buffers that the
fragment owns for its outputs: `launch()` runs it, `read_output(i, buffer)` copies output `i`
out.

A fragment owns one workspace for its intermediates, so calls on one fragment are serialized
by a lock; separate fragments run concurrently.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .boundary import (
    address_of,
    check_no_overlap,
    check_readable,
    input_addresses,
    numpy_data_offset,
    output_addresses,
)
from .core import Program
from .errors import AccyError
from .lower.buffers import ALIGNMENT


def _aligned_workspace(nbytes: int) -> tuple[np.ndarray, int]:
    raw = np.zeros(nbytes + ALIGNMENT, dtype=np.uint8)
    address = raw.__array_interface__["data"][0]
    return raw, address + (-address % ALIGNMENT)


class Fragment:
    """A compiled program loaded into this process, ready to be invoked.

    `native_entry(buffers, workspace)` is the single native function that one invocation calls;
    `array_runner` reaches the same code through `accy_run_arrays`, which reads NumPy arrays'
    addresses itself.
    """

    def __init__(self, compiled: Any):
        self.compiled = compiled
        self.program: Program = compiled.program
        self.parameter_types = self.program.parameter_types
        self.output_types = self.program.output_types
        library = compiled.load()
        self.native_entry = library.accy_run
        self._arrays_entry = library.accy_run_arrays
        self._workspace, self._workspace_address = _aligned_workspace(compiled.workspace_bytes)
        count = max(self.input_count() + self.output_count(), 1)
        self._buffers = (ctypes.c_void_p * count)()
        self._buffers_address = ctypes.addressof(self._buffers)
        self._data_offset = numpy_data_offset()
        self._lock = threading.Lock()

    @property
    def takes_arrays(self) -> bool:
        """Whether `array_runner` may be used (this NumPy's array layout was recognized)."""
        return self._data_offset is not None

    def input_count(self) -> int:
        return len(self.parameter_types)

    def output_count(self) -> int:
        return len(self.output_types)

    def call(self, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        """Run the program on checked buffer addresses: one native call."""
        with self._lock:
            buffers = self._buffers
            for position, address in enumerate([*inputs, *outputs]):
                buffers[position] = address
            self.native_entry(self._buffers_address, self._workspace_address)

    def array_runner(self) -> Callable[[Sequence[np.ndarray]], None]:
        """A function running the program on checked, contiguous NumPy arrays (inputs, then
        outputs) with one native call, which reads their addresses (only if `takes_arrays`)."""
        count = self.input_count() + self.output_count()
        # The one argument of accy_run_arrays: workspace, data offset, then the arrays' ids.
        call = (ctypes.c_void_p * (2 + count))(self._workspace_address, self._data_offset)
        address, entry, lock = ctypes.addressof(call), self._arrays_entry, self._lock
        pack = struct.Struct(f"{count}P").pack_into
        offset = 2 * ctypes.sizeof(ctypes.c_void_p)

        def run(arrays: Sequence[np.ndarray]) -> None:
            with lock:
                pack(call, offset, *map(id, arrays))
                entry(address)

        return run

    def __repr__(self) -> str:
        return (
            f"<Fragment {self.program.name!r}: {self.input_count()} in, {self.output_count()} out>"
        )


def load_fragment(handle: Any, compiled: Any, options: Any = None) -> Fragment:
    """Load a fragment made by `accy.lower.compile_fragment` (once per process per library);
    a "cuda_ptx" artifact is loaded on the GPU of `handle` (`accy.gpu.cuda.State`).

    >>> import accy, numpy as np
    >>> from accy.gpu.cpu import State
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> handle = State().handle()
    >>> fragment = accy.executable.load_fragment(handle, accy.lower.compile_fragment(handle, p))
    >>> fragment.output_count()
    1
    """
    artifact_format = getattr(compiled, "artifact_format", None)
    if artifact_format == "cuda_ptx":
        from .backends.cuda.runtime import load

        return load(compiled, getattr(handle, "ordinal", 0))
    if artifact_format != "cpu_object":
        raise AccyError(
            f"load_fragment: {type(compiled).__name__} is not a CPU or CUDA artifact; compile "
            f"it with FragmentCompilerOptions(artifact_format='cpu_object' or 'cuda_ptx')"
        )
    return Fragment(compiled)


def invoke(fragment: Fragment, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """Check the buffers, then run the program once, writing every output.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> fragment = accy.executable.load_fragment(None, accy.lower.compile_fragment(None, p))
    >>> out = np.zeros(2, np.float32)
    >>> accy.executable.invoke(fragment, [np.array([1, 2], np.float32)], [out])
    >>> out.tolist()
    [2.0, 4.0]
    """
    if not isinstance(fragment, Fragment):
        from .backends.cuda.arrays import invoke as invoke_on_gpu

        return invoke_on_gpu(fragment, inputs, outputs)
    name = fragment.program.name
    in_addresses, _keep_inputs = input_addresses(name, fragment.parameter_types, inputs)
    out_addresses, _keep_outputs = output_addresses(name, fragment.output_types, outputs)
    check_no_overlap(
        name, in_addresses, fragment.parameter_types, out_addresses, fragment.output_types
    )
    fragment.call(in_addresses, out_addresses)


class Bindings:
    """Inputs bound to a fragment, with output buffers of its own (see `prepare_invocation`)."""

    def __init__(self, fragment: Fragment, inputs: Sequence[Any]):
        self.fragment = fragment
        name = fragment.program.name
        self._inputs, self._keep = input_addresses(name, fragment.parameter_types, inputs)
        self._outputs = [np.empty(t.nbytes, dtype=np.uint8) for t in fragment.output_types]
        self._launched = False

    def launch(self, options: Any = None) -> None:
        """Run the program on the bound inputs."""
        addresses = [address_of(a) for a in self._outputs]
        self.fragment.call(self._inputs, addresses)
        self._launched = True

    launch_with_options = launch

    def read_output(self, index: int, buffer: Any) -> None:
        """Copy output `index` of the last launch into the writable `buffer`."""
        check_readable(self._launched, index, len(self._outputs))
        types = [self.fragment.output_types[index]]
        _, (target,) = output_addresses(self.fragment.program.name, types, [buffer])
        target.reshape(-1).view(np.uint8)[...] = self._outputs[index]


def prepare_invocation(fragment: Fragment, inputs: Sequence[Any]) -> Bindings:
    """Check and bind `inputs`; the returned bindings `launch()` and `read_output(i, buffer)`.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> fragment = accy.executable.load_fragment(None, accy.lower.compile_fragment(None, p))
    >>> bindings = accy.executable.prepare_invocation(fragment, [np.ones(2, np.float32)])
    >>> bindings.launch()
    >>> out = bytearray(8)
    >>> bindings.read_output(0, out)
    >>> np.frombuffer(out, np.float32).tolist()
    [2.0, 2.0]
    """
    if not isinstance(fragment, Fragment):
        from .backends.cuda.arrays import Bindings as GpuBindings

        return GpuBindings(fragment, inputs)
    return Bindings(fragment, inputs)


__all__ = ["Bindings", "Fragment", "invoke", "load_fragment", "prepare_invocation"]
