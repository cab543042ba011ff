"""`compile_fragment`: lower a program and compile it into an artifact for a device.

The artifact format picks the code generator (`ARTIFACT_COMPILERS`, extended by each backend):
"cpu_object" is a native shared object built from generated C, "cuda_ptx" CUDA C for NVRTC with
its launch schedule (`accy.backends.cuda`). The result is loaded with
`accy.executable.load_fragment`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ..core import Program
from ..custom import kernel_registry_for
from ..errors import AccyError

ARTIFACT_COMPILERS: dict[str, str] = {
    "cpu_object": "accy.backends.cpu.compile:compile_program",
    "cuda_ptx": "accy.backends.cuda.compile:compile_program",
}


@dataclass(frozen=True)
class FragmentCompilerOptions:
    """How to compile: the artifact format, and where custom calls find their kernels.

    `kernel_call_registry` has `lookup(target, version)` returning a kernel call (or None).

    >>> FragmentCompilerOptions().artifact_format
    'cpu_object'
    """

    artifact_format: str = "cpu_object"
    kernel_call_registry: Any = None


def _compiler_for(artifact_format: str):
    if artifact_format not in ARTIFACT_COMPILERS:
        raise AccyError(
            f"unknown artifact format {artifact_format!r}; the formats are "
            f"{', '.join(sorted(ARTIFACT_COMPILERS))}"
        )
    module, _, function = ARTIFACT_COMPILERS[artifact_format].partition(":")
    return getattr(importlib.import_module(module), function)


def compile_fragment(handle: Any, program: Program, options: FragmentCompilerOptions | None = None):
    """Compile `program` for the device behind `handle` (a `State().handle()`).

    >>> import accy
    >>> from accy.gpu.cpu import State
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0] * 2.0)
    >>> compiled = accy.lower.compile_fragment(State().handle(), p)
    >>> compiled.artifact_format
    'cpu_object'
    """
    options = options or FragmentCompilerOptions()
    compile_program = _compiler_for(options.artifact_format)
    # Custom calls without a kernel in the options' registry link to their records' kernels.
    registry = kernel_registry_for(program, options.artifact_format, options.kernel_call_registry)
    return compile_program(program, registry)
