"""Elementwise loops: one pass over the result, every fused producer computed inline."""

from __future__ import annotations

from ....codegen.c.expressions import EMITTERS, Flat, NotFlat, linear
from ..loops import PARALLEL_FOR, SIMD, axis_index, axis_loops, nest, worth_threads
from .context import StepContext, store_element


def _root_loop(ctx: StepContext, flat: bool) -> list[str]:
    op = ctx.step.op
    t = op.type
    body = ctx.body()
    index = Flat("i", t) if flat else axis_index(t)
    x = EMITTERS[op.kind](body, op, index)
    position = "i" if flat else linear(index, t.extents)
    loops = [("i", t.size)] if flat else axis_loops(t)
    pragma = PARALLEL_FOR if loops and worth_threads(t.size, ctx.step.fused + (op,)) else None
    store = store_element(t.dtype, ctx.pointers[op.results[0]], position, x)
    return nest(loops, body.lines + [store], pragma, SIMD)


def emit_loop(ctx: StepContext) -> list[str]:
    """An elementwise loop over the result, with every fused producer computed inline."""
    ctx.value_pointers()
    if ctx.step.op.type.size > 1:
        try:
            return _root_loop(ctx, flat=True)
        except NotFlat:
            pass
    return _root_loop(ctx, flat=False)
