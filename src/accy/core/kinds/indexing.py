"""`gather` and `scatter_add` along one named axis.

`gather(table, indices) {axis=vocab}` replaces the table's `vocab` axis, in place, by the axes of
`indices`. `scatter_add(operand, indices, updates) {axis=vocab}` adds each slice of `updates` to
the operand's row that its index names; `updates` has the type `gather` would produce.

Out-of-range indices are clamped into [0, extent - 1], as XLA's gather does, on every backend;
scatter_add clamps the same way, so that it stays the exact transpose of gather. No backend ever
reads or writes out of bounds.
"""

from __future__ import annotations

import numpy as np

from ...errors import AxisError, DTypeError
from ..types import TensorType, i32, i64
from .registry import (
    Linear,
    Rule,
    attr,
    batch_first,
    batched_operand,
    check_arity,
    check_has_axes,
    register,
)


def gathered_type(kind: str, table: TensorType, indices: TensorType, axis: str) -> TensorType:
    check_has_axes(kind, table, [axis], role="table")
    if indices.dtype not in (i32, i64):
        raise DTypeError(f"{kind}: indices must be i32 or i64, got {indices}")
    rest = [a for a in table.axes if a != axis]
    clashes = [a for a in indices.axes if a in rest]
    if clashes:
        raise AxisError(
            f"{kind}: the indices {indices} and the table {table} share axis "
            f"{', '.join(map(repr, clashes))}; rename it on one of them"
        )
    named = []
    for name, extent in table.named_extents:
        named.extend(indices.named_extents if name == axis else [(name, extent)])
    return table.with_axes(named)


def _clamped(indices: np.ndarray, extent: int) -> np.ndarray:
    return np.clip(indices, 0, max(extent - 1, 0))


def _gather_infer(types, attrs):
    check_arity("gather", types, 2)
    return gathered_type("gather", types[0], types[1], attr("gather", attrs, "axis"))


def _gather_evaluate(attrs, args, ev):
    table, indices = args
    position = ev.operand_types[0].position(attrs["axis"])
    if table.shape[position] == 0:
        return np.zeros(ev.result_types[0].extents, dtype=table.dtype)
    return np.take(table, _clamped(indices, table.shape[position]), axis=position)


def _gather_jvp(e, op, primals, tangents, out):
    return e.gather(tangents[0], primals[1], op.attrs["axis"])


def _gather_transpose(e, op, ct, operands):
    table, indices = operands
    if isinstance(indices, Linear):
        raise AxisError("gather is not linear in its indices")
    zeros = e.zeros(table.type)
    return [e.scatter_add(zeros, indices, ct, op.attrs["axis"]), None]


def _flattened(e, table, indices, axis, ctx):
    """For per-example gathers and scatters: `table` with its batch axis and `axis` merged into
    one axis, and `indices` (clamped per example, as gather clamps) offset into it."""
    extent = table.ty.extent(axis)
    flat = f"{ctx.name}_{axis}_flat"
    rest = [a for a in table.ty.axes if a not in (ctx.name, axis)]
    merged = e.merge(e.transpose(table, (ctx.name, axis, *rest)), (ctx.name, axis), flat)
    clamped = e.minimum(e.maximum(indices, 0), max(extent - 1, 0))
    offsets = e.mul(e.iota(indices.ty, ctx.name), extent)
    return merged, e.add(clamped, offsets), flat


def _gather_batch(e, op, operands, batched, ctx):
    table, indices = operands
    axis = op.attrs["axis"]
    if not batched[1]:
        return e.emit("gather", [table, indices], op.attrs)
    if not batched[0]:
        return batch_first(e, e.emit("gather", [table, indices], op.attrs), ctx)
    merged, offset, flat = _flattened(e, table, indices, axis, ctx)
    return e.transpose(e.gather(merged, offset, flat), (ctx.name, *op.type.axes))


register(
    Rule(
        "gather",
        _gather_infer,
        _gather_evaluate,
        _gather_jvp,
        _gather_transpose,
        arity=2,
        batch=_gather_batch,
    )
)


def _scatter_infer(types, attrs):
    check_arity("scatter_add", types, 3)
    operand, indices, updates = types
    expected = gathered_type("scatter_add", operand, indices, attr("scatter_add", attrs, "axis"))
    if updates != expected:
        raise AxisError(
            f"scatter_add: updates must have type {expected} (what gather would give for the "
            f"operand {operand} and indices {indices}), got {updates}"
        )
    return operand


def _scatter_evaluate(attrs, args, ev):
    operand, indices, updates = args
    position = ev.operand_types[0].position(attrs["axis"])
    result = operand.copy()
    if operand.shape[position] == 0 or indices.size == 0:
        return result
    rows = np.moveaxis(result, position, 0)
    before = operand.shape[:position]
    after = operand.shape[position + 1 :]
    flat_updates = np.moveaxis(updates.reshape(before + (indices.size,) + after), position, 0)
    np.add.at(rows, _clamped(indices, operand.shape[position]).ravel(), flat_updates)
    return result


def _scatter_jvp(e, op, primals, tangents, out):
    t_operand, _, t_updates = tangents
    return e.scatter_add(
        e.instantiate(t_operand), primals[1], e.instantiate(t_updates), op.attrs["axis"]
    )


def _scatter_transpose(e, op, ct, operands):
    operand, indices, updates = operands
    return [
        ct if isinstance(operand, Linear) else None,
        None,
        e.gather(ct, indices, op.attrs["axis"]) if isinstance(updates, Linear) else None,
    ]


def _scatter_batch(e, op, operands, batched, ctx):
    operand, indices, updates = operands
    axis = op.attrs["axis"]
    operand = batched_operand(e, operand, batched[0], ctx)
    updates = batched_operand(e, updates, batched[2], ctx)
    if not batched[1]:
        return e.emit("scatter_add", [operand, indices, updates], op.attrs)
    merged, offset, flat = _flattened(e, operand, indices, axis, ctx)
    scattered = e.scatter_add(merged, offset, updates, flat)
    parts = {ctx.name: ctx.extent, axis: operand.ty.extent(axis)}
    return e.transpose(e.split(scattered, flat, parts), operand.ty.axes)


register(
    Rule(
        "scatter_add",
        _scatter_infer,
        _scatter_evaluate,
        _scatter_jvp,
        _scatter_transpose,
        arity=3,
        batch=_scatter_batch,
    )
)
