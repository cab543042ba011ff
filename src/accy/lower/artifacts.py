"""Artifact compilers by format, and `compile_fragment`, the name that reaches them.

An artifact is generated code for a device: "cpu_object" a native shared object built from
generated C (`accy.backends.cpu`), "cuda_ptx" CUDA C for NVRTC with its launch schedule
(`accy.backends.cuda`). Each backend registers its compiler here when it is imported
(`accy.backends.base.register_backend`), so this module, which sits below the backends, never
imports them. `accy.executable.load_fragment` loads an artifact; `accy.compile` does both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core import Program
from ..errors import AccyError

ArtifactCompiler = Callable[[Program, Any], Any]
"""`compile(program, kernel_call_registry) -> artifact`."""

ARTIFACT_COMPILERS: dict[str, ArtifactCompiler] = {}


def register_artifact_compiler(artifact_format: str, compiler: ArtifactCompiler) -> None:
    """Make `compiler` the one for `artifact_format`."""
    ARTIFACT_COMPILERS[artifact_format] = compiler


@dataclass(frozen=True)
class FragmentCompilerOptions:
    """How to compile: the artifact format, and where custom calls find their kernels.

    `kernel_call_registry` has `lookup(target, version)` returning a kernel call (or None).

    >>> FragmentCompilerOptions().artifact_format
    'cpu_object'
    """

    artifact_format: str = "cpu_object"
    kernel_call_registry: Any = None


def compile_fragment(handle: Any, program: Program, options: FragmentCompilerOptions | None = None):
    """Compile `program` into an artifact of `options.artifact_format`. `handle` (a device
    state's `handle()`, or None) is accepted for compatibility; compiling needs no device.

    >>> import accy
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0] * 2.0)
    >>> accy.lower.compile_fragment(None, p).artifact_format
    'cpu_object'
    """
    options = options or FragmentCompilerOptions()
    compiler = ARTIFACT_COMPILERS.get(options.artifact_format)
    if compiler is None:
        raise AccyError(
            f"unknown artifact format {options.artifact_format!r}; the formats are "
            f"{', '.join(sorted(ARTIFACT_COMPILERS))}"
        )
    return compiler(program, options.kernel_call_registry)


__all__ = [
    "ARTIFACT_COMPILERS",
    "FragmentCompilerOptions",
    "compile_fragment",
    "register_artifact_compiler",
]
