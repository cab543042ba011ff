"""CUDA for a loop step: an elementwise kernel over the result."""

from __future__ import annotations

from ....codegen.c.expressions import EMITTERS, Body
from ..context import StepCode, StepContext, launches, nothing
from ..kernels import blocks_for
from .common import element_index, elementwise, store


def emit_loop(ctx: StepContext) -> StepCode:
    """An elementwise kernel over the result, every fused producer computed inline."""
    op = ctx.step.op
    t = op.type
    if t.size == 0:
        return nothing

    def make(body: Body, flat: bool) -> list[str]:
        index, head = element_index(body, t, flat)
        x = EMITTERS[op.kind](body, op, index)
        pointer = body.pointers[op.results[0]]
        return head + body.lines + [store(t.dtype, pointer, "i", x)]

    return launches((elementwise(ctx, t.size, make), blocks_for(t.size)))
