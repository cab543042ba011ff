"""CUDA for a group step: several flat steps over the same elements as one kernel."""

from __future__ import annotations

from ....codegen.c.expressions import EMITTERS, Body, Flat
from ....core.types import TensorType
from ..context import StepCode, StepContext, launches
from ..reductions import Accumulator, choose_cut
from ..vectors import MIN_VECTOR_ELEMENTS, LaneBody, lane_divisor
from .common import elementwise_kernel, step_lane_width, store_at
from .reduce import initial_values, reduction


def _member_values(ctx: StepContext, body: Body, r: str) -> list[str]:
    """Every member at flat position `r`: loops stored (where the plan keeps them), the
    reductions' elements returned."""
    values = []
    for member in ctx.step.members:
        op = member.op
        if member.kind == "loop":
            index = Flat(r, op.type)
            x = EMITTERS[op.kind](body, op, index)
            body.seed(op.results[0], index, x)
            if op.results[0] in ctx.step.writes:
                pointer = body.pointers[op.results[0]]
                body.lines.append(store_at(body, op.type.dtype, pointer, r, x))
        else:
            values.append(body.value(op.operands[0], Flat(r, op.operand_types[0])))
    return values


def _group_element(ctx: StepContext):
    def element(body: Body, r: str):
        if not isinstance(body, LaneBody):
            return body.lines, [_member_values(ctx, body, r)]
        lanes = [_member_values(ctx, body, body.lane(r, k)) for k in range(body.width)]
        return body.lines + body.stores(), lanes

    return element


def emit_group(ctx: StepContext) -> StepCode:
    """Several flat steps over the same elements as one loop (see `accy.lower.grouping`)."""
    members = ctx.step.members
    first = members[0]
    size = first.op.type.size if first.kind == "loop" else first.op.operand_types[0].size
    reductions = [m.op for m in members if m.kind == "reduce"]
    if not reductions:

        def make(body: Body, index, position: str) -> None:
            _member_values(ctx, body, position)

        return launches(
            elementwise_kernel(ctx, TensorType(first.op.type.dtype, (("n", size),)), make)
        )
    accumulators = [
        Accumulator(f"acc{j}", op.attrs["op"], op.type.dtype) for j, op in enumerate(reductions)
    ]

    initial = initial_values(ctx, reductions)

    outputs = [op.results[0] for op in reductions]
    width = lane_divisor(step_lane_width(ctx), size)
    if size < MIN_VECTOR_ELEMENTS:
        width = 1
    cut = choose_cut(1, size, True, width=width)
    return reduction(ctx, cut, _group_element(ctx), lambda o: [], accumulators, initial, outputs)
