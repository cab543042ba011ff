"""Programs run on raw buffers: `run_cpu(program, inputs, outputs)`, `Cpu(program).launch(...)`
and `fragment_for(program, options)`, each an executable from the one cache of executables
(`accy.backends.base.CACHE`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backends.base import CompileOptions, Executable, executable_for, native_backend_for
from ..core import Program
from .lower import FragmentCompilerOptions


def fragment_for(program: Program, options: FragmentCompilerOptions | None = None) -> Executable:
    """The executable of `program` for `options.artifact_format` (the CPU by default).

    >>> import accy
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)], lambda b, a: a[0] * 2.0)
    >>> fragment_for(p).device
    Device('cpu')
    """
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


__all__ = ["Cpu", "fragment_for", "run_cpu"]
