"""CUDA for a loop step: an elementwise kernel over the result."""

from __future__ import annotations

from ....codegen.c.expressions import EMITTERS, Body, Index
from ..context import StepCode, StepContext, launches, nothing
from .common import elementwise_kernel, store_at


def emit_loop(ctx: StepContext) -> StepCode:
    """An elementwise kernel over the result, every fused producer computed inline (several
    adjacent elements per thread, with vector loads and stores, where the accesses allow)."""
    op = ctx.step.op
    t = op.type
    if t.size == 0:
        return nothing

    def make(body: Body, index: Index, position: str) -> None:
        x = EMITTERS[op.kind](body, op, index)
        pointer = body.pointers[op.results[0]]
        body.lines.append(store_at(body, t.dtype, pointer, position, x))

    return launches(elementwise_kernel(ctx, t, make))
