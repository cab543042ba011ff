"""`reduce`: combine a tensor over named axes with sum, max, min or prod, starting from a scalar
`init` operand: `reduce(x, init) {op=sum, axes=[lane]}` is `init + sum over lane of x`.

Ties in max and min: the derivative is split evenly among every element equal to the result,
the init operand included (as JAX and PyTorch's `amax` do).
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
    # d(prod) = prod * sum(dx / x): undefined (NaN) where an element is exactly zero.
    result = Zero(out.ty)
    if not isinstance(t_x, Zero):
        relative = e.sum(e.div(t_x, x), x.ty.axes_not_in(out.ty))
        result = e.mul(relative, out)
    if not isinstance(t_init, Zero):
        result = e.add_tangents(result, e.mul(e.broadcast_to(e.div(t_init, init), out.ty), out))
    return result


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


register(Rule("reduce", _reduce_infer, _reduce_evaluate, _reduce_jvp, _reduce_transpose, arity=2))
