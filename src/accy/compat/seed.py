"""The seed's execution API over the backend protocol; nothing here has logic of its own.

- `accy.execute`: `run_cpu(program, inputs, outputs)`, `Cpu(program).launch(inputs, outputs)`,
  `fragment_for(program, options)`: an executable from the one cache, run on raw buffers.
- `accy.executable`: `load_fragment(handle, artifact)` loads an artifact of
  `accy.lower.compile_fragment` as an executable (a `Fragment`); `invoke` is its `run_buffers`,
  `prepare_invocation` its `bind`.
- `accy.gpu`: device states whose `handle()` names a device (`cpu.State()`,
  `cuda.State.init_device(0)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..backends.base import (
    Bindings,
    CompileOptions,
    Executable,
    executable_for,
    native_backend_for,
)
from ..backends.cuda.device import open_device, platform_supported
from ..core import Program
from ..errors import AccyError
from ..lower.artifacts import FragmentCompilerOptions

Fragment = Executable
"""A loaded program (the seed's name for an executable)."""


# -- accy.gpu: device states -------------------------------------------------------------------


@dataclass(frozen=True)
class Handle:
    """What compiling and loading are given to say which device they target."""

    kind: str
    ordinal: int = 0


@dataclass(frozen=True)
class CpuHandle(Handle):
    """The CPU's handle."""

    kind: str = "cpu"


@dataclass(frozen=True)
class CudaHandle(Handle):
    """A GPU's handle."""

    kind: str = "cuda"


class DeviceState:
    """An opened device; `close()` releases nothing (executables hold what they use).

    >>> with DeviceState(Handle("cpu")) as state:
    ...     state.handle()
    Handle(kind='cpu', ordinal=0)
    """

    def __init__(self, handle: Handle):
        self._handle = handle

    def handle(self) -> Handle:
        return self._handle

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> DeviceState:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class CpuState(DeviceState):
    """The CPU device's state (`accy.gpu.cpu.State`).

    >>> CpuState().handle().kind
    'cpu'
    """

    def __init__(self) -> None:
        super().__init__(CpuHandle())


class CudaState(DeviceState):
    """An opened CUDA device (`accy.gpu.cuda.State`).

    >>> import accy
    >>> try:
    ...     state = CudaState.init_device(0)
    ... except accy.RuntimeUnavailable:
    ...     state = None  # no CuPy, driver or GPU here
    >>> state is None or state.handle() == CudaHandle("cuda", 0)
    True
    """

    def __init__(self, ordinal: int):
        super().__init__(CudaHandle("cuda", ordinal))

    @classmethod
    def init_device(cls, ordinal: int = 0) -> CudaState:
        """Open GPU `ordinal`, or raise `RuntimeUnavailable` saying what is missing."""
        open_device(ordinal)
        return cls(ordinal)


# -- accy.executable: artifacts loaded and run on raw buffers ------------------------------------


def load_fragment(handle: Any, compiled: Any, options: Any = None) -> Executable:
    """Load an artifact of `accy.lower.compile_fragment`; a "cuda_ptx" one on the GPU of
    `handle` (`accy.gpu.cuda.State`).

    >>> import accy
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> handle = CpuState().handle()
    >>> load_fragment(handle, accy.lower.compile_fragment(handle, p)).output_count()
    1
    """
    artifact_format = getattr(compiled, "artifact_format", None)
    if artifact_format is None:
        raise AccyError(
            f"load_fragment: {type(compiled).__name__} is not a CPU or CUDA artifact; compile "
            f"it with FragmentCompilerOptions(artifact_format='cpu_object' or 'cuda_ptx')"
        )
    return native_backend_for(artifact_format).load(compiled, getattr(handle, "ordinal", 0))


def invoke(fragment: Executable, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """Check the buffers, then run the program once, writing every output.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> fragment = load_fragment(None, accy.lower.compile_fragment(None, p))
    >>> out = np.zeros(2, np.float32)
    >>> invoke(fragment, [np.array([1, 2], np.float32)], [out])
    >>> out.tolist()
    [2.0, 4.0]
    """
    fragment.run_buffers(inputs, outputs)


def prepare_invocation(fragment: Executable, inputs: Sequence[Any]) -> Any:
    """Check and bind `inputs`; the returned bindings `launch()` and `read_output(i, buffer)`.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> fragment = load_fragment(None, accy.lower.compile_fragment(None, p))
    >>> bindings = prepare_invocation(fragment, [np.ones(2, np.float32)])
    >>> bindings.launch()
    >>> out = bytearray(8)
    >>> bindings.read_output(0, out)
    >>> np.frombuffer(out, np.float32).tolist()
    [2.0, 2.0]
    """
    return fragment.bind(inputs)


# -- accy.execute: programs run on raw buffers -----------------------------------------------------


def fragment_for(program: Program, options: FragmentCompilerOptions | None = None) -> Executable:
    """The executable of `program` for `options.artifact_format` (the CPU by default), from
    the one cache of executables (`accy.backends.base.CACHE`)."""
    options = options or FragmentCompilerOptions()
    device = native_backend_for(options.artifact_format).device
    return executable_for(program, device, CompileOptions(options.kernel_call_registry))


def run_cpu(program: Program, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    """Run `program` natively: `inputs` and `outputs` are buffers, one per parameter/output.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> out = bytearray(8)
    >>> run_cpu(p, [np.array([1, 2], np.float32).tobytes()], [out])
    >>> np.frombuffer(out, np.float32).tolist()
    [2.0, 4.0]
    """
    fragment_for(program).run_buffers(inputs, outputs)


class Cpu:
    """A program compiled for the native CPU, launched any number of times on raw buffers.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> executor, out = Cpu(p), np.zeros(2, np.float32)
    >>> executor.launch([np.array([3, 4], np.float32)], [out])
    >>> out.tolist()
    [6.0, 8.0]
    """

    def __init__(self, program: Program, options: FragmentCompilerOptions | None = None):
        self.program = program
        self.fragment = fragment_for(program, options)

    def launch(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Check the buffers, then run once, writing every output."""
        self.fragment.run_buffers(inputs, outputs)


__all__ = [
    "Bindings",
    "Cpu",
    "CpuHandle",
    "CpuState",
    "CudaHandle",
    "CudaState",
    "DeviceState",
    "Fragment",
    "Handle",
    "fragment_for",
    "invoke",
    "load_fragment",
    "platform_supported",
    "prepare_invocation",
    "run_cpu",
]
