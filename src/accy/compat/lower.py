"""`compile_fragment(handle, program, options)`: a program's artifact for the native backend
that loads `options.artifact_format` ("cpu_object": a shared object; "cuda_c": CUDA C for
NVRTC with its launch schedule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backends.base import compile_artifact, native_backend_for
from ..core import Program


@dataclass(frozen=True)
class FragmentCompilerOptions:
    """How to compile: the artifact format, and where custom calls find their kernels.

    `kernel_call_registry` has `lookup(target, version)` returning a kernel call (or None).

    >>> FragmentCompilerOptions().artifact_format
    'cpu_object'
    """

    artifact_format: str = "cpu_object"
    kernel_call_registry: Any = None


def compile_fragment(
    handle: Any, program: Program, options: FragmentCompilerOptions | None = None
) -> Any:
    """Compile `program` into an artifact of `options.artifact_format`. `handle` (a device
    state's `handle()`, or None) names the device the artifact is for; compiling needs none.

    >>> import accy
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0] * 2.0)
    >>> compile_fragment(None, p).artifact_format
    'cpu_object'
    >>> compile_fragment(None, p, FragmentCompilerOptions("tpu_binary"))
    Traceback (most recent call last):
    accy.errors.AccyError: no backend loads artifacts of format 'tpu_binary'; ...
    """
    options = options or FragmentCompilerOptions()
    backend = native_backend_for(options.artifact_format)
    return compile_artifact(backend, program, options.kernel_call_registry)


__all__ = ["FragmentCompilerOptions", "compile_fragment"]
