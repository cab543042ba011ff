"""Compile a program for the CPU: plan it, generate C, build (or find in the cache), load."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from ...core import Program
from ...lower.plan import Plan, build_plan
from . import toolchain
from .blas import Blas, find_blas
from .library import load_library
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

    def load(self) -> ctypes.CDLL:
        """The loaded library: the cache's entry (checked again, and rebuilt if it changed), or
        one built into a private folder where the entry cannot be loaded."""
        return toolchain.load(self.source, lambda path: load_library(path, self.blas))


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
