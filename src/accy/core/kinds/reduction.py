"""`reduce`: combine a tensor over named axes with sum, max, min or prod, starting from a scalar
`init` operand: `reduce(x, init) {op=sum, axes=[lane]}` is `init + sum over lane of x`.

Ties in max and min: the derivative is split evenly among every element equal to the result,
the init operand included (as JAX and PyTorch's `amax` do). Prod: each element's derivative is
the product of the others, computed without dividing by it, so it is exact where x has zeros.
"""

from __future__ import annotations

import numpy as np

from ...errors import AxisError, DTypeError, TypeRuleError
from ..types import bool_
from .registry import (
    Linear,
    Rule,
    Zero,
    attr,
    batched_operand,
    check_arity,
    check_has_axes,
    check_same_dtype,
    check_scalar,
    register,
)

REDUCERS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def _reduce_infer(types, attrs):
    check_arity("reduce", types, 2)
    x, init = types
    op = attr("reduce", attrs, "op")
    if op not in REDUCERS:
        raise TypeRuleError(f"reduce: unknown op {op!r}; use one of {', '.join(REDUCERS)}")
    axes = attr("reduce", attrs, "axes")
    if len(set(axes)) != len(axes):
        raise AxisError(f"reduce: axes {list(axes)} name an axis twice")
    check_has_axes(f"reduce {op}", x, axes)
    check_same_dtype("reduce", types)
    check_scalar("reduce", init, "init value (operand 1)")
    if x.dtype == bool_ and op in ("sum", "prod"):
        raise DTypeError(f"reduce {op} does not apply to bool operands ({x})")
    return x.without(axes)


def _reduce_evaluate(attrs, args, ev):
    x, init = args
    positions = tuple(ev.operand_types[0].position(a) for a in attrs["axes"])
    with np.errstate(all="ignore"):
        return REDUCERS[attrs["op"]].reduce(x, axis=positions, initial=init[()], dtype=x.dtype)


def _sum_jvp(e, x, init, t_x, t_init, out):
    total = Zero(out.ty) if isinstance(t_x, Zero) else e.sum(t_x, x.ty.axes_not_in(out.ty))
    if not isinstance(t_init, Zero):
        t_init = e.broadcast_to(t_init, out.ty)
    return e.add_tangents(total, t_init)


def _chooser_jvp(e, x, init, t_x, t_init, out):
    reduced = x.ty.axes_not_in(out.ty)
    at_x = e.convert(e.compare("eq", x, e.broadcast_to(out, x.ty)), x.ty.dtype)
    count = e.sum(at_x, reduced)
    at_init = None
    if not _is_infinite_constant(init):
        # An init that is a finite value (or a parameter) takes its share of ties.
        at_init = e.convert(e.compare("eq", e.broadcast_to(init, out.ty), out), x.ty.dtype)
        count = e.add(count, at_init)
    result = Zero(out.ty)
    if not isinstance(t_x, Zero):
        result = e.sum(e.mul(t_x, e.div(at_x, e.broadcast_to(count, x.ty))), reduced)
    if not isinstance(t_init, Zero) and at_init is not None:
        result = e.add_tangents(
            result, e.mul(e.broadcast_to(t_init, out.ty), e.div(at_init, count))
        )
    return result


def _is_infinite_constant(value) -> bool:
    """Whether `value` is a constant -inf or inf: the usual max/min init, which ties only when
    every element is infinite too (then the elements take the whole derivative)."""
    held = getattr(value, "builder", None) and value.builder.splat_value(value)
    return isinstance(held, float) and held in (float("inf"), float("-inf"))


def _prod_jvp(e, x, init, t_x, t_init, out):
    """d(init * prod x) = init * sum_i (prod_{j != i} x_j) dx_i + prod(x) d(init).

    The products of the others are computed without dividing by x (prod / x_i is NaN where
    x_i is zero), so [0, 2, 3] gets the derivative [6, 0, 0] and [0, 0, 3] gets [0, 0, 0].
    """
    reduced = x.ty.axes_not_in(out.ty)
    result = Zero(out.ty)
    if not isinstance(t_x, Zero) and x.ty.size > 0:
        others = e.mul(_products_of_the_others(e, x, reduced), init)
        result = e.sum(e.mul(t_x, others), reduced)
    if not isinstance(t_init, Zero):
        product = e.reduce(x, 1.0, "prod", reduced)
        result = e.add_tangents(result, e.mul(e.broadcast_to(t_init, out.ty), product))
    return result


def _products_of_the_others(e, x, reduced):
    """For each element of `x`, the product of the other elements along the `reduced` axes:
    the exclusive prefix product times the exclusive suffix product along those axes merged
    into one. Built from slice, pad and mul only, so it is exact with zeros, differentiable
    again (higher-order derivatives) and runs on every backend."""
    length = int(np.prod([x.ty.extent(a) for a in reduced], dtype=np.int64))
    if length == 1:
        return e.full(x.ty, 1.0)
    if len(reduced) == 1:
        (axis,) = reduced
        flat = x
    else:
        axis = "reduced"
        while x.ty.has(axis):
            axis += "_"
        flat = e.merge(x, reduced, axis)
    others = e.mul(
        _exclusive_product(e, flat, axis, False), _exclusive_product(e, flat, axis, True)
    )
    if flat is x:
        return others
    parts = {a: x.ty.extent(a) for a in reduced}
    return e.transpose(e.split(others, axis, parts), x.ty.axes)


def _exclusive_product(e, x, axis, reverse):
    """Position i along `axis` holds the product of the elements before it (after it when
    `reverse`): the inclusive scan (Hillis-Steele, log2 n doubling steps) of x shifted by one."""
    length = x.ty.extent(axis)

    def shifted(y, by):
        # y moved `by` places toward the end (the start when reverse), filled with ones.
        if reverse:
            return e.pad(e.slice(y, axis, by, length), axis, high=by, value=1.0)
        return e.pad(e.slice(y, axis, 0, length - by), axis, low=by, value=1.0)

    scan = shifted(x, 1)
    step = 1
    while step < length - 1:
        scan = e.mul(scan, shifted(scan, step))
        step *= 2
    return scan


_JVPS = {"sum": _sum_jvp, "max": _chooser_jvp, "min": _chooser_jvp, "prod": _prod_jvp}


def _reduce_jvp(e, op, primals, tangents, out):
    if not op.type.dtype.is_float:
        return Zero(op.type)
    return _JVPS[op.attrs["op"]](e, primals[0], primals[1], tangents[0], tangents[1], out)


def _reduce_transpose(e, op, ct, operands):
    if op.attrs["op"] != "sum":
        raise TypeRuleError(f"reduce {op.attrs['op']} is not linear and cannot be transposed")
    x, init = operands
    return [
        e.broadcast_to(ct, x.type) if isinstance(x, Linear) else None,
        e.sum(ct, ct.ty.axes) if isinstance(init, Linear) else None,
    ]


_COMBINE = {"sum": "add", "max": "max", "min": "min", "prod": "mul"}


def reduction_identity(op: str, dtype):
    """The value that `op` leaves unchanged (the init that adds nothing)."""
    if op in ("sum", "prod"):
        return 0 if op == "sum" else 1
    if dtype.is_float:
        return float("-inf") if op == "max" else float("inf")
    if dtype == bool_:
        return op == "min"
    info = np.iinfo(dtype.numpy)
    return int(info.min) if op == "max" else int(info.max)


def _reduce_batch(e, op, operands, batched, ctx):
    x, init = operands
    x = batched_operand(e, x, batched[0], ctx)
    if not batched[1]:
        return e.emit("reduce", [x, init], op.attrs)
    # One init per example: reduce from the identity, then combine with the inits.
    identity = e.scalar(x.ty.dtype, reduction_identity(op.attrs["op"], x.ty.dtype))
    reduced = e.emit("reduce", [x, identity], op.attrs)
    return e.emit(_COMBINE[op.attrs["op"]], [reduced, e.broadcast_to(init, reduced.ty)])


register(
    Rule(
        "reduce",
        _reduce_infer,
        _reduce_evaluate,
        _reduce_jvp,
        _reduce_transpose,
        arity=2,
        batch=_reduce_batch,
    )
)
