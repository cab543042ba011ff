"""Compile a program for CUDA: plan, CUDA C and a schedule. No GPU and no CuPy are needed here.

`compile_program` is what `accy.lower.compile_fragment` calls for `artifact_format="cuda_ptx"`.
The result holds the CUDA C of every kernel (`source`) and the `Schedule` of one invocation;
NVRTC turns the source into device code when the fragment is loaded (`runtime`), or on demand
into PTX (`CompiledFragment.ptx`). For loading, the kernels are also cut into a few
translation units of about equal size (`units`), which NVRTC compiles in parallel threads: a
large program's one unit took NVRTC tens of seconds on a single core.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core import Program
from ...lower.buffers import aligned
from ...lower.plan import Plan, build_plan
from ...lower.target import GPU
from . import cudnn_conv
from .kernels import Module
from .prelude import PRELUDE
from .schedule import Address, Level, Schedule, batch_launches
from .steps import emit_plan

NVRTC_OPTIONS = ("--fmad=false",)  # no FMA contraction: rounds as the CPU and the reference do
# Kernels are cut into at most MAX_UNITS translation units of at least UNIT_BYTES of source
# each: enough units to keep a 16-core host busy, few enough that NVRTC's fixed cost per unit
# (parsing the prelude) stays small, and a small program is one unit as before.
MAX_UNITS = 16
UNIT_BYTES = 8_192


@dataclass(frozen=True)
class SourceUnit:
    """One translation unit for loading: the prelude, every file-scope declaration and some of
    the kernels (`kernels`, their names)."""

    source: str
    kernels: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class CompiledFragment:
    """A program compiled for CUDA (`artifact_format` "cuda_ptx"), ready to be loaded."""

    program: Program
    plan: Plan
    source: str
    schedule: Schedule
    kernels: tuple[str, ...]
    externals: dict[str, Any]
    scratch_offset: int
    workspace_bytes: int
    kernel_comments: dict[str, str]
    units: tuple[SourceUnit, ...] = ()
    artifact_format: str = "cuda_ptx"
    # Large constants: (workspace byte offset, elements), copied in once when loaded.
    constants: tuple[tuple[int, np.ndarray], ...] = ()

    def ptx(self, arch: str | None = "compute_90") -> str:
        """The kernels as PTX (NVRTC where cuda.core or CuPy is installed, else nvcc)."""
        from ...kernel.toolchain import cuda_to_ptx

        return cuda_to_ptx(self.source, f"program {self.program.name!r}", arch=arch)


def translation_unit(module: Module) -> str:
    """The whole module as one translation unit."""
    return "\n\n".join([PRELUDE.strip(), *module.declarations_and_kernels]) + "\n"


def translation_units(module: Module) -> tuple[SourceUnit, ...]:
    """The module's kernels cut, in order, into units of about equal source size (see
    `MAX_UNITS`); every unit has the prelude and the file-scope declarations.

    >>> module = Module()
    >>> names = [module.kernel([f"ws[{k}] = {k};"]) for k in range(3)]
    >>> [unit.kernels for unit in translation_units(module)] == [tuple(names)]
    True
    """
    kernels = list(module.kernel_sources.items())
    size = sum(len(text) for _, text in kernels)
    count = max(1, min(MAX_UNITS, len(kernels), size // UNIT_BYTES))
    head = [PRELUDE.strip(), *module.declarations]
    units, start, written = [], 0, 0
    for part in range(count):
        stop = start
        goal = math.ceil(size * (part + 1) / count)
        while stop < len(kernels) and (written < goal or stop == start):
            written += len(kernels[stop][1])
            stop += 1
        if part == count - 1:
            stop = len(kernels)
        chosen = kernels[start:stop]
        source = "\n\n".join(head + [text for _, text in chosen]) + "\n"
        units.append(SourceUnit(source, tuple(name for name, _ in chosen)))
        start = stop
    return tuple(unit for unit in units if unit.kernels) or (
        SourceUnit(translation_unit(module), ()),
    )


def compile_program(
    program: Program, kernel_call_registry: Any = None, prefix: str = "accy_", batch: bool = True
) -> CompiledFragment:
    """Plan `program` and write its kernels and schedule (file-scope names start `prefix`).
    With `batch`, launches of one kernel that do not depend on each other become one
    (`schedule.batch_launches`).

    >>> import accy
    >>> from accy.backends.cuda.compile import compile_program
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0].exp().sum())
    >>> compiled = compile_program(p)
    >>> [type(action).__name__ for action in compiled.schedule.actions]
    ['Launch']
    >>> '__global__' in compiled.source
    True
    """
    # cuDNN runs the convolutions it takes whole; the rest are compositions.
    plan = build_plan(program, dataclasses.replace(GPU, keep=cudnn_conv.layout_for))
    module = Module(kernel_call_registry, prefix)
    code = emit_plan(module, plan)
    schedule = Schedule()
    count = len(program.parameters) + len(program.outputs)
    entries = tuple(Address(k) for k in range(count))
    code(Level(schedule.table(entries), entries, 0), schedule)
    if batch:
        batch_launches(schedule, len(program.parameters), module)
    scratch_offset = aligned(plan.workspace_bytes) + module.constant_bytes
    constants = tuple((scratch_offset - below, data) for below, data in module.constants)
    return CompiledFragment(
        program,
        plan,
        translation_unit(module),
        schedule,
        tuple(module.kernel_names),
        dict(module.externals),
        scratch_offset,
        scratch_offset + aligned(module.scratch_bytes),
        dict(module.kernel_comments),
        translation_units(module),
        constants=constants,
    )
