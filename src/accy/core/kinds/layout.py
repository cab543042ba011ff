"""Kinds that move or replicate data without arithmetic: `broadcast_in_dim`, `transpose`,
`reshape`, `slice`, `pad`, `concatenate`. All are linear, so each has a transpose rule.

Attributes are positional (per axis of the operand, in layout order), as in StableHLO, except
where an axis name is the natural key (`concatenate`'s `axis`).
"""

from __future__ import annotations

import numpy as np

from ...errors import AxisError, TypeRuleError
from ..types import TensorType
from .registry import (
    Linear,
    Rule,
    attr,
    batch_same_kind,
    batched_operand,
    check_arity,
    check_same_dtype,
    check_scalar,
    describe,
    register,
)


def _linear_jvp(e, op, primals, tangents, out):
    """The JVP of a linear kind applies the same operation to the tangents."""
    operands = [e.instantiate(t) for t in tangents]
    return e.emit(op.kind, operands, op.attrs)


def _shape_attr(kind, attrs) -> tuple[tuple[str, int], ...]:
    shape = attr(kind, attrs, "shape")
    if not isinstance(shape, tuple) or not all(
        isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], int) for p in shape
    ):
        raise TypeRuleError(f"{kind}: attribute 'shape' must be named extents, got {shape!r}")
    return shape


# broadcast_in_dim ----------------------------------------------------------------------------


def _broadcast_infer(types, attrs):
    check_arity("broadcast_in_dim", types, 1)
    (t,) = types
    result = t.with_axes(_shape_attr("broadcast_in_dim", attrs))
    for name, extent in t.named_extents:
        if not result.has(name):
            raise AxisError(
                f"broadcast_in_dim: axis {name!r} of the operand {t} is not in the result "
                f"shape {result}; a broadcast only adds axes"
            )
        if result.extent(name) != extent:
            raise AxisError(
                f"broadcast_in_dim: axis {name!r} has extent {extent} in the operand {t} "
                f"but {result.extent(name)} in the result {result}"
            )
    return result


def broadcast_evaluate_named(x: np.ndarray, operand: TensorType, result: TensorType) -> np.ndarray:
    """Broadcast `x` (laid out as `operand`) to `result`, matching axes by name."""
    order = sorted(operand.axes, key=result.position)
    x = np.transpose(x, [operand.position(a) for a in order])
    shape = [result.extent(a) if a in operand.axes else 1 for a in result.axes]
    return np.broadcast_to(x.reshape(shape), result.extents).copy()


def _broadcast_transpose(e, op, ct, operands):
    (x,) = operands
    added = [a for a in op.type.axes if not x.type.has(a)]
    summed = e.sum(ct, added) if added else ct
    return [e.transpose(summed, x.type.axes)]


def _batch_leading(name: str, value):
    """A batching rule for a kind whose attribute `name` has one entry per axis in layout
    order: the batch axis, first, gets `value(ctx)`."""

    def rule(e, op, operands, batched, ctx):
        attrs = op.attrs.replace(**{name: (value(ctx), *op.attrs[name])})
        return e.emit(op.kind, operands, attrs)

    return rule


register(
    Rule(
        "broadcast_in_dim",
        _broadcast_infer,
        lambda attrs, args, ev: broadcast_evaluate_named(
            args[0], ev.operand_types[0], ev.result_types[0]
        ),
        _linear_jvp,
        _broadcast_transpose,
        arity=1,
        batch=_batch_leading("shape", lambda ctx: (ctx.name, ctx.extent)),
    )
)


# transpose -----------------------------------------------------------------------------------


def _transpose_infer(types, attrs):
    check_arity("transpose", types, 1)
    (t,) = types
    order = attr("transpose", attrs, "order")
    if sorted(order) != sorted(t.axes) or len(order) != t.rank:
        raise AxisError(f"transpose: order {list(order)} must name each axis of {t} exactly once")
    return t.with_axes((a, t.extent(a)) for a in order)


def _transpose_evaluate(attrs, args, ev):
    operand = ev.operand_types[0]
    return np.transpose(args[0], [operand.position(a) for a in attrs["order"]]).copy()


def _transpose_transpose(e, op, ct, operands):
    return [e.transpose(ct, operands[0].type.axes)]


register(
    Rule(
        "transpose",
        _transpose_infer,
        _transpose_evaluate,
        _linear_jvp,
        _transpose_transpose,
        arity=1,
        batch=_batch_leading("order", lambda ctx: ctx.name),
    )
)


# reshape -------------------------------------------------------------------------------------


def _reshape_infer(types, attrs):
    check_arity("reshape", types, 1)
    (t,) = types
    result = t.with_axes(_shape_attr("reshape", attrs))
    if result.size != t.size:
        raise AxisError(
            f"reshape: {t} has {t.size} elements but the new shape {result} has {result.size}"
        )
    return result


def _reshape_transpose(e, op, ct, operands):
    return [e.reshape(ct, operands[0].type.named_extents)]


register(
    Rule(
        "reshape",
        _reshape_infer,
        lambda attrs, args, ev: args[0].reshape(ev.result_types[0].extents).copy(),
        _linear_jvp,
        _reshape_transpose,
        arity=1,
        batch=_batch_leading("shape", lambda ctx: (ctx.name, ctx.extent)),
    )
)


# slice ---------------------------------------------------------------------------------------


def slice_extent(start: int, limit: int, stride: int) -> int:
    return max(0, -(-(limit - start) // stride))


def _positional(kind, attrs, name, t, minimum):
    values = attr(kind, attrs, name)
    if not isinstance(values, tuple) or len(values) != t.rank:
        raise TypeRuleError(
            f"{kind}: attribute {name!r} needs one int per axis of {t} ({t.rank}), got {values!r}"
        )
    for axis, v in zip(t.axes, values, strict=True):
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise TypeRuleError(f"{kind}: {name} of axis {axis!r} must be an int >= {minimum}")
    return values


def _slice_infer(types, attrs):
    check_arity("slice", types, 1)
    (t,) = types
    starts = _positional("slice", attrs, "starts", t, 0)
    limits = _positional("slice", attrs, "limits", t, 0)
    strides = _positional("slice", attrs, "strides", t, 1)
    extents = []
    for axis, extent, start, limit, stride in zip(
        t.axes, t.extents, starts, limits, strides, strict=True
    ):
        if not start <= limit <= extent:
            raise AxisError(
                f"slice: axis {axis!r} of {t} has extent {extent}; the slice {start}:{limit} "
                f"must satisfy 0 <= start <= stop <= {extent}"
            )
        extents.append((axis, slice_extent(start, limit, stride)))
    return t.with_axes(extents)


def _slice_evaluate(attrs, args, _):
    index = tuple(
        slice(s, l, k)
        for s, l, k in zip(attrs["starts"], attrs["limits"], attrs["strides"], strict=True)
    )
    return args[0][index].copy()


def _slice_transpose(e, op, ct, operands):
    (x,) = operands
    low, high, interior = [], [], []
    for extent, start, stride, n in zip(
        x.type.extents, op.attrs["starts"], op.attrs["strides"], op.type.extents, strict=True
    ):
        low.append(start)
        interior.append(stride - 1)
        covered = start + (n - 1) * stride + 1 if n else start
        high.append(extent - covered)
    zero = e.scalar(ct.ty.dtype, 0)
    return [e.pad_positional(ct, zero, tuple(low), tuple(high), tuple(interior))]


def _slice_batch(e, op, operands, batched, ctx):
    attrs = op.attrs.replace(
        starts=(0, *op.attrs["starts"]),
        limits=(ctx.extent, *op.attrs["limits"]),
        strides=(1, *op.attrs["strides"]),
    )
    return e.emit("slice", operands, attrs)


register(
    Rule(
        "slice",
        _slice_infer,
        _slice_evaluate,
        _linear_jvp,
        _slice_transpose,
        arity=1,
        batch=_slice_batch,
    )
)


# pad -----------------------------------------------------------------------------------------


def _pad_infer(types, attrs):
    check_arity("pad", types, 2)
    t, value = types
    check_same_dtype("pad", types)
    check_scalar("pad", value, "padding value (operand 1)")
    low = _positional("pad", attrs, "low", t, 0)
    high = _positional("pad", attrs, "high", t, 0)
    interior = _positional("pad", attrs, "interior", t, 0)
    return t.with_axes(
        (a, lo + hi + n + max(n - 1, 0) * inner)
        for a, n, lo, hi, inner in zip(t.axes, t.extents, low, high, interior, strict=True)
    )


def _pad_evaluate(attrs, args, ev):
    x, value = args
    result = np.full(ev.result_types[0].extents, value, dtype=x.dtype)
    index = tuple(
        slice(lo, lo + max(n - 1, 0) * (inner + 1) + 1 if n else lo, inner + 1)
        for n, lo, inner in zip(x.shape, attrs["low"], attrs["interior"], strict=True)
    )
    result[index] = x
    return result


def _pad_transpose(e, op, ct, operands):
    x, value = operands
    low, interior = op.attrs["low"], op.attrs["interior"]
    limits = tuple(
        lo + max(n - 1, 0) * (inner + 1) + 1 if n else lo
        for n, lo, inner in zip(x.type.extents, low, interior, strict=True)
    )
    strides = tuple(inner + 1 for inner in interior)
    ct_x = e.slice_positional(ct, low, limits, strides)
    ct_value = None
    if isinstance(value, Linear):
        ct_value = e.sub(e.sum(ct, ct.ty.axes), e.sum(ct_x, ct_x.ty.axes))
    return [ct_x if isinstance(x, Linear) else None, ct_value]


def _pad_batch(e, op, operands, batched, ctx):
    x, value = operands
    unpadded = {"low": (0, *op.attrs["low"]), "high": (0, *op.attrs["high"])}
    attrs = op.attrs.replace(interior=(0, *op.attrs["interior"]), **unpadded)
    x = batched_operand(e, x, batched[0], ctx)
    if not batched[1]:
        return e.emit("pad", [x, value], attrs)
    # One padding value per example: pad with zeros, then add the value where the padding is
    # (a mask that is 1 on padding and 0 on the data).
    zero, one = e.scalar(value.ty.dtype, 0), e.scalar(value.ty.dtype, 1)
    padded = e.emit("pad", [x, zero], attrs)
    mask = e.emit("pad", [e.zeros(x.ty), one], attrs)
    values = e.broadcast_to(value, padded.ty)
    return e.select(e.compare("eq", mask, e.full(mask.ty, 1)), values, padded)


register(
    Rule("pad", _pad_infer, _pad_evaluate, _linear_jvp, _pad_transpose, arity=2, batch=_pad_batch)
)


# concatenate ---------------------------------------------------------------------------------


def _concatenate_infer(types, attrs):
    if not types:
        raise TypeRuleError("concatenate needs at least one operand")
    axis = attr("concatenate", attrs, "axis")
    check_same_dtype("concatenate", types)
    first = types[0]
    if not first.has(axis):
        raise AxisError(
            f"concatenate: axis {axis!r} is not on operand 0 {first}; its axes are {first.axes}"
        )
    for t in types[1:]:
        if t.axes != first.axes or any(
            t.extent(a) != first.extent(a) for a in first.axes if a != axis
        ):
            raise AxisError(
                f"concatenate along {axis!r}: operands must have the same axes in the same "
                f"order and equal extents except along {axis!r} ({describe(types)})"
            )
    total = sum(t.extent(axis) for t in types)
    return first.with_axes((a, total if a == axis else n) for a, n in first.named_extents)


def _concatenate_evaluate(attrs, args, ev):
    return np.concatenate(args, axis=ev.operand_types[0].position(attrs["axis"]))


def _concatenate_transpose(e, op, ct, operands):
    axis = op.attrs["axis"]
    position = op.type.position(axis)
    result, offset = [], 0
    for x in operands:
        n = (x.type if isinstance(x, Linear) else x.ty).extent(axis)
        if isinstance(x, Linear):
            starts = tuple(offset if i == position else 0 for i in range(op.type.rank))
            limits = tuple(
                offset + n if i == position else extent for i, extent in enumerate(op.type.extents)
            )
            result.append(e.slice_positional(ct, starts, limits, (1,) * op.type.rank))
        else:
            result.append(None)
        offset += n
    return result


register(
    Rule(
        "concatenate",
        _concatenate_infer,
        _concatenate_evaluate,
        _linear_jvp,
        _concatenate_transpose,
        batch=batch_same_kind,
    )
)
