"""CUDA for a loop step: an elementwise kernel over the result."""

from __future__ import annotations

from ....codegen.c.expressions import (
    EMITTERS,
    Body,
    Index,
    components,
    concatenated_pieces,
    piecewise,
)
from ....core import Operation
from ....lower.views import concatenated_view
from ..context import StepCode, StepContext, launches, nothing
from ..vectors import LaneBody
from .common import elementwise_kernel, store_at


def emit_loop(ctx: StepContext) -> StepCode:
    """An elementwise kernel over the result, every fused producer computed inline (several
    adjacent elements per thread, with vector loads and stores, where the accesses allow)."""
    op = ctx.step.op
    t = op.type
    if t.size == 0:
        return nothing

    def make(body: Body, index: Index, position: str) -> None:
        pointer = body.pointers[op.results[0]]
        if isinstance(body, LaneBody) and _one_piece_per_vector(body, op, index):
            _store_vector_piecewise(body, op, index, position, pointer)
            return
        x = EMITTERS[op.kind](body, op, index)
        body.lines.append(store_at(body, t.dtype, pointer, position, x))

    return launches(elementwise_kernel(ctx, t, make))


def _one_piece_per_vector(body: LaneBody, op: Operation, index: Index) -> bool:
    """Whether `op` is a concatenate of computed pieces whose every vector of lanes lies in one
    piece: the lanes differ along another axis, or every piece starts at a multiple of the
    width (vectors start at one: the lane axis's extent is a multiple of the width)."""
    if op.kind != "concatenate" or not concatenated_pieces(op):
        return False
    if concatenated_view(op, [body.plan.view(v) for v in op.operands]) is not None:
        return False
    along = components(index)[op.type.position(op.attrs["axis"])]
    if along not in body.lanes:
        return True
    return all(start % body.width == 0 for _, start, _ in concatenated_pieces(op))


def _store_vector_piecewise(
    body: LaneBody, op: Operation, index: Index, position: str, pointer: str
) -> None:
    """At lane 0, every lane of the vector computed in one branch per piece and stored; the
    other lanes' calls find them done."""
    if body.lanes[position][1] != 0:
        return
    lanes = [_lane_of(body, components(index), k) for k in range(body.width)]
    values = piecewise(body, op, lanes, concatenated_pieces(op), whole_vector=True)
    base = body.lanes[position][0]
    for k, x in enumerate(values):
        body.lines.append(store_at(body, op.type.dtype, pointer, body.lane(base, k), x))


def _lane_of(body: LaneBody, index: tuple[str, ...], k: int) -> tuple[str, ...]:
    """Lane `k`'s index, from lane 0's."""
    return tuple(body.lane(body.lanes[c][0], k) if c in body.lanes else c for c in index)
