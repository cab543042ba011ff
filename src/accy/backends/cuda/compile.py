"""Compile a program for CUDA: plan, CUDA C and a schedule. No GPU and no CuPy are needed here.

`compile_program` makes the CUDA backend's artifact (`artifact_format` "cuda_c": CUDA C for
NVRTC, with its launch schedule).
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

from ...codegen.cache import Cache, key
from ...config import config
from ...core import Program
from ...kernel.toolchain import cuda_to_ptx
from ...lower.buffers import aligned
from ...lower.plan import Plan, build_plan
from ...lower.target import GPU
from ..fragments import fingerprint, source_digest, stored
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
# Compiled fragments, in the disk cache (see `compile_program`).
FRAGMENTS = Cache("cuda-fragment", suffix=".pickle")


@dataclass(frozen=True)
class SourceUnit:
    """One translation unit for loading: the prelude, every file-scope declaration and some of
    the kernels (`kernels`, their names)."""

    source: str
    kernels: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class CompiledFragment:
    """A program compiled for CUDA (`artifact_format` "cuda_c"), ready to be loaded."""

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
    artifact_format: str = "cuda_c"
    # Large constants: (workspace byte offset, elements), copied in once when loaded.
    constants: tuple[tuple[int, np.ndarray], ...] = ()

    def ptx(self, arch: str | None = "compute_90") -> str:
        """The kernels as PTX (NVRTC where cuda.core or CuPy is installed, else nvcc)."""
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
    (`schedule.batch_launches`). The result is kept in the disk cache (`FRAGMENTS`, by
    `fragment_key`): a process compiling the same program with the same settings and the same
    accy reads it back instead of planning and writing CUDA C again.

    >>> import accy
    >>> from accy.backends.cuda.compile import compile_program
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0].exp().sum())
    >>> compiled = compile_program(p)
    >>> [type(action).__name__ for action in compiled.schedule.actions]
    ['Launch']
    >>> '__global__' in compiled.source
    True
    """
    return stored(
        FRAGMENTS,
        fragment_key(program, kernel_call_registry, prefix, batch),
        program,
        lambda: build_fragment(program, kernel_call_registry, prefix, batch),
    )


def cuda_plan(program: Program) -> Plan:
    """`program`'s plan for the GPU: cuDNN runs the convolutions it takes whole; the rest are
    compositions.

    >>> import accy
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0].exp().sum())
    >>> [step.kind for step in cuda_plan(p).steps]
    ['reduce']
    """
    return build_plan(program, dataclasses.replace(GPU, keep=cudnn_conv.layout_for))


def build_fragment(
    program: Program, kernel_call_registry: Any = None, prefix: str = "accy_", batch: bool = True
) -> CompiledFragment:
    """What `compile_program` returns, compiled now (no disk cache).

    >>> import accy
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0].exp().sum())
    >>> build_fragment(p).kernels == compile_program(p).kernels
    True
    """
    plan = cuda_plan(program)
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


def fragment_key(
    program: Program, kernel_call_registry: Any, prefix: str, batch: bool
) -> str | None:
    """The disk cache's key of `compile_program(program, kernel_call_registry, prefix, batch)`:
    the program's digest, the arguments, the accy source (`accy.backends.fragments`), the
    settings that change generated code (`accy.config.code_key()`),
    the kernel calls the program links to (the registry's answers for its custom calls, with
    each library step's problem and settings: cuDNN attention's `Settings` are part of its
    problem), and which convs cuDNN runs (`cudnn_conv.layout_for`, the planner's `keep`: it
    depends on the GPU, cuDNN and `ACCY_CUDNN_CONV`). None (not stored) where a linked call
    cannot be pickled.

    >>> import accy
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, lane=4)], lambda b, a: a[0].exp().sum())
    >>> fragment_key(p, None, "accy_", True) != fragment_key(p, None, "accy_", False)
    True
    """
    calls = linked_calls(program, kernel_call_registry)
    calls_part = fingerprint(calls)
    if calls_part is None:
        return None
    convs = repr([cudnn_conv.layout_for(op) for op in operations_of_kind(program, "conv")])
    return key(
        FRAGMENTS.namespace,
        source_digest(),
        repr(config.code_key()),
        program.digest,
        prefix,
        repr(batch),
        calls_part,
        convs,
    )


def linked_calls(program: Program, registry: Any) -> tuple:
    """(target, version, the registry's kernel call or None) of every custom call of `program`,
    in order of first appearance: all that code generation asks the registry."""
    sites = dict.fromkeys(
        (op.attrs["target"], op.attrs["version"])
        for op in operations_of_kind(program, "custom_call")
    )
    return tuple(
        (target, version, None if registry is None else registry.lookup(target, version))
        for target, version in sites
    )


def operations_of_kind(program: Program, kind: str) -> list:
    """The operations of `kind` in `program` and in the programs nested in it (loop bodies,
    branches), in order."""
    found = []
    for op in program.operations:
        if op.kind == kind:
            found.append(op)
        for value in op.attrs.values():
            if isinstance(value, Program):
                found.extend(operations_of_kind(value, kind))
    return found
