"""CUDA for a group step: several flat steps over the same elements as one kernel."""

from __future__ import annotations

from ....codegen.c.expressions import EMITTERS, Body, Flat
from ..context import StepCode, StepContext, launches
from ..kernels import blocks_for
from ..reductions import Accumulator, choose_cut
from .common import elementwise, store
from .reduce import initial_value, reduction


def _group_element(ctx: StepContext):
    def element(body: Body, r: str):
        values = []
        for member in ctx.step.members:
            op = member.op
            if member.kind == "loop":
                index = Flat(r, op.type)
                x = EMITTERS[op.kind](body, op, index)
                body.seed(op.results[0], index, x)
                if op.results[0] in ctx.step.writes:
                    body.lines.append(store(op.type.dtype, body.pointers[op.results[0]], r, x))
            else:
                values.append(body.value(op.operands[0], Flat(r, op.operand_types[0])))
        return body.lines, values

    return element


def emit_group(ctx: StepContext) -> StepCode:
    """Several flat steps over the same elements as one loop (see `accy.lower.grouping`)."""
    members = ctx.step.members
    first = members[0]
    size = first.op.type.size if first.kind == "loop" else first.op.operand_types[0].size
    reductions = [m.op for m in members if m.kind == "reduce"]
    element = _group_element(ctx)
    if not reductions:

        def make(body: Body, flat: bool) -> list[str]:
            return element(body, "i")[0]

        return launches((elementwise(ctx, size, make), blocks_for(size)))
    accumulators = [
        Accumulator(f"acc{j}", op.attrs["op"], op.type.dtype) for j, op in enumerate(reductions)
    ]

    def initial(pointers):
        lines, values = [], []
        for op in reductions:
            head, x = initial_value(ctx, pointers, op)
            lines += head
            values.append(x)
        return lines, values

    outputs = [op.results[0] for op in reductions]
    cut = choose_cut(1, size, True)
    return reduction(ctx, cut, element, lambda o: [], accumulators, initial, outputs)
