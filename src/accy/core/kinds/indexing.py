"""`gather`, `scatter_add` and `scatter` along one named axis.

`gather(table, indices) {axis=vocab}` replaces the table's `vocab` axis, in place, by the axes of
`indices`. `scatter_add(operand, indices, updates) {axis=vocab}` adds each slice of `updates` to
the operand's row that its index names; `updates` has the type `gather` would produce.
`scatter(operand, indices, updates) {axis=vocab, combine=max}` combines instead with `mul`, `max`
or `min` (not linear, so no transpose; its JVP is written with scatter_add and gather).
Scatter-set, batch axes and dropping out-of-range indices are compositions
(`accy/core/indexing.py`).

Out-of-range indices are clamped into [0, extent - 1], as XLA's gather does, on every backend;
scatter_add clamps the same way, so that it stays the exact transpose of gather. No backend ever
reads or writes out of bounds.
"""

from __future__ import annotations

import numpy as np

from ...errors import AxisError, DTypeError, TypeRuleError
from ..types import TensorType, bool_, i32, i64
from .registry import (
    Linear,
    Rule,
    Zero,
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


def _check_updates(kind: str, types, attrs) -> None:
    """A scatter's updates must have the type gather would give for its operand and indices."""
    operand, indices, updates = types
    expected = gathered_type(kind, operand, indices, attr(kind, attrs, "axis"))
    if updates != expected:
        raise AxisError(
            f"{kind}: updates must have type {expected} (what gather would give for the "
            f"operand {operand} and indices {indices}), got {updates}"
        )


def _scatter_infer(types, attrs):
    check_arity("scatter_add", types, 3)
    _check_updates("scatter_add", types, attrs)
    return types[0]


def _scatter_with(combine: np.ufunc, attrs, args, ev) -> np.ndarray:
    """The operand with each update combined into the row its (clamped) index names, in index
    order, by `combine.at` (np.add for scatter_add, COMBINES for scatter)."""
    operand, indices, updates = args
    position = ev.operand_types[0].position(attrs["axis"])
    result = operand.copy()
    if operand.shape[position] == 0 or indices.size == 0:
        return result
    rows = np.moveaxis(result, position, 0)
    before = operand.shape[:position]
    after = operand.shape[position + 1 :]
    flat_updates = np.moveaxis(updates.reshape(before + (indices.size,) + after), position, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        combine.at(rows, _clamped(indices, operand.shape[position]).ravel(), flat_updates)
    return result


def _scatter_evaluate(attrs, args, ev):
    return _scatter_with(np.add, attrs, args, ev)


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
    """scatter_add and scatter: the batch axis merged into the scattered one."""
    operand, indices, updates = operands
    axis = op.attrs["axis"]
    operand = batched_operand(e, operand, batched[0], ctx)
    updates = batched_operand(e, updates, batched[2], ctx)
    if not batched[1]:
        return e.emit(op.kind, [operand, indices, updates], op.attrs)
    merged, offset, flat = _flattened(e, operand, indices, axis, ctx)
    gathered = [a for name in merged.ty.axes for a in (offset.ty.axes if name == flat else [name])]
    updates = e.transpose(updates, gathered)
    scattered = e.emit(op.kind, [merged, offset, updates], op.attrs.replace(axis=flat))
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


# scatter: mul, max, min ------------------------------------------------------------------------

COMBINES = {"mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _combine_infer(types, attrs):
    check_arity("scatter", types, 3)
    combine = attr("scatter", attrs, "combine")
    if combine not in COMBINES:
        raise TypeRuleError(
            f"scatter: combine {combine!r} is not one of {', '.join(COMBINES)} "
            f"(adding is the kind scatter_add)"
        )
    _check_updates("scatter", types, attrs)
    operand = types[0]
    if combine == "mul" and operand.dtype == bool_:
        raise DTypeError("scatter: combine 'mul' needs a numeric operand, got bool; use 'min'")
    return operand


def _combine_evaluate(attrs, args, ev):
    return _scatter_with(COMBINES[attrs["combine"]], attrs, args, ev)


def _extremal_jvp(e, op, primals, tangents, out):
    """max/min: the tangent of the value that won; ties share it equally (the operand's own
    value and every update equal to the result), as JAX's scatter_max."""
    operand, indices, updates = primals
    axis, t = op.attrs["axis"], op.type
    d_operand, d_updates = e.instantiate(tangents[0]), e.instantiate(tangents[2])
    kept = e.compare("eq", operand, out)
    won = e.compare("eq", updates, e.gather(out, indices, axis))
    one, zero = e.full(TensorType(t.dtype, ()), 1), e.zeros(TensorType(t.dtype, ()))
    count = e.scatter_add(e.select(kept, one, zero), indices, e.select(won, one, zero), axis)
    total = e.scatter_add(
        e.select(kept, d_operand, zero), indices, e.select(won, d_updates, zero), axis
    )
    return e.div(total, e.maximum(count, 1))


def _product_jvp(e, op, primals, tangents, out):
    """mul: d(x * prod u) = dx * prod u + x * sum_j du_j * prod_{k != j} u_k, with the product of
    the others exact when updates are zero (counted, not divided by)."""
    operand, indices, updates = primals
    axis, t = op.attrs["axis"], op.type
    d_operand, d_updates = e.instantiate(tangents[0]), e.instantiate(tangents[2])
    scalar = TensorType(t.dtype, ())
    one, zero = e.full(scalar, 1), e.zeros(scalar)
    ones = e.full(t, 1)
    is_zero = e.compare("eq", updates, zero)
    product = e.emit("scatter", [ones, indices, updates], {"axis": axis, "combine": "mul"})
    nonzero = e.select(is_zero, one, updates)
    nonzero_product = e.gather(
        e.emit("scatter", [ones, indices, nonzero], {"axis": axis, "combine": "mul"}), indices, axis
    )
    zeros = e.gather(
        e.scatter_add(e.zeros(t), indices, e.select(is_zero, one, zero), axis), indices, axis
    )
    others = e.select(
        e.compare("eq", zeros, zero),
        e.div(nonzero_product, nonzero),
        e.select(e.binary("and", e.compare("eq", zeros, one), is_zero), nonzero_product, zero),
    )
    coefficient = e.mul(others, e.gather(operand, indices, axis))
    return e.scatter_add(e.mul(d_operand, product), indices, e.mul(d_updates, coefficient), axis)


def _combine_jvp(e, op, primals, tangents, out):
    if not op.type.dtype.is_float:
        return Zero(op.type)
    if op.attrs["combine"] == "mul":
        return _product_jvp(e, op, primals, tangents, out)
    return _extremal_jvp(e, op, primals, tangents, out)


register(
    Rule(
        "scatter",
        _combine_infer,
        _combine_evaluate,
        _combine_jvp,
        arity=3,
        batch=_scatter_batch,
    )
)
