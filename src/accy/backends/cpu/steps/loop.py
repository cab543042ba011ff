"""Elementwise loops: one pass over the result, every fused producer computed inline."""

from __future__ import annotations

from ....codegen.c.expressions import EMITTERS, Flat, NotFlat, linear
from ....codegen.c.loops import PARALLEL_FOR, SIMD, nest
from ..loops import axis_index, axis_loops, coalesced, nest_hoisting, worth_threads
from .context import StepContext, store_element


def _flat_loop(ctx: StepContext) -> list[str]:
    op = ctx.step.op
    body = ctx.body()
    x = EMITTERS[op.kind](body, op, Flat("i", op.type))
    store = store_element(op.type.dtype, ctx.pointers[op.results[0]], "i", x)
    return nest([("i", op.type.size)], body.lines + [store], _pragma(ctx, True), SIMD)


def _nested_loop(ctx: StepContext) -> list[str]:
    op = ctx.step.op
    t = op.type

    def statements(components: dict[str, str]) -> list[str]:
        body = ctx.body()
        index = tuple(components.get(c, c) for c in axis_index(t))
        x = EMITTERS[op.kind](body, op, index)
        store = store_element(t.dtype, ctx.pointers[op.results[0]], linear(index, t.extents), x)
        return body.lines + [store]

    loops, lines = coalesced(axis_loops(t), statements)
    return nest_hoisting(loops, lines, _pragma(ctx, bool(loops)), SIMD)


def _pragma(ctx: StepContext, has_loops: bool) -> str | None:
    op = ctx.step.op
    return (
        PARALLEL_FOR if has_loops and worth_threads(op.type.size, ctx.step.fused + (op,)) else None
    )


def emit_loop(ctx: StepContext) -> list[str]:
    """An elementwise loop over the result, with every fused producer computed inline."""
    ctx.value_pointers()
    if ctx.step.op.type.size > 1:
        try:
            return _flat_loop(ctx)
        except NotFlat:
            pass
    return _nested_loop(ctx)
