"""Backends: the devices (`devices`), one protocol (`base`), one argument rule (`arguments`), one
set of raw-buffer checks (`buffers`), and one subpackage or module per platform: `reference`
(the NumPy evaluator), `cpu` (generated C) and `cuda` (generated CUDA C, cuBLAS and CUDA
graphs). Importing a backend registers it for its platform; a device finds it there."""

from . import arguments, base, buffers, cpu, cuda, devices, reference
from .base import (
    CACHE,
    DEVICES,
    Backend,
    Bindings,
    CompileOptions,
    Executable,
    backend_for,
    executable_for,
    register_backend,
)

__all__ = [
    "CACHE",
    "DEVICES",
    "Backend",
    "Bindings",
    "CompileOptions",
    "Executable",
    "arguments",
    "backend_for",
    "base",
    "buffers",
    "cpu",
    "cuda",
    "devices",
    "executable_for",
    "reference",
    "register_backend",
]
