"""CUDA for each kind of plan step, one module per kind, looked up in `STEP_EMITTERS`.

Elementwise work is a grid-stride loop whose counter is the element's flat position; values are
computed by the shared C expression builder (`accy.codegen.c.expressions.Body`), so fused
producers, views, gathers and padding mean the same on both backends. Reductions go through
`..reductions`, contractions through cuBLAS (`dot`), scans through `scan`.
"""

from __future__ import annotations

from collections.abc import Callable

from ....lower.plan import Plan
from ..context import Region, StepCode, StepContext
from ..kernels import Module
from ..schedule import Level, Schedule
from .calls import emit_copy, emit_custom_call
from .common import step_access
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
                start, known = len(schedule.actions), len(schedule.accesses)
                schedule.depth += 1  # 1: the code of a top-level step (see `Schedule.depth`)
                try:
                    code(level, schedule)
                finally:
                    schedule.depth -= 1
                if schedule.depth:  # inside a step (a scan's body): that step's access holds
                    continue
                # A step's code may record the accesses of its launches itself (a group's
                # independent parts: `group.part_launches`); the step's access covers any
                # launches after those.
                launched = len(schedule.actions) - start
                access = step_access(ctx, level)
                schedule.accesses += [access] * (launched - (len(schedule.accesses) - known))

        module.plan_code[id(plan)] = (plan, schedule_plan)
    return module.plan_code[id(plan)][1]


__all__ = ["STEP_EMITTERS", "StepContext", "emit_plan", "step_access"]
