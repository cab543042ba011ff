"""Compile a program for CUDA: plan, CUDA C and a schedule. No GPU and no CuPy are needed here.

`compile_program` is what `accy.lower.compile_fragment` calls for `artifact_format="cuda_ptx"`.
The result holds the CUDA C of every kernel (`source`) and the `Schedule` of one invocation;
NVRTC turns the source into device code when the fragment is loaded (`runtime`), or on demand
into PTX (`CompiledFragment.ptx`).
"""

from __future__ import annotations

import dataclasses
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
from .schedule import Address, Level, Schedule
from .steps import emit_plan

NVRTC_OPTIONS = ("--fmad=false",)  # no FMA contraction: rounds as the CPU and the reference do


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
    artifact_format: str = "cuda_ptx"
    # Large constants: (workspace byte offset, elements), copied in once when loaded.
    constants: tuple[tuple[int, np.ndarray], ...] = ()

    def ptx(self, arch: str | None = "compute_90") -> str:
        """The kernels as PTX (NVRTC where cuda.core or CuPy is installed, else nvcc)."""
        from ...kernel.toolchain import cuda_to_ptx

        return cuda_to_ptx(self.source, f"program {self.program.name!r}", arch=arch)


def translation_unit(module: Module) -> str:
    return "\n\n".join([PRELUDE.strip(), *module.declarations]) + "\n"


def compile_program(
    program: Program, kernel_call_registry: Any = None, prefix: str = "accy_"
) -> CompiledFragment:
    """Plan `program` and write its kernels and schedule (file-scope names start `prefix`).

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
        constants=constants,
    )
