"""cond and while_loop on the GPU: CUDA graph conditional nodes (CUDA 12.4 and later).

The sub-programs are plans of their own, their kernels written once (as a scan's body). A
one-thread kernel copies the predicate byte into a conditional handle (`SetCondition`), and a
conditional node (`Conditional`) runs a captured body graph on the device's decision: no host
round trip, whatever the number of iterations, and the graph's size does not grow with it.

- cond: an IF node for the true branch, then an IF node on the negated predicate for the false
  branch (each with its own handle), so the branch not taken launches nothing.
- while_loop: the init carries are copied into the results, the condition runs and sets the
  handle, and a WHILE node's body runs the loop body (current carries -> scratch), copies the
  new carries back into the results, and runs the condition again to set the handle.
"""

from __future__ import annotations

from ..context import StepCode, StepContext, launches
from ..kernels import blocks_for
from ..schedule import WORKSPACE, Address, Conditional, Level, Schedule, SetCondition
from .common import copy_kernel

SET_CONDITION = """extern "C" __device__ void cudaGraphSetConditional(unsigned long long handle,
                                                    unsigned int value);
/* Copy the bool at io[0] (negated when `negate`) into a graph conditional's handle. */
extern "C" __global__ void {name}(void *const *__restrict__ io, unsigned long long handle,
                                  int negate) {{
  const unsigned int value = (*(const unsigned char *)io[0] != 0) != (negate != 0);
  cudaGraphSetConditional(handle, value);
}}"""


def set_condition_kernel(ctx: StepContext) -> str:
    """The module's one set-condition kernel (declared on first use); its name."""
    name = f"{ctx.module.prefix}set_condition"
    if name not in ctx.module.kernel_names:
        ctx.module.declare(SET_CONDITION.format(name=name))
        ctx.module.kernel_names.append(name)
        ctx.module.kernel_comments[name] = "set a graph conditional's handle"
    return name


def _collect(schedule: Schedule, run) -> tuple:
    with schedule.collect() as body:
        run()
    return tuple(body)


def emit_cond(ctx: StepContext) -> StepCode:
    op = ctx.step.op
    on_true, on_false = (
        ctx.emit_plan(ctx.module, plan, "if", in_loop=ctx.in_loop) for plan in ctx.step.branches
    )
    setter = set_condition_kernel(ctx)

    def schedule_cond(level: Level, schedule: Schedule) -> None:
        arguments = [ctx.view_address(level, v) for v in op.operands[1:]]
        results = [ctx.slot_address(level, r) for r in op.results]
        entries = tuple(arguments + results)
        branch_level = Level(
            schedule.table(entries), entries, level.ws + ctx.workspace_scratch("body")
        )
        predicate = schedule.table([ctx.view_address(level, op.operands[0])])
        for branch, negate in ((on_true, False), (on_false, True)):
            body = _collect(schedule, lambda branch=branch: branch(branch_level, schedule))
            if body:  # a branch with nothing to launch needs no node
                handle = schedule.handle()
                schedule.add(SetCondition(setter, handle, predicate, negate))
                schedule.add(Conditional("if", handle, body))

    return schedule_cond


def emit_while(ctx: StepContext) -> StepCode:
    op = ctx.step.op
    program = ctx.plan.program
    num_consts = op.attrs["num_consts"]
    condition, body = (
        ctx.emit_plan(ctx.module, plan, ctx.inside_conditional or "while", in_loop=True)
        for plan in ctx.step.branches
    )
    setter = set_condition_kernel(ctx)
    consts, inits = op.operands[:num_consts], op.operands[num_consts:]
    starts, backs = [], []
    for i, (init, result) in enumerate(zip(inits, op.results, strict=True)):
        t = program.type_of(result)
        if not t.size:
            continue
        target, storage = ctx.slot_expression(result), ctx.storage(result)
        partner = f"(ws + {ctx.workspace_scratch(f'carry{i}')})"
        starts.append(
            (
                copy_kernel(ctx, ctx.view_expression(init), target, storage, t.size),
                blocks_for(t.size),
            )
        )
        backs.append((copy_kernel(ctx, partner, target, storage, t.size), blocks_for(t.size)))

    def schedule_while(level: Level, schedule: Schedule) -> None:
        launches(*starts)(level, schedule)
        body_ws = level.ws + ctx.workspace_scratch("body")
        fixed = [ctx.view_address(level, c) for c in consts]
        own = [ctx.slot_address(level, r) for r in op.results]
        partners = [
            Address(WORKSPACE, level.ws + ctx.workspace_scratch(f"carry{i}"))
            for i in range(len(own))
        ]
        predicate = Address(WORKSPACE, level.ws + ctx.workspace_scratch("predicate"))
        test_entries = tuple(fixed + own + [predicate])
        test = Level(schedule.table(test_entries), test_entries, body_ws)
        step_entries = tuple(fixed + own + partners)
        step = Level(schedule.table(step_entries), step_entries, body_ws)
        flag = schedule.table([predicate])
        handle = schedule.handle()

        def test_and_set() -> None:
            condition(test, schedule)
            schedule.add(SetCondition(setter, handle, flag))

        def iterate() -> None:
            body(step, schedule)
            launches(*backs)(level, schedule)
            test_and_set()

        test_and_set()
        schedule.add(Conditional("while", handle, _collect(schedule, iterate)))

    return schedule_while


__all__ = ["emit_cond", "emit_while", "set_condition_kernel"]
