"""`scan` on the GPU: the body's kernels, scheduled once per iteration inside the same graph.

The body is a plan of its own; its kernels are written once. Each iteration gets its own
input/output table in the pointer pool: the constants, the current carries, slice `s` of each
scanned input, the next carries, and slice `s` of each scanned output. Carries alternate
between the result buffer and a scratch buffer, so an iteration never writes what it reads;
which one holds the last carry is known from the length alone. A scanned input whose axis is
not outermost is copied slice by slice into scratch by a kernel that reads the slice's start
from its own small table.
"""

from __future__ import annotations

from ....codegen.c.expressions import offset_expression
from ....core.types import TensorType
from ..context import StepCode, StepContext, launches
from ..kernels import axis_names, blocks_for, decompose, grid_stride
from ..schedule import WORKSPACE, Address, Launch, Level, Schedule
from .common import copy_kernel, indent


def _slice_kernel(ctx: StepContext, x: int, t: TensorType, axis: str) -> str:
    """Copy one slice of `x` (its start in `io[0]`) into contiguous `io[1]`."""
    storage = ctx.storage(x)
    position = t.position(axis)
    sliced = t.without([axis])
    strides = ctx.view(x).strides[:position] + ctx.view(x).strides[position + 1 :]
    names = axis_names(sliced, "q")
    element = offset_expression(names, strides)
    lines = [
        f"const {storage} *__restrict__ source = (const {storage} *)io[0];",
        f"{storage} *__restrict__ target = ({storage} *)io[1];",
        grid_stride("i", sliced.size),
        *indent(decompose("i", sliced.extents, names) + [f"target[i] = source[{element}];"]),
        "}",
    ]
    return ctx.module.kernel(lines, f"step {ctx.index}: scan slice")


def emit_scan(ctx: StepContext) -> StepCode:
    op, attrs = ctx.step.op, ctx.step.op.attrs
    program = ctx.plan.program
    length, axis = attrs["length"], attrs["axis"]
    num_consts, num_carry = attrs["num_consts"], attrs["num_carry"]
    body = ctx.emit_plan(ctx.module, ctx.step.body, ctx.inside_conditional)
    consts = op.operands[:num_consts]
    inits = op.operands[num_consts : num_consts + num_carry]
    xs = op.operands[num_consts + num_carry :]
    carries = op.results[:num_carry]
    ys = op.results[num_carry:]
    starts = []
    for init, result in zip(inits, carries, strict=True):
        t = program.type_of(result)
        if t.size:
            kernel = copy_kernel(
                ctx,
                ctx.view_expression(init),
                ctx.slot_expression(result),
                ctx.storage(result),
                t.size,
            )
            starts.append((kernel, blocks_for(t.size)))
    slicers = {
        i: _slice_kernel(ctx, x, program.type_of(x), axis)
        for i, x in enumerate(xs)
        if program.type_of(x).position(axis) != 0 and program.type_of(x).size
    }
    finals = []
    if length % 2:
        for i, result in enumerate(carries):
            t = program.type_of(result)
            if t.size:
                partner = f"(ws + {ctx.workspace_scratch(f'carry{i}')})"
                kernel = copy_kernel(
                    ctx, partner, ctx.slot_expression(result), ctx.storage(result), t.size
                )
                finals.append((kernel, blocks_for(t.size)))

    def schedule_scan(level: Level, schedule: Schedule) -> None:
        launches(*starts)(level, schedule)
        own = [ctx.slot_address(level, result) for result in carries]
        partners = [
            Address(WORKSPACE, level.ws + ctx.workspace_scratch(f"carry{i}"))
            for i in range(num_carry)
        ]
        constants = [ctx.view_address(level, c) for c in consts]
        body_ws = level.ws + ctx.workspace_scratch("body")
        for iteration in range(length):
            s = length - 1 - iteration if attrs["reverse"] else iteration
            current, following = (own, partners) if iteration % 2 == 0 else (partners, own)
            slices = []
            for i, x in enumerate(xs):
                t = program.type_of(x)
                step = ctx.view(x).strides[t.position(axis)] * ctx.itemsize(x)
                start = ctx.view_address(level, x).plus(s * step)
                if i in slicers:
                    target = Address(WORKSPACE, level.ws + ctx.workspace_scratch(f"x{i}"))
                    table = schedule.table([start, target])
                    sliced = t.without([axis]).size
                    schedule.add(Launch(slicers[i], blocks_for(sliced), 256, table, level.ws))
                    start = target
                slices.append(start)
            outputs = [
                ctx.slot_address(level, y).plus(s * program.type_of(y).nbytes // length) for y in ys
            ]
            entries = tuple(constants + current + slices + following + outputs)
            body(Level(schedule.table(entries), entries, body_ws), schedule)
        launches(*finals)(level, schedule)

    return schedule_scan
