"""CUDA for each kind of plan step, one module per kind, looked up in `STEP_EMITTERS`.

Elementwise work is a grid-stride loop whose counter is the element's flat position; values are
computed by the shared C expression builder (`accy.codegen.c.expressions.Body`), so fused
producers, views, gathers and padding mean the same on both backends. Reductions go through
`..reductions`, contractions through cuBLAS (`dot`), scans through `scan`.
"""

from __future__ import annotations

from collections.abc import Callable

from ....lower.plan import Plan
from ..context import Region, StepCode, StepContext, level_address
from ..kernels import Module
from ..schedule import BARRIER, SCRATCH, WORKSPACE, Access, Level, Range, Schedule
from .calls import emit_copy, emit_custom_call
from .control import emit_cond, emit_while
from .conv import emit_conv
from .dot import emit_dot
from .group import emit_group
from .loop import emit_loop
from .reduce import emit_chain, emit_reduce
from .scan import emit_scan
from .scatter import emit_scatter
from .sort import emit_sort

STEP_EMITTERS: dict[str, Callable[[StepContext], StepCode]] = {
    "loop": emit_loop,
    "reduce": emit_reduce,
    "reductions": emit_reduce,
    "chain": emit_chain,
    "group": emit_group,
    "scatter": emit_scatter,
    "dot": emit_dot,
    "custom_call": emit_custom_call,
    "copy": emit_copy,
    "scan": emit_scan,
    "sort": emit_sort,
    "conv": emit_conv,
    "cond": emit_cond,
    "while": emit_while,
}


def emit_plan(
    module: Module,
    plan: Plan,
    inside_conditional: str = "",
    relocate: bool = True,
    *,
    in_loop: bool = False,
) -> StepCode:
    """The kernels of every step of `plan`, the program's own (written once per plan), and the
    code that schedules them in order. `inside_conditional`: `plan` is (in) the body of a graph
    conditional node, "while" or "if" (`StepContext.inside_conditional`); `in_loop`: (in) the
    body of a loop, run once per iteration. `relocate=False` writes every kernel for the plan's
    level, as a body's are (what relocation is compared with in the tests)."""
    return _emit(module, plan, inside_conditional, relocate, in_loop, own=True)


def _emit_body(
    module: Module,
    plan: Plan,
    inside_conditional: str = "",
    *,
    in_loop: bool = False,
    region: Region | None = None,
) -> StepCode:
    """`emit_plan` for the body of a scan, cond or while_loop (`StepContext.emit_plan`);
    `region`: the body of a scan run as a WHILE node."""
    return _emit(module, plan, inside_conditional, False, in_loop, region)


def _emit(
    module: Module,
    plan: Plan,
    inside_conditional: str,
    relocate: bool,
    in_loop: bool,
    region: Region | None = None,
    own: bool = False,
) -> StepCode:
    if id(plan) not in module.plan_code:
        contexts = [
            StepContext(
                module,
                plan,
                index,
                step,
                _emit_body,
                inside_conditional=inside_conditional,
                relocate=relocate,
                in_loop=in_loop,
                region=region,
                own_plan=own,
            )
            for index, step in enumerate(plan.steps)
        ]
        codes = [STEP_EMITTERS[ctx.step.kind](ctx) for ctx in contexts]

        def schedule_plan(level: Level, schedule: Schedule) -> None:
            for ctx, code in zip(contexts, codes, strict=True):
                if schedule.depth:  # inside a step (a scan's body): that step's access holds
                    code(level, schedule)
                    continue
                start = len(schedule.actions)
                schedule.depth += 1
                try:
                    code(level, schedule)
                finally:
                    schedule.depth -= 1
                access = step_access(ctx, level)
                schedule.accesses += [access] * (len(schedule.actions) - start)

        module.plan_code[id(plan)] = (plan, schedule_plan)
    return module.plan_code[id(plan)][1]


# Steps whose memory is their plan step's reads, writes and scratch (and the shared scratch
# region, when they reserve some); the others (scans, conds, custom calls, copies) are barriers.
KNOWN_ACCESS = frozenset(
    {"loop", "group", "reduce", "reductions", "chain", "scatter", "dot", "sort"}
)


def step_access(ctx: StepContext, level: Level) -> Access:
    """The bytes `ctx`'s step reads and writes when its plan runs at `level`: its stored
    values, its planned scratch, and the shared scratch region when it uses any (every step
    that does starts at its offset 0, so any two of them overlap)."""
    if ctx.step.kind not in KNOWN_ACCESS:
        return BARRIER
    reads = [_value_range(ctx.plan, level, v) for v in ctx.step.reads]
    writes = [_value_range(ctx.plan, level, v) for v in ctx.step.writes]
    if None in reads or None in writes:
        return BARRIER
    for scratch in ctx.step.scratch:
        start = level.ws + ctx.workspace_scratch(scratch.name)
        writes.append((WORKSPACE, start, start + scratch.nbytes))
    if ctx.scratch_used:
        writes.append((SCRATCH, 0, ctx.scratch_used))
    writes += ctx.staged_ranges
    return Access(tuple(reads), tuple(writes))


def _value_range(plan: Plan, level: Level, value: int) -> Range | None:
    """The bytes of the buffer that holds `value` (its own, or the one it is a view of)."""
    slot = plan.slots.get(value)
    if slot is None:
        view = plan.view(value)
        slot = None if view is None else plan.slots.get(view.base)
    if slot is None:
        return None
    address = level_address(plan, level, slot)
    return (address.source, address.offset, address.offset + slot.type.nbytes)


__all__ = ["STEP_EMITTERS", "StepContext", "emit_plan", "step_access"]
