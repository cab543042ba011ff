"""The native CPU backend: generated C, compiled by the system compiler, called once per run."""

from .blas import find_blas
from .compile import CompiledFragment, compile_program
from .executable import CpuBackend, CpuExecutable
from .toolchain import compile_count, find_compiler

__all__ = [
    "CompiledFragment",
    "CpuBackend",
    "CpuExecutable",
    "compile_count",
    "compile_program",
    "find_blas",
    "find_compiler",
]
