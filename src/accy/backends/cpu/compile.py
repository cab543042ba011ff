"""Compile a program for the CPU: plan it, generate C, build (or find in the cache), load."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...core import Program
from ...lower.plan import Plan, build_plan
from . import toolchain
from .blas import Blas, find_blas
from .native import NativeLibrary
from .source import translation_unit


@dataclass(frozen=True, eq=False)
class CompiledFragment:
    """A program compiled to a native shared object (`artifact_format` "cpu_object")."""

    program: Program
    plan: Plan
    source: str
    library_path: Path
    blas: Blas | None
    artifact_format: str = "cpu_object"

    @property
    def workspace_bytes(self) -> int:
        return self.plan.workspace_bytes

    def load(self) -> NativeLibrary:
        """The library, opened (closed when the result is collected); an entry of the disk
        cache that fails to load is rebuilt once."""
        try:
            return NativeLibrary(self.library_path, self.blas)
        except OSError:
            toolchain.discard(self.library_path)
            toolchain.build(self.source)
            return NativeLibrary(self.library_path, self.blas)


def compile_program(program: Program, kernel_call_registry=None) -> CompiledFragment:
    """Plan, generate and build `program`; the result can be loaded with `load()`.

    >>> import accy
    >>> from accy.backends.cpu.compile import compile_program
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0] * 2.0)
    >>> compile_program(p).library_path.suffix
    '.so'
    """
    plan = build_plan(program)
    blas = find_blas()
    source = translation_unit(plan, kernel_call_registry, blas)
    return CompiledFragment(program, plan, source, toolchain.build(source), blas)
