"""`dot_general`: contraction with positional contracting and batch dimensions, as StableHLO.

The result's axes are the batch axes (named as on the left operand), then the left operand's
free axes, then the right operand's free axes; their names must be distinct.

Products are summed in the operands' compute dtype (f32 for f16 and bf16, whose sums are rounded
once, at the end). The optional attribute `accumulate` (a float dtype name, JAX's
`preferred_element_type`) sums in that dtype and makes it the result's: bf16 operands with
`accumulate=f32` give an f32 result, not rounded to bf16. It is never narrower than the compute
dtype and never the operands' own dtype (then it is left out).
"""

from __future__ import annotations

import numpy as np

from ...errors import AxisError, TypeRuleError
from ..types import DType, TensorType, bool_, compute_dtype, dtype_named
from .registry import (
    Linear,
    Rule,
    Zero,
    attr,
    batch_first,
    check_arity,
    check_same_dtype,
    describe,
    register,
)

DIMENSION_ATTRS = ("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch")


def accumulation(attrs) -> DType | None:
    """The `accumulate` dtype of a dot_general's attributes, or None."""
    name = attrs.get("accumulate")
    return None if name is None else dtype_named(name)


def _check_accumulate(types, accumulate: DType) -> None:
    operand = types[0].dtype
    widths = {"f16": 0, "bf16": 0, "f32": 1, "f64": 2}
    if not (operand.is_float and accumulate.is_float) or accumulate == operand:
        raise TypeRuleError(
            f"dot_general: accumulate={accumulate} needs float operands of another dtype "
            f"({describe(types)}); leave it out to sum in the operands' dtype"
        )
    if widths[accumulate.name] < widths[compute_dtype(operand).name]:
        raise TypeRuleError(
            f"dot_general: accumulate={accumulate} is narrower than {operand}'s compute dtype "
            f"{compute_dtype(operand)}; a sum is never accumulated in less precision"
        )


def dimensions(attrs):
    return tuple(tuple(attr("dot_general", attrs, name)) for name in DIMENSION_ATTRS)


def free_dimensions(rank: int, contracting, batch) -> list[int]:
    return [i for i in range(rank) if i not in contracting and i not in batch]


def _dot_infer(types, attrs):
    check_arity("dot_general", types, 2)
    lhs, rhs = types
    check_same_dtype("dot_general", types)
    if lhs.dtype == bool_:
        raise TypeRuleError(f"dot_general does not apply to bool operands ({describe(types)})")
    lc, rc, lb, rb = dimensions(attrs)
    for side, t, dims in (("lhs", lhs, lc + lb), ("rhs", rhs, rc + rb)):
        if any(not isinstance(d, int) or not 0 <= d < t.rank for d in dims):
            raise AxisError(f"dot_general: {side} dimensions {list(dims)} out of range for {t}")
        if len(set(dims)) != len(dims):
            raise AxisError(f"dot_general: {side} dimensions {list(dims)} repeat an axis of {t}")
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise AxisError(
            "dot_general: lhs and rhs need as many contracting dimensions as each other, and as "
            f"many batch dimensions (got {list(lc)} vs {list(rc)}, {list(lb)} vs {list(rb)})"
        )
    for role, ldims, rdims in (("contracting", lc, rc), ("batch", lb, rb)):
        for l, r in zip(ldims, rdims, strict=True):
            if lhs.extents[l] != rhs.extents[r]:
                raise AxisError(
                    f"dot_general: {role} axes {lhs.axes[l]!r} of {lhs} and {rhs.axes[r]!r} of "
                    f"{rhs} have different extents"
                )
    named = [lhs.named_extents[i] for i in lb]
    named += [lhs.named_extents[i] for i in free_dimensions(lhs.rank, lc, lb)]
    named += [rhs.named_extents[i] for i in free_dimensions(rhs.rank, rc, rb)]
    names = [n for n, _ in named]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise AxisError(
            f"dot_general: the result would have axis {', '.join(map(repr, clashes))} twice "
            f"({describe(types)}); rename the axis on one operand, or make it a batch axis"
        )
    accumulate = accumulation(attrs)
    if accumulate is None:
        return lhs.with_axes(named)
    _check_accumulate(types, accumulate)
    return TensorType(accumulate, tuple(named))


def dot_evaluate(lhs: np.ndarray, rhs: np.ndarray, attrs) -> np.ndarray:
    """dot_general over NumPy arrays through one batched matmul, in the accumulation dtype
    (`accumulate`, else float32 for 16-bit floats; the caller rounds the result)."""
    lc, rc, lb, rb = dimensions(attrs)
    accumulate = accumulation(attrs)
    if accumulate is not None:
        lhs, rhs = lhs.astype(accumulate.numpy), rhs.astype(accumulate.numpy)
    elif lhs.dtype == np.float16:
        lhs, rhs = lhs.astype(np.float32), rhs.astype(np.float32)
    lf = free_dimensions(lhs.ndim, lc, lb)
    rf = free_dimensions(rhs.ndim, rc, rb)
    batch_shape = [lhs.shape[i] for i in lb]
    m = int(np.prod([lhs.shape[i] for i in lf], dtype=np.int64))
    n = int(np.prod([rhs.shape[i] for i in rf], dtype=np.int64))
    k = int(np.prod([lhs.shape[i] for i in lc], dtype=np.int64))
    b = int(np.prod(batch_shape, dtype=np.int64))
    a = np.transpose(lhs, list(lb) + lf + list(lc)).reshape(b, m, k)
    c = np.transpose(rhs, list(rb) + list(rc) + rf).reshape(b, k, n)
    product = np.matmul(a, c)
    shape = batch_shape + [lhs.shape[i] for i in lf] + [rhs.shape[i] for i in rf]
    return product.reshape(shape)


def _dot_jvp(e, op, primals, tangents, out):
    lhs, rhs = primals
    t_lhs, t_rhs = tangents
    left = (
        Zero(op.type) if isinstance(t_lhs, Zero) else e.emit("dot_general", [t_lhs, rhs], op.attrs)
    )
    right = (
        Zero(op.type) if isinstance(t_rhs, Zero) else e.emit("dot_general", [lhs, t_rhs], op.attrs)
    )
    return e.add_tangents(left, right)


def _cotangent_of(e, ct, linear, other, linear_dims, other_dims, linear_is_lhs):
    """Cotangent of the linear operand: contract `ct` with the other operand over the other
    operand's free axes, batch over the batch axes, then lay the result out as the linear
    operand (renaming axes when the other operand names them differently). The operand order
    is chosen so that the product comes out in the linear operand's layout when it can.
    """
    (l_contract, l_batch), (o_contract, o_batch) = linear_dims, other_dims
    o_free = free_dimensions(other.ty.rank, o_contract, o_batch)
    l_free = free_dimensions(linear.rank, l_contract, l_batch)
    batch = list(range(len(l_batch)))
    # Positions in ct: batch first, then the lhs free axes, then the rhs free axes.
    start = len(batch) + (len(l_free) if linear_is_lhs else 0)
    ct_other_free = list(range(start, start + len(o_free)))
    kept_ct = [i for i in range(ct.ty.rank) if i not in ct_other_free]
    kept_other = [o for o in range(other.ty.rank) if o not in o_free and o not in o_batch]
    names = [ct.ty.axes[i] for i in kept_ct] + [other.ty.axes[o] for o in kept_other]
    if len(set(names)) != len(names):
        other = _renamed_apart(e, other, ct)
    # Which axis of the linear operand each kept axis stands for.
    from_ct = list(l_batch) + l_free
    from_other = [l_contract[o_contract.index(o)] for o in kept_other]
    if list(l_batch) + from_other + l_free == list(range(linear.rank)):
        product = e.dot_general(other, ct, o_free, ct_other_free, o_batch, batch)
        positions = list(l_batch) + from_other + l_free
    else:
        product = e.dot_general(ct, other, ct_other_free, o_free, batch, o_batch)
        positions = from_ct + from_other
    named = e.rename_axes(product, [linear.axes[i] for i in positions])
    return e.transpose(named, linear.axes)


def _renamed_apart(e, other, ct):
    """`other` with fresh names, so that none clashes with `ct`'s in the product."""
    taken = set(other.ty.axes) | set(ct.ty.axes)
    return e.rename_axes(other, [_fresh_name(taken) for _ in other.ty.axes])


def _fresh_name(taken: set[str]) -> str:
    number = len(taken)
    while f"free{number}" in taken:
        number += 1
    taken.add(f"free{number}")
    return f"free{number}"


def _dot_transpose(e, op, ct, operands):
    """The cotangent of the linear operand. With `accumulate`, the cotangent (in the wider
    dtype) meets the other operand widened to it, exactly, and the product is converted back
    to the linear operand's dtype: the exact transpose, then one rounding."""
    lhs, rhs = operands
    lc, rc, lb, rb = dimensions(op.attrs)
    if isinstance(lhs, Linear) and isinstance(rhs, Linear):
        raise TypeRuleError("dot_general of two linear values is not linear")
    if isinstance(lhs, Linear):
        linear, other, dims = lhs.type, rhs, ((lc, lb), (rc, rb), True)
    else:
        linear, other, dims = rhs.type, lhs, ((rc, rb), (lc, lb), False)
    other = e.convert(other, ct.ty.dtype)
    cotangent = e.convert(_cotangent_of(e, ct, linear, other, *dims), linear.dtype)
    return [cotangent, None] if isinstance(lhs, Linear) else [None, cotangent]


def _dot_batch(e, op, operands, batched, ctx):
    """Both batched: the batch axis becomes the first batch dimension (so it comes out first).
    One batched: it is a free axis of that operand, moved to the front afterwards."""
    lc, rc, lb, rb = dimensions(op.attrs)
    lhs, rhs = operands

    def shifted(dims, by):
        return tuple(d + by for d in dims)

    accumulate = accumulation(op.attrs)
    if all(batched):
        return e.dot_general(
            lhs,
            rhs,
            shifted(lc, 1),
            shifted(rc, 1),
            (0, *shifted(lb, 1)),
            (0, *shifted(rb, 1)),
            accumulate=accumulate,
        )
    left, right = batched
    product = e.dot_general(
        lhs,
        rhs,
        shifted(lc, left),
        shifted(rc, right),
        shifted(lb, left),
        shifted(rb, right),
        accumulate=accumulate,
    )
    return batch_first(e, product, ctx)


register(
    Rule(
        "dot_general",
        _dot_infer,
        lambda attrs, args, _: dot_evaluate(args[0], args[1], attrs),
        _dot_jvp,
        _dot_transpose,
        arity=2,
        batch=_dot_batch,
    )
)
