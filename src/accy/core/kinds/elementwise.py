"""Elementwise kinds: `unary` (attribute `op`), the binary kinds, `compare`, `select`, `convert`.

At the IR level the operands of an elementwise operation have exactly the same type; the tracer
inserts `broadcast_in_dim`/`transpose` to align axes by name before emitting them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import AxisError, DTypeError, TypeRuleError
from ..types import bool_, dtype_named
from . import special
from .registry import (
    Linear,
    Rule,
    Zero,
    attr,
    batch_same_kind,
    check_arity,
    check_float,
    check_same_dtype,
    describe,
    register,
    zero_tangent,
)


def check_same_axes(kind: str, types) -> None:
    first = types[0]
    for t in types[1:]:
        if t.named_extents != first.named_extents:
            raise AxisError(
                f"{kind}: operands must have the same axes in the same order at the IR level "
                f"({describe(types)}); the tracer aligns axes by name with broadcast_in_dim"
            )


# ---------------------------------------------------------------------------------------------
# unary


@dataclass(frozen=True)
class UnaryOp:
    evaluate: Any
    # tangent(emit, t, x, y): the output tangent for input tangent t, input x and output y,
    # linear in t; None means the derivative is zero.
    tangent: Any = None
    float_only: bool = True
    linear: bool = False


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


def _logistic(x):
    # Written as exp of a non-positive number so that neither branch overflows.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# GELU's tanh approximation, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), and its
# derivative, as two unary ops rather than a composition: a GEMM's epilogue computes both
# (cuBLASLt's GELU_AUX_BIAS and DGELU, `accy.lower.gemm_epilogues`), which the plan can only see
# as what they are. Computed as the C does (`accy_gelu_tanhf` and `accy_gelu_tanh_slopef` in
# `accy.codegen.c.prelude`, the same operations in the same order); 16-bit floats arrive widened
# to float32 and are rounded once after (`accy.reference`).
GELU_SCALE = 0.7978845608028654  # sqrt(2 / pi)
GELU_CUBIC = 0.044715


def _gelu_tanh(x):
    u = GELU_SCALE * (x + GELU_CUBIC * x * x * x)
    return 0.5 * x * (1.0 + np.tanh(u))


def _gelu_tanh_slope(x):
    """d/dx gelu_tanh(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x), t = tanh(u(x))."""
    t = np.tanh(GELU_SCALE * (x + GELU_CUBIC * x * x * x))
    du = GELU_SCALE * (1.0 + 3 * GELU_CUBIC * x * x)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du


def _gelu_tanh_curvature(e, x):
    """The second derivative, (1 - t^2) (u' - x t u'^2 + 3 * 0.044715 sqrt(2/pi) x^2), as a
    composition (only a second derivative needs it)."""
    square = e.mul(x, x)
    t = e.unary("tanh", e.mul(e.add(x, e.mul(e.mul(square, x), GELU_CUBIC)), GELU_SCALE))
    du = e.mul(e.add(e.mul(square, 3 * GELU_CUBIC), 1.0), GELU_SCALE)
    inner = e.sub(du, e.mul(e.mul(x, t), e.mul(du, du)))
    inner = e.add(inner, e.mul(square, 3 * GELU_CUBIC * GELU_SCALE))
    return e.mul(e.sub(1.0, e.mul(t, t)), inner)


UNARY: dict[str, UnaryOp] = {
    "neg": UnaryOp(np.negative, float_only=False, linear=True),
    "exp": UnaryOp(np.exp, lambda e, t, x, y: e.mul(t, y)),
    "log": UnaryOp(np.log, lambda e, t, x, y: e.div(t, x)),
    "log1p": UnaryOp(np.log1p, lambda e, t, x, y: e.div(t, e.add(x, 1.0))),
    "expm1": UnaryOp(np.expm1, lambda e, t, x, y: e.mul(t, e.add(y, 1.0))),
    "sin": UnaryOp(np.sin, lambda e, t, x, y: e.mul(t, e.unary("cos", x))),
    "cos": UnaryOp(np.cos, lambda e, t, x, y: e.mul(t, e.neg(e.unary("sin", x)))),
    "tan": UnaryOp(np.tan, lambda e, t, x, y: e.mul(t, e.add(e.mul(y, y), 1.0))),
    "tanh": UnaryOp(np.tanh, lambda e, t, x, y: e.mul(t, e.sub(1.0, e.mul(y, y)))),
    "logistic": UnaryOp(_logistic, lambda e, t, x, y: e.mul(t, e.mul(y, e.sub(1.0, y)))),
    "gelu_tanh": UnaryOp(_gelu_tanh, lambda e, t, x, y: e.mul(t, e.unary("gelu_tanh_slope", x))),
    "gelu_tanh_slope": UnaryOp(
        _gelu_tanh_slope, lambda e, t, x, y: e.mul(t, _gelu_tanh_curvature(e, x))
    ),
    "sqrt": UnaryOp(np.sqrt, lambda e, t, x, y: e.div(t, e.mul(y, 2.0))),
    "rsqrt": UnaryOp(_rsqrt, lambda e, t, x, y: e.mul(t, e.mul(e.div(y, x), -0.5))),
    # abs'(0) = sign(0) = 0, as max(x, -x) with ties split; JAX gives 1 (see Value.abs).
    "abs": UnaryOp(np.abs, lambda e, t, x, y: e.mul(t, e.unary("sign", x)), float_only=False),
    "sign": UnaryOp(np.sign, float_only=False),
    "floor": UnaryOp(np.floor),
    "ceil": UnaryOp(np.ceil),
    "round": UnaryOp(np.round),  # halves to even, like NumPy and IEEE roundeven
    # On bool operands logical, on integers bitwise (np.invert does both).
    "not": UnaryOp(np.invert, float_only=False),
    # The identity with a zero derivative: what is computed but not differentiated through.
    "stop_gradient": UnaryOp(lambda x: x.copy(), float_only=False),
    # Inverse trigonometric and hyperbolic functions.
    "asin": UnaryOp(
        np.arcsin, lambda e, t, x, y: e.mul(t, e.unary("rsqrt", e.sub(1.0, e.mul(x, x))))
    ),
    "acos": UnaryOp(
        np.arccos, lambda e, t, x, y: e.neg(e.mul(t, e.unary("rsqrt", e.sub(1.0, e.mul(x, x)))))
    ),
    "atan": UnaryOp(np.arctan, lambda e, t, x, y: e.div(t, e.add(e.mul(x, x), 1.0))),
    "sinh": UnaryOp(np.sinh, lambda e, t, x, y: e.mul(t, e.unary("cosh", x))),
    "cosh": UnaryOp(np.cosh, lambda e, t, x, y: e.mul(t, e.unary("sinh", x))),
    "asinh": UnaryOp(
        np.arcsinh, lambda e, t, x, y: e.mul(t, e.unary("rsqrt", e.add(e.mul(x, x), 1.0)))
    ),
    # As JAX: 1 / (sqrt(x - 1) sqrt(x + 1)), which does not overflow where x * x would.
    "acosh": UnaryOp(
        np.arccosh,
        lambda e, t, x, y: e.div(
            t, e.mul(e.unary("sqrt", e.sub(x, 1.0)), e.unary("sqrt", e.add(x, 1.0)))
        ),
    ),
    "atanh": UnaryOp(np.arctanh, lambda e, t, x, y: e.div(t, e.sub(1.0, e.mul(x, x)))),
    # Special functions (accy.core.kinds.special: the reference, and the C of `codegen.c`).
    "erf": UnaryOp(special.erf, lambda e, t, x, y: e.mul(t, _erf_slope(e, x))),
    "erfc": UnaryOp(special.erfc, lambda e, t, x, y: e.neg(e.mul(t, _erf_slope(e, x)))),
    "erf_inv": UnaryOp(
        special.erf_inv,
        lambda e, t, x, y: e.mul(t, e.mul(e.unary("exp", e.mul(y, y)), special.HALF_SQRT_PI)),
    ),
    "lgamma": UnaryOp(special.lgamma, lambda e, t, x, y: e.mul(t, e.unary("digamma", x))),
    "digamma": UnaryOp(special.digamma, lambda e, t, x, y: e.mul(t, e.unary("trigamma", x))),
    "trigamma": UnaryOp(special.trigamma, special.no_tangent("trigamma")),
}

CHEAP_UNARY = frozenset({"neg", "abs", "sign", "floor", "ceil", "round", "not", "stop_gradient"})
"""Unary ops of one cheap instruction per element (no division, power or transcendental):
what the plan computes again rather than stores (`accy.lower.fusion`, `accy.lower.remat`) and
scan reverse mode recomputes rather than stacks (`accy.transforms.scan_split`)."""


def _erf_slope(e, x):
    """erf'(x) = 2 / sqrt(pi) exp(-x^2)."""
    return e.mul(e.unary("exp", e.neg(e.mul(x, x))), special.TWO_OVER_SQRT_PI)


def _unary_infer(types, attrs):
    check_arity("unary", types, 1)
    name = attr("unary", attrs, "op")
    if name not in UNARY:
        raise TypeRuleError(f"unary: unknown op {name!r}; the unary ops are {', '.join(UNARY)}")
    (t,) = types
    if name == "not" and t.dtype.is_float:
        raise DTypeError(f"unary not needs a bool or integer operand, got {t}")
    if name != "not" and t.dtype == bool_:
        raise DTypeError(f"unary {name} does not apply to bool operands ({t})")
    if UNARY[name].float_only:
        check_float(f"unary {name}", t)
    return t


def _unary_evaluate(attrs, args, _):
    with np.errstate(all="ignore"):
        return UNARY[attrs["op"]].evaluate(args[0])


def _unary_jvp(e, op, primals, tangents, out):
    unary = UNARY[op.attrs["op"]]
    if unary.linear:
        return e.unary(op.attrs["op"], tangents[0])
    if unary.tangent is None:
        return Zero(op.type)
    return unary.tangent(e, tangents[0], primals[0], out)


def _unary_transpose(e, op, ct, operands):
    if not UNARY[op.attrs["op"]].linear:
        raise TypeRuleError(f"unary {op.attrs['op']} is not linear and cannot be transposed")
    return [e.unary(op.attrs["op"], ct)]


register(
    Rule(
        "unary",
        _unary_infer,
        _unary_evaluate,
        _unary_jvp,
        _unary_transpose,
        arity=1,
        batch=batch_same_kind,
    )
)


# ---------------------------------------------------------------------------------------------
# binary kinds


def _int_divide(a, b):
    """Integer division that truncates toward zero (as C does); dividing by zero gives 0."""
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    # Floor division, then one step toward zero where it rounded down a negative quotient
    # (no abs(): abs of the most negative integer overflows).
    quotient = np.floor_divide(a, safe)
    inexact = (a - quotient * safe) != 0
    quotient = np.where(inexact & ((a < 0) != (safe < 0)), quotient + 1, quotient)
    return np.where(b == 0, 0, quotient).astype(a.dtype)


def _divide(a, b):
    return np.divide(a, b) if a.dtype.kind == "f" else _int_divide(a, b)


def _power(a, b):
    return np.power(a, b)


def _tie_weight(e, a, b, winner):
    """Weight of `a` in the derivative of max/min: 1 where it wins, 0.5 on ties, else 0."""
    wins = e.convert(e.compare(winner, a, b), a.ty.dtype)
    ties = e.convert(e.compare("eq", a, b), a.ty.dtype)
    return e.add(wins, e.mul(ties, 0.5))


def _add_jvp(e, op, p, t, out):
    return e.add_tangents(t[0], t[1])


def _sub_jvp(e, op, p, t, out):
    return e.add_tangents(t[0], e.neg_tangent(t[1]))


def _mul_jvp(e, op, p, t, out):
    return e.add_tangents(e.scale_tangent(t[0], p[1]), e.scale_tangent(t[1], p[0]))


def _div_jvp(e, op, p, t, out):
    numerator = t[0] if isinstance(t[0], Zero) else e.div(t[0], p[1])
    denominator = t[1]
    if not isinstance(denominator, Zero):
        denominator = e.neg(e.mul(denominator, e.div(out, p[1])))
    return e.add_tangents(numerator, denominator)


def _pow_jvp(e, op, p, t, out):
    """d(x^y) = y x^(y-1) dx + log(x) x^y dy, with 0 where a term would be 0 * inf: the base
    term is 0 where y == 0 (x^0 is constant in x, even at x = 0 and x = +-inf), and the exponent
    term is 0 where x == 0 (log(x) is taken at 1 there, as JAX's _pow_jvp_rhs does: 0^y is
    constant in y for y > 0), so a learnable exponent on a ReLU output gets no NaN."""
    base, exponent = p
    d_base = t[0]
    if not isinstance(d_base, Zero):
        # y * x^(y - 1) with x taken at 1 where x == y == 0 (there 0 * 0^-1 would be NaN). The
        # exponent stays y - 1 everywhere, so the term's own derivative in y at y = 0 is
        # x^-1, as JAX's (d2/dxdy x^y at (4, 0) is 0.25); at x = +-inf, (+-inf)^-1 is 0.
        zero_exponent = e.compare("eq", exponent, 0.0)
        at_origin = e.select(e.compare("eq", base, 0.0), 1.0, base)
        safe_base = e.select(zero_exponent, at_origin, base)
        d_base = e.mul(d_base, e.mul(exponent, e.pow(safe_base, e.sub(exponent, 1.0))))
    d_exponent = t[1]
    if not isinstance(d_exponent, Zero):
        # As JAX's _pow_jvp_rhs: log(x == 0 ? 1 : x) * x^y, which is 0 at x == 0.
        safe_base = e.select(e.compare("eq", base, 0.0), 1.0, base)
        d_exponent = e.mul(d_exponent, e.mul(e.unary("log", safe_base), out))
    return e.add_tangents(d_base, d_exponent)


def _chooser_jvp(winner):
    """max/min: the tangent of the operand that wins; ties split the tangent evenly (0.5 each)."""

    def jvp(e, op, p, t, out):
        weight = _tie_weight(e, p[0], p[1], winner)
        return e.add_tangents(
            e.scale_tangent(t[0], weight), e.scale_tangent(t[1], e.sub(1.0, weight))
        )

    return jvp


def _add_transpose(e, op, ct, operands):
    return [ct if isinstance(x, Linear) else None for x in operands]


def _sub_transpose(e, op, ct, operands):
    a, b = operands
    return [ct if isinstance(a, Linear) else None, e.neg(ct) if isinstance(b, Linear) else None]


def _mul_transpose(e, op, ct, operands):
    a, b = operands
    if isinstance(a, Linear) and isinstance(b, Linear):
        raise TypeRuleError("mul of two linear values is not linear and cannot be transposed")
    if isinstance(a, Linear):
        return [e.mul(ct, b), None]
    return [None, e.mul(a, ct)]


def _div_transpose(e, op, ct, operands):
    a, b = operands
    if isinstance(b, Linear):
        raise TypeRuleError("div is linear only in its numerator and cannot be transposed here")
    return [e.div(ct, b), None]


def _atan2_jvp(e, op, p, t, out):
    """d atan2(a, b) = (b da - a db) / (a^2 + b^2)."""
    a, b = p
    norm = e.add(e.mul(a, a), e.mul(b, b))
    return e.add_tangents(
        e.scale_tangent(t[0], e.div(b, norm)), e.scale_tangent(t[1], e.neg(e.div(a, norm)))
    )


def _rem_jvp(e, op, p, t, out):
    """rem(a, b) = a - b trunc(a / b): da - trunc(a / b) db (as JAX's rem)."""
    a, b = p
    if isinstance(t[1], Zero):
        return t[0]
    quotient = e.div(e.sub(a, out), b)  # exactly trunc(a / b) where the division is exact
    return e.add_tangents(t[0], e.neg(e.mul(t[1], e.unary("round", quotient))))


def _copysign_jvp(e, op, p, t, out):
    """copysign(a, b) is |a| with b's sign: da times sign(a) copysign(1, b); nothing from b."""
    a, b = p
    return e.scale_tangent(t[0], e.mul(e.unary("sign", a), e.binary("copysign", 1.0, b)))


def _no_tangent(e, op, p, t, out):
    return Zero(op.type)


def _rem(a, b):
    """C's fmod for floats (the sign of `a`); for integers truncated, with x rem 0 = 0."""
    if a.dtype.kind == "f":
        return np.fmod(a, b)
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    return np.where(b == 0, 0, a - _int_divide(a, safe) * safe).astype(a.dtype)


def _shift(operation, fill_negative: bool):
    """A shift by `b` bits; a shift by a negative amount or by the width or more gives 0 (or
    -1 for a negative `a` shifted right arithmetically), as StableHLO defines."""

    def shift(a, b):
        bits = a.dtype.itemsize * 8
        if b.size == 0 or (b.min() >= 0 and b.max() < bits):  # every amount in range: as is
            return operation(a, b).astype(a.dtype, copy=False)
        outside = (b < 0) | (b >= bits)
        shifted = operation(a, np.where(outside, 0, b).astype(a.dtype))
        fill = np.where(a < 0, -1, 0) if fill_negative else 0
        return np.where(outside, fill, shifted).astype(a.dtype)

    return shift


def _logical_right(a, b):
    unsigned = a.view(np.dtype(f"u{a.dtype.itemsize}"))
    return (unsigned >> b.astype(unsigned.dtype)).view(a.dtype)


@dataclass(frozen=True)
class BinaryOp:
    evaluate: Any
    jvp: Any
    transpose: Any = None
    allows_bool: bool = False
    float_only: bool = False
    integer_only: bool = False


BINARY: dict[str, BinaryOp] = {
    "add": BinaryOp(np.add, _add_jvp, _add_transpose),
    "sub": BinaryOp(np.subtract, _sub_jvp, _sub_transpose),
    "mul": BinaryOp(np.multiply, _mul_jvp, _mul_transpose),
    "div": BinaryOp(_divide, _div_jvp, _div_transpose),
    "pow": BinaryOp(_power, _pow_jvp, float_only=True),
    "max": BinaryOp(np.maximum, _chooser_jvp("gt"), allows_bool=True),
    "min": BinaryOp(np.minimum, _chooser_jvp("lt"), allows_bool=True),
    "atan2": BinaryOp(np.arctan2, _atan2_jvp, float_only=True),
    "rem": BinaryOp(_rem, _rem_jvp),
    "copysign": BinaryOp(np.copysign, _copysign_jvp, float_only=True),
    "and": BinaryOp(np.bitwise_and, _no_tangent, allows_bool=True, integer_only=True),
    "or": BinaryOp(np.bitwise_or, _no_tangent, allows_bool=True, integer_only=True),
    "xor": BinaryOp(np.bitwise_xor, _no_tangent, allows_bool=True, integer_only=True),
    "shift_left": BinaryOp(_shift(np.left_shift, False), _no_tangent, integer_only=True),
    "shift_right_logical": BinaryOp(_shift(_logical_right, False), _no_tangent, integer_only=True),
    "shift_right_arithmetic": BinaryOp(
        _shift(np.right_shift, True), _no_tangent, integer_only=True
    ),
}


def _binary_rule(kind: str, binary: BinaryOp) -> Rule:
    def infer(types, attrs):
        check_arity(kind, types, 2)
        check_same_dtype(kind, types)
        check_same_axes(kind, types)
        if types[0].dtype == bool_ and not binary.allows_bool:
            raise DTypeError(f"{kind} does not apply to bool operands ({describe(types)})")
        if binary.float_only:
            check_float(kind, types[0])
        if binary.integer_only and types[0].dtype.is_float:
            raise DTypeError(f"{kind} needs integer or bool operands, got {describe(types)}")
        return types[0]

    def evaluate(attrs, args, _):
        with np.errstate(all="ignore"):
            return binary.evaluate(*args)

    return Rule(kind, infer, evaluate, binary.jvp, binary.transpose, arity=2, batch=batch_same_kind)


for _kind, _binary in BINARY.items():
    register(_binary_rule(_kind, _binary))


# ---------------------------------------------------------------------------------------------
# compare, select, convert

COMPARISONS = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _compare_infer(types, attrs):
    check_arity("compare", types, 2)
    direction = attr("compare", attrs, "direction")
    if direction not in COMPARISONS:
        raise TypeRuleError(
            f"compare: unknown direction {direction!r}; use one of {', '.join(COMPARISONS)}"
        )
    check_same_dtype("compare", types)
    check_same_axes("compare", types)
    return types[0].with_dtype(bool_)


def _compare_evaluate(attrs, args, _):
    return COMPARISONS[attrs["direction"]](*args)


register(
    Rule(
        "compare",
        _compare_infer,
        _compare_evaluate,
        zero_tangent,
        arity=2,
        batch=batch_same_kind,
    )
)


def _select_infer(types, attrs):
    check_arity("select", types, 3)
    predicate, on_true, on_false = types
    if predicate.dtype != bool_:
        raise DTypeError(f"select: the predicate must be bool, got {predicate}")
    check_same_dtype("select", [on_true, on_false])
    check_same_axes("select", types)
    return on_true


def _select_jvp(e, op, p, t, out):
    _, on_true, on_false = t
    if isinstance(on_true, Zero) and isinstance(on_false, Zero):
        return Zero(op.type)
    return e.select(p[0], e.instantiate(on_true), e.instantiate(on_false))


def _select_transpose(e, op, ct, operands):
    """The cotangent goes to the branch that was taken; the other branch gets an exact zero."""
    predicate, on_true, on_false = operands
    if isinstance(predicate, Linear):
        raise TypeRuleError("select is not linear in its predicate")
    zeros = e.zeros(ct.ty)
    return [
        None,
        e.select(predicate, ct, zeros) if isinstance(on_true, Linear) else None,
        e.select(predicate, zeros, ct) if isinstance(on_false, Linear) else None,
    ]


register(
    Rule(
        "select",
        _select_infer,
        lambda attrs, args, _: np.where(*args),
        _select_jvp,
        _select_transpose,
        arity=3,
        batch=batch_same_kind,
    )
)


def _convert_infer(types, attrs):
    check_arity("convert", types, 1)
    return types[0].with_dtype(dtype_named(attr("convert", attrs, "dtype")))


def _convert_evaluate(attrs, args, _):
    target = dtype_named(attrs["dtype"])
    (x,) = args
    if x.dtype.kind == "f" and target.numpy.kind in "iu":
        # Float to integer truncates toward zero; NaN gives 0 and out-of-range values saturate,
        # so that every backend agrees on a defined result. The bounds are compared in float64,
        # where min and max + 1 (powers of two) are exact; clipping to max in the operand's
        # precision would round it up to 2**bits and overflow.
        info = np.iinfo(target.numpy)
        wide = np.trunc(x.astype(np.float64))
        high = wide >= float(info.max) + 1.0
        low = wide < float(info.min)
        inside = np.where(np.isnan(wide) | high | low, 0.0, wide)
        result = inside.astype(target.numpy)
        result = np.where(high, info.max, result)
        return np.where(low, info.min, result).astype(target.numpy)
    with np.errstate(all="ignore"):
        return x.astype(target.numpy)


def _convert_jvp(e, op, p, t, out):
    if not (op.type.dtype.is_float and p[0].ty.dtype.is_float):
        return Zero(op.type)
    return e.convert(t[0], op.type.dtype)


def _convert_transpose(e, op, ct, operands):
    return [e.convert(ct, operands[0].type.dtype)]


register(
    Rule(
        "convert",
        _convert_infer,
        _convert_evaluate,
        _convert_jvp,
        _convert_transpose,
        arity=1,
        batch=batch_same_kind,
    )
)


# ---------------------------------------------------------------------------------------------
# bitcast_convert

# The pairs of dtypes of one width between which bits can be reinterpreted (no 16-bit integers
# exist for f16 and bf16).
BITCASTS = {("f32", "i32"), ("i32", "f32"), ("f64", "i64"), ("i64", "f64")}


def _bitcast_infer(types, attrs):
    check_arity("bitcast_convert", types, 1)
    (t,) = types
    target = dtype_named(attr("bitcast_convert", attrs, "dtype"))
    if t.dtype != target and (t.dtype.name, target.name) not in BITCASTS:
        pairs = ", ".join(f"{a}->{b}" for a, b in sorted(BITCASTS))
        raise DTypeError(
            f"bitcast_convert: cannot reinterpret {t} as {target}; the bit casts are {pairs}"
        )
    return t.with_dtype(target)


def _bitcast_evaluate(attrs, args, _):
    array = np.asarray(args[0])
    # ascontiguousarray makes a scalar 1-d: the shape is put back
    return np.ascontiguousarray(array).view(dtype_named(attrs["dtype"]).numpy).reshape(array.shape)


register(
    Rule(
        "bitcast_convert",
        _bitcast_infer,
        _bitcast_evaluate,
        zero_tangent,
        arity=1,
        batch=batch_same_kind,
    )
)
