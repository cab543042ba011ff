"""Compile a program for the CPU: plan it, generate C, build (or find in the cache), load."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...core import Program
from ...lower.plan import Plan, build_plan
from . import toolchain
from .blas import Blas, find_blas
from .blocking import block_scans
from .gemm import choose_gemm_kernel, start_building, with_gemm_kernel
from .native import NativeLibrary
from .source import translation
from .workspace import Prefaulted, prefault


class Shared(ctypes.Structure):
    """The block every loaded library reads (`accy_shared_t` in `source.PRELUDE`)."""

    _fields_ = [
        ("parallel", ctypes.c_int),
        ("reserved", ctypes.c_int * 15),
        ("blas_lock", ctypes.c_char * 64),
    ]


SHARED = Shared(parallel=1)


def _after_fork_in_child() -> None:
    """A child made by fork() runs every loaded and future library on one thread: the parent's
    OpenMP threads are not in the child, and GNU libgomp waits for them forever. The GEMM lock is
    reset too, in case a thread of the parent (absent from the child) held it."""
    SHARED.parallel = 0
    ctypes.memset(ctypes.addressof(SHARED) + Shared.blas_lock.offset, 0, Shared.blas_lock.size)


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True, eq=False)
class CompiledFragment:
    """A program compiled to a native shared object (`artifact_format` "cpu_object")."""

    program: Program
    plan: Plan
    source: str
    library_path: Path
    blas: Blas | None
    artifact_format: str = "cpu_object"
    data: Mapping[str, bytes] = field(default_factory=dict)  # large constants' `.incbin` files
    # The workspace, faulted in while the compiler ran: the first executable's (`take()`).
    workspace: Prefaulted | None = field(default=None, repr=False)

    @property
    def workspace_bytes(self) -> int:
        return self.plan.workspace_bytes

    def load(self) -> NativeLibrary:
        """The library, opened (closed when the result is collected) and given the process's
        shared block (`SHARED`): the disk cache's entry (checked again, and rebuilt if it
        changed), or one built into a private folder where the entry cannot be opened."""
        blas = None if self.blas is None else with_gemm_kernel(self.blas, self.source)
        library = toolchain.load(self.source, lambda path: NativeLibrary(path, blas), self.data)
        library.set_shared(ctypes.byref(SHARED))
        return library


def compile_program(program: Program, kernel_call_registry=None) -> CompiledFragment:
    """Plan, generate and build `program`; the result can be loaded with `load()`.

    >>> import accy
    >>> from accy.backends.cpu.compile import compile_program
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0] * 2.0)
    >>> compile_program(p).library_path.suffix
    '.so'
    """
    # The plan's program may lay a stacked output out as blocks of steps (`block_scans`): the
    # same bytes as `program`'s output, whose type the executable keeps.
    plan = build_plan(block_scans(program, outputs_as_blocks=True))
    workspace = prefault(plan.workspace_bytes)  # beside the C generation and the compile
    blas = find_blas()
    blas = None if blas is None else choose_gemm_kernel(blas, plan)
    source, data = translation(plan, kernel_call_registry, blas)
    start_building(blas, source)
    library = toolchain.build(source, data)
    return CompiledFragment(program, plan, source, library, blas, data=data, workspace=workspace)
