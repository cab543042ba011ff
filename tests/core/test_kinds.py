"""Every kind: its type rule (the result type) and its reference evaluation against NumPy.

Expected values are written with plain NumPy (or literally), never with accy's own evaluation
functions. Inputs are random but seeded.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import accy
from accy.core.arrays import ConstantArray
from accy.core.kinds import RULES, special
from accy.core.kinds.elementwise import UNARY
from accy.core.types import TensorType

from .core_helpers import assert_same, evaluate, evaluate_one, random_array, trace

f32, f64, f16, bf16 = accy.f32, accy.f64, accy.f16, accy.bf16
i32, i64, u8, bool_ = accy.i32, accy.i64, accy.u8, accy.bool_
spec = accy.spec

KINDS_TESTED_HERE: set[str] = set()


def kind_test(*kinds):
    """Record that the decorated test checks `kinds` (see test_every_kind_is_tested_here)."""
    KINDS_TESTED_HERE.update(kinds)
    return lambda test: test


def traced_once(program: accy.Program, kind: str) -> None:
    assert program.count(kind) >= 1, f"expected a {kind} operation in\n{program}"


# ---------------------------------------------------------------------------------------------
# creation: parameter, constant, iota


@kind_test("parameter")
@pytest.mark.parametrize("dtype", [f32, f64, f16, i32, i64, u8, bool_])
def test_parameter_has_its_spec_as_type_and_passes_its_input_through(rng, dtype):
    t = spec(dtype, row=2, col=3)
    program = trace([t, spec(dtype)], lambda b, a: (a[1], a[0]))
    assert program.parameter_types == (t, spec(dtype))
    assert program.output_types == (spec(dtype), t)
    x, s = random_array(rng, t), random_array(rng, spec(dtype))
    got_s, got_x = evaluate(program, x, s)
    assert_same(got_x, x)
    assert_same(got_s, s)


@kind_test("constant")
@pytest.mark.parametrize(
    "dtype, value, expected",
    [
        (f32, 1.5, np.float32(1.5)),
        (f64, -0.25, np.float64(-0.25)),
        (i32, -7, np.int32(-7)),
        (i64, 2**40, np.int64(2**40)),
        (u8, 255, np.uint8(255)),
        (bool_, True, np.True_),
        (f32, float("-inf"), np.float32(-np.inf)),
    ],
)
def test_splat_constant_fills_its_type(dtype, value, expected):
    t = spec(dtype, a=2, b=3)
    program = trace([], lambda b, a: b.full(t, value))
    traced_once(program, "constant")
    assert program.output_types == (t,)
    assert_same(evaluate_one(program), np.full((2, 3), expected))


@kind_test("constant")
def test_array_constant_keeps_row_major_values_in_its_layout():
    values = np.array([[1, -2, 3], [4, 5, -6]], dtype=np.int32)
    t = spec(i32, a=2, b=3)
    program = trace([], lambda b, a: b.constant(values, t))
    assert program.output_types == (t,)
    assert_same(evaluate_one(program), values)


def test_scalar_builds_a_rank_zero_constant():
    program = trace([], lambda b, a: b.scalar(f64, 2.5))
    assert program.output_types == (spec(f64),)
    assert_same(evaluate_one(program), np.float64(2.5).reshape(()))


def test_constant_rejects_a_value_of_the_wrong_kind_or_count():
    with pytest.raises(accy.DTypeError, match=r"constant 2.5 is not an integer but the dtype"):
        trace([], lambda b, a: b.full(spec(i32, a=2), 2.5))
    with pytest.raises(accy.DTypeError, match="does not fit in u8"):
        trace([], lambda b, a: b.full(spec(u8, a=2), 256))
    with pytest.raises(accy.AxisError, match=r"values have shape \(3,\) but i32\[a=2\] needs"):
        trace([], lambda b, a: b.constant([1, 2, 3], spec(i32, a=2)))
    with pytest.raises(accy.TypeRuleError, match="not a sequence; builder.constant"):
        trace(
            [], lambda b, a: b.emit("constant", [], {"type": spec(f32, a=2), "value": (1.0,) * 3})
        )
    three = ConstantArray.of([1.0, 2.0, 3.0], f32, (3,))
    with pytest.raises(accy.TypeRuleError, match=r"values of f32\[3\] given for f32\[a=2\]"):
        trace([], lambda b, a: b.emit("constant", [], {"type": spec(f32, a=2), "value": three}))


@kind_test("iota")
@pytest.mark.parametrize("dtype", [i32, i64, f32, u8])
def test_iota_counts_along_its_axis_and_repeats_over_the_others(dtype):
    t = spec(dtype, row=2, col=4)
    program = trace([], lambda b, a: b.iota(t, "col"))
    traced_once(program, "iota")
    assert program.output_types == (t,)
    expected = np.array([[0, 1, 2, 3], [0, 1, 2, 3]], dtype=dtype.numpy)
    assert_same(evaluate_one(program), expected)
    rows = trace([], lambda b, a: b.iota(t, "row"))
    assert_same(evaluate_one(rows), np.array([[0] * 4, [1] * 4], dtype=dtype.numpy))


def test_iota_rejects_bool_and_a_missing_axis():
    with pytest.raises(accy.DTypeError, match="iota cannot produce bool"):
        trace([], lambda b, a: b.iota(spec(bool_, a=2), "a"))
    with pytest.raises(accy.AxisError, match="iota: axis 'z' is not on i32\\[a=2\\]"):
        trace([], lambda b, a: b.iota(spec(i32, a=2), "z"))


# ---------------------------------------------------------------------------------------------
# unary


def _logistic(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_tanh_slope(x):
    # The complex-step derivative of _gelu_tanh, exact to float64's rounding (an independent
    # check of the formula): f'(x) = Im f(x + ih) / h.
    h = 1e-30
    return _gelu_tanh(x + 1j * h).imag / h


# op -> (hand-written NumPy in float64, input range or None for the standard normal)
UNARY_CASES = {
    "neg": (lambda x: -x, None),
    "exp": (np.exp, None),
    "log": (np.log, (0.1, 5.0)),
    "log1p": (np.log1p, (-0.5, 5.0)),
    "expm1": (np.expm1, None),
    "sin": (np.sin, None),
    "cos": (np.cos, None),
    "tan": (np.tan, (-1.2, 1.2)),
    "tanh": (np.tanh, None),
    "logistic": (_logistic, (-30.0, 30.0)),
    "gelu_tanh": (_gelu_tanh, (-6.0, 6.0)),
    "gelu_tanh_slope": (_gelu_tanh_slope, (-6.0, 6.0)),
    "sqrt": (np.sqrt, (0.0, 9.0)),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), (0.1, 9.0)),
    "abs": (np.abs, None),
    "sign": (np.sign, None),
    "floor": (np.floor, (-5.0, 5.0)),
    "ceil": (np.ceil, (-5.0, 5.0)),
    "round": (np.round, (-5.0, 5.0)),
    "stop_gradient": (lambda x: x, None),
    "asin": (np.arcsin, (-0.99, 0.99)),
    "acos": (np.arccos, (-0.99, 0.99)),
    "atan": (np.arctan, None),
    "sinh": (np.sinh, None),
    "cosh": (np.cosh, None),
    "asinh": (np.arcsinh, None),
    "acosh": (np.arccosh, (1.0, 9.0)),
    "atanh": (np.arctanh, (-0.99, 0.99)),
    "erf": (np.frompyfunc(math.erf, 1, 1), None),
    "erfc": (np.frompyfunc(math.erfc, 1, 1), None),
    "lgamma": (np.frompyfunc(math.lgamma, 1, 1), (0.1, 9.0)),
    # Checked independently (inverse of erf, derivative of lgamma) in test_math_ops.
    "erf_inv": (special.erf_inv, (-0.99, 0.99)),
    "digamma": (special.digamma, (-5.0, 9.0)),
    "trigamma": (special.trigamma, (-5.0, 9.0)),
}


def test_unary_cases_cover_every_unary_op():
    assert set(UNARY) - {"not"} <= set(UNARY_CASES)


@kind_test("unary")
@pytest.mark.parametrize("op", sorted(set(UNARY_CASES) & set(UNARY)))
@pytest.mark.parametrize("dtype", [f32, f64])
def test_unary_float_op_matches_numpy(rng, op, dtype):
    reference, domain = UNARY_CASES[op]
    t = spec(dtype, row=3, col=5)
    program = trace([t], lambda b, a: b.unary(op, a[0]))
    traced_once(program, "unary")
    assert program.output_types == (t,)
    x = random_array(rng, t, *(domain or (None, None)))
    expected = reference(x.astype(np.float64)).astype(dtype.numpy)
    tolerance = 2e-6 if dtype == f32 else 1e-14
    assert_same(evaluate_one(program, x), expected, rtol=tolerance, atol=tolerance)


@kind_test("unary")
@pytest.mark.parametrize("dtype", [i32, i64])
@pytest.mark.parametrize(
    "op, expected",
    [("neg", [3, 0, -2, 7]), ("abs", [3, 0, 2, 7]), ("sign", [-1, 0, 1, -1])],
)
def test_unary_integer_ops_apply_to_integers(dtype, op, expected):
    t = spec(dtype, lane=4)
    program = trace([t], lambda b, a: b.unary(op, a[0]))
    assert program.output_types == (t,)
    x = np.array([-3, 0, 2, -7], dtype=dtype.numpy)
    assert_same(evaluate_one(program, x), np.array(expected, dtype=dtype.numpy))


@kind_test("unary")
def test_unary_not_negates_bools():
    t = spec(bool_, lane=3)
    program = trace([t], lambda b, a: a[0].logical_not())
    assert program.output_types == (t,)
    assert_same(
        evaluate_one(program, np.array([True, False, True])), np.array([False, True, False])
    )


NEW_BINARY_CASES = {  # kind -> (dtype, NumPy); more cases in test_math_ops
    "atan2": (f64, np.arctan2),
    "rem": (f64, np.fmod),
    "copysign": (f64, np.copysign),
    "and": (i32, np.bitwise_and),
    "or": (i64, np.bitwise_or),
    "xor": (i32, np.bitwise_xor),
    "shift_left": (i32, lambda a, b: np.left_shift(a, b % 8)),
    "shift_right_logical": (i64, lambda a, b: np.right_shift(a, b % 8)),
    "shift_right_arithmetic": (i32, lambda a, b: np.right_shift(a, b % 8)),
}


@kind_test(*NEW_BINARY_CASES, "bitcast_convert")
@pytest.mark.parametrize("kind", sorted(NEW_BINARY_CASES))
def test_more_binary_kinds_match_numpy(kind):
    dtype, reference = NEW_BINARY_CASES[kind]
    a = np.array([7, 12, 3, 5], dtype.numpy)  # non-negative: shifts of these agree with NumPy
    b = np.array([2, -3, 1, 6], dtype.numpy) % 8
    program = trace([spec(dtype, lane=4)] * 2, lambda bld, x: bld.binary(kind, x[0], x[1]))
    traced_once(program, kind)
    assert_same(evaluate_one(program, a, b), reference(a, b).astype(dtype.numpy))
    bits = trace([spec(f32, lane=4)], lambda bld, x: x[0].bitcast_convert(i32))
    floats = a.astype(np.float32)
    assert_same(evaluate_one(bits, floats), floats.view(np.int32))


def test_round_sends_ties_to_even():
    program = trace([spec(f32, lane=6)], lambda b, a: a[0].round())
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4], dtype=np.float32)
    expected = np.array([0.0, 2.0, 2.0, -0.0, -2.0, 2.0], dtype=np.float32)
    assert_same(evaluate_one(program, x), expected)


def test_logistic_does_not_overflow_for_large_inputs():
    program = trace([spec(f32, lane=3)], lambda b, a: a[0].logistic())
    x = np.array([-1000.0, 0.0, 1000.0], dtype=np.float32)
    assert_same(evaluate_one(program, x), np.array([0.0, 0.5, 1.0], dtype=np.float32))


def test_unary_value_methods_record_the_named_op():
    t = spec(f32, lane=2)
    methods = ["neg", "exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "logistic"]
    methods += ["sqrt", "rsqrt", "abs", "sign", "floor", "ceil", "round"]
    for name in methods:
        program = trace([t], lambda b, a, name=name: getattr(a[0], name)())
        (op,) = [op for op in program.operations if op.kind == "unary"]
        assert op.attrs["op"] == name


@pytest.mark.parametrize(
    "op, dtype, message",
    [
        ("exp", i32, "unary exp needs a floating-point operand, got i32"),
        ("not", f32, "unary not needs a bool or integer operand"),
        ("neg", bool_, "unary neg does not apply to bool operands"),
        ("erfx", f32, "unary: unknown op .erfx.; the unary ops are neg, exp"),
    ],
)
def test_unary_type_rule_rejects(op, dtype, message):
    with pytest.raises(accy.TypeRuleError, match=message):
        trace([spec(dtype, lane=2)], lambda b, a: b.unary(op, a[0]))


# ---------------------------------------------------------------------------------------------
# binary kinds: add sub mul div pow max min


def _truncating_divide(a, b):
    """Hand-written C division: toward zero; x / 0 == 0."""
    out = np.zeros(a.shape, dtype=a.dtype)
    for index in np.ndindex(a.shape):
        x, y = int(a[index]), int(b[index])
        if y != 0:
            q = abs(x) // abs(y)
            out[index] = q if (x < 0) == (y < 0) else -q
    return out


BINARY_REFERENCE = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "max": np.maximum,
    "min": np.minimum,
}


@kind_test("add", "sub", "mul", "max", "min")
@pytest.mark.parametrize("kind", sorted(BINARY_REFERENCE))
@pytest.mark.parametrize("dtype", [f32, f64, f16, i32, i64, u8])
def test_binary_op_matches_numpy(rng, kind, dtype):
    t = spec(dtype, row=3, col=4)
    program = trace([t, t], lambda b, a: b.binary(kind, a[0], a[1]))
    traced_once(program, kind)
    assert program.output_types == (t,)
    x, y = random_array(rng, t), random_array(rng, t)
    with np.errstate(over="ignore"):
        expected = BINARY_REFERENCE[kind](x, y)
    assert_same(evaluate_one(program, x, y), expected)


@kind_test("max", "min")
def test_max_and_min_apply_to_bools_as_or_and_and():
    t = spec(bool_, lane=4)
    x = np.array([True, True, False, False])
    y = np.array([True, False, True, False])
    program = trace([t, t], lambda b, a: (a[0].max(a[1]), a[0].min(a[1])))
    assert program.output_types == (t, t)
    either, both = evaluate(program, x, y)
    assert_same(either, x | y)
    assert_same(both, x & y)


def test_max_and_min_propagate_nan_like_numpy():
    t = spec(f32, lane=2)
    program = trace([t, t], lambda b, a: (a[0].max(a[1]), a[0].min(a[1])))
    x = np.array([np.nan, 1.0], dtype=np.float32)
    y = np.array([0.0, np.nan], dtype=np.float32)
    high, low = evaluate(program, x, y)
    assert np.isnan(high).all() and np.isnan(low).all()


def test_unsigned_arithmetic_wraps_around():
    t = spec(u8, lane=3)
    program = trace([t, t], lambda b, a: (a[0] + a[1], a[0] - a[1]))
    x = np.array([200, 0, 255], dtype=np.uint8)
    y = np.array([100, 1, 255], dtype=np.uint8)
    total, difference = evaluate(program, x, y)
    assert_same(total, np.array([44, 1, 254], dtype=np.uint8))
    assert_same(difference, np.array([100, 255, 0], dtype=np.uint8))


@kind_test("div")
@pytest.mark.parametrize("dtype", [f32, f64, f16])
def test_float_division_matches_numpy(rng, dtype):
    t = spec(dtype, row=3, col=4)
    program = trace([t, t], lambda b, a: a[0] / a[1])
    traced_once(program, "div")
    assert program.output_types == (t,)
    x, y = random_array(rng, t), random_array(rng, t, 0.5, 2.0)
    assert_same(evaluate_one(program, x, y), x / y)


def test_float_division_by_zero_follows_ieee():
    program = trace([spec(f32, lane=3)] * 2, lambda b, a: a[0] / a[1])
    x = np.array([1.0, -1.0, 0.0], dtype=np.float32)
    got = evaluate_one(program, x, np.zeros(3, np.float32))
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])


@kind_test("div")
@pytest.mark.parametrize("dtype", [i32, i64, u8])
def test_integer_division_truncates_toward_zero_and_division_by_zero_gives_zero(rng, dtype):
    t = spec(dtype, lane=40)
    program = trace([t, t], lambda b, a: a[0] / a[1])
    assert program.output_types == (t,)
    x = random_array(rng, t)
    y = random_array(rng, t, -6, 6) if dtype != u8 else random_array(rng, t) % 6
    y[:4] = 0
    assert_same(evaluate_one(program, x, y), _truncating_divide(x, y))


def test_integer_division_of_the_extremes():
    program = trace([spec(i32, lane=6)] * 2, lambda b, a: a[0] / a[1])
    low = -(2**31)
    x = np.array([low, low, 2**31 - 1, -7, 7, low], dtype=np.int32)
    y = np.array([2, 1, -1, 2, -2, 0], dtype=np.int32)
    expected = np.array([-(2**30), low, -(2**31 - 1), -3, -3, 0], dtype=np.int32)
    assert_same(evaluate_one(program, x, y), expected)


@kind_test("pow")
@pytest.mark.parametrize("dtype", [f32, f64])
def test_pow_matches_numpy(rng, dtype):
    t = spec(dtype, row=2, col=5)
    program = trace([t, t], lambda b, a: a[0] ** a[1])
    traced_once(program, "pow")
    assert program.output_types == (t,)
    x, y = random_array(rng, t, 0.1, 3.0), random_array(rng, t, -2.0, 2.0)
    expected = np.power(x.astype(np.float64), y).astype(dtype.numpy)
    assert_same(evaluate_one(program, x, y), expected, rtol=1e-6)


@pytest.mark.parametrize(
    "kind, dtype, message",
    [
        ("pow", i32, "pow needs a floating-point operand, got i32"),
        ("add", bool_, "add does not apply to bool operands"),
        ("div", bool_, "div does not apply to bool operands"),
    ],
)
def test_binary_type_rule_rejects(kind, dtype, message):
    t = spec(dtype, lane=2)
    with pytest.raises(accy.TypeRuleError, match=message):
        trace([t, t], lambda b, a: b.binary(kind, a[0], a[1]))


def test_binary_type_rule_needs_the_same_axes_in_the_same_order_at_ir_level():
    x, y = spec(f32, a=2, b=3), spec(f32, b=3, a=2)
    with pytest.raises(accy.AxisError, match="same axes in the same order at the IR level"):
        RULES["add"].infer((x, y), accy.core.Attrs())
    assert RULES["add"].infer((x, x), accy.core.Attrs()) == x


def test_python_scalars_become_constants_of_the_other_operands_dtype():
    t = spec(f32, lane=3)
    program = trace([t], lambda b, a: (2.0 * a[0] - 1) / 4 + (3 - a[0]) ** 2)
    x = np.array([1.0, 2.0, -3.0], dtype=np.float32)
    expected = (2.0 * x - 1) / 4 + (3 - x) ** 2
    assert_same(evaluate_one(program, x), expected.astype(np.float32))
    negated = trace([spec(i32, lane=2)], lambda b, a: -a[0] * 3)
    assert_same(evaluate_one(negated, np.array([1, -2], np.int32)), np.array([-3, 6], np.int32))


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


@kind_test("compare")
@pytest.mark.parametrize("direction", sorted(COMPARISONS))
@pytest.mark.parametrize("dtype", [f32, i32, u8, bool_])
def test_compare_gives_bools(rng, direction, dtype):
    t = spec(dtype, row=4, col=5)
    program = trace([t, t], lambda b, a: b.compare(direction, a[0], a[1]))
    traced_once(program, "compare")
    assert program.output_types == (t.with_dtype(bool_),)
    x, y = random_array(rng, t), random_array(rng, t)
    y[0] = x[0]  # some ties
    assert_same(evaluate_one(program, x, y), COMPARISONS[direction](x, y))


def test_comparison_operators_and_methods_record_their_direction():
    t = spec(f32, lane=2)
    program = trace(
        [t, t],
        lambda b, a: (
            a[0] < a[1],
            a[0] <= a[1],
            a[0] > a[1],
            a[0] >= a[1],
            a[0].eq(a[1]),
            a[0].ne(a[1]),
        ),
    )
    directions = [op.attrs["direction"] for op in program.operations if op.kind == "compare"]
    assert directions == ["lt", "le", "gt", "ge", "eq", "ne"]


def test_compare_rejects_an_unknown_direction():
    t = spec(f32, lane=2)
    with pytest.raises(accy.TypeRuleError, match="compare: unknown direction 'lg'; use one of eq"):
        trace([t, t], lambda b, a: b.compare("lg", a[0], a[1]))


@kind_test("select")
@pytest.mark.parametrize("dtype", [f32, i64, bool_])
def test_select_takes_on_true_where_the_predicate_holds(rng, dtype):
    t = spec(dtype, row=3, col=4)
    p = spec(bool_, row=3, col=4)
    program = trace([p, t, t], lambda b, a: b.select(a[0], a[1], a[2]))
    traced_once(program, "select")
    assert program.output_types == (t,)
    c, x, y = random_array(rng, p), random_array(rng, t), random_array(rng, t)
    assert_same(evaluate_one(program, c, x, y), np.where(c, x, y))


def test_select_broadcasts_predicate_and_scalars_by_name():
    program = trace(
        [spec(f32, lane=3, row=2)],
        lambda b, a: b.select(a[0] > 0.0, a[0], 0.0),  # relu
    )
    x = np.array([[1.0, -1.0], [-2.0, 3.0], [0.5, -0.5]], dtype=np.float32)
    assert program.output_types == (spec(f32, lane=3, row=2),)
    assert_same(evaluate_one(program, x), np.maximum(x, 0))


def test_select_needs_a_bool_predicate():
    t = spec(f32, lane=2)
    with pytest.raises(accy.DTypeError, match="select: the predicate must be bool, got f32"):
        trace([t, t, t], lambda b, a: b.select(a[0], a[1], a[2]))


@kind_test("convert")
@pytest.mark.parametrize(
    "source, target",
    [(i32, f32), (f32, f64), (f64, f32), (u8, i32), (bool_, f32), (i32, i64), (f32, f16)],
)
def test_convert_between_dtypes_matches_numpy_casts(rng, source, target):
    t = spec(source, row=3, col=4)
    program = trace([t], lambda b, a: a[0].convert(target))
    traced_once(program, "convert")
    assert program.output_types == (t.with_dtype(target),)
    x = random_array(rng, t)
    assert_same(evaluate_one(program, x), x.astype(target.numpy))


def test_convert_float_to_integer_truncates_toward_zero():
    program = trace([spec(f32, lane=6)], lambda b, a: a[0].convert(i32))
    x = np.array([2.7, -2.7, 0.5, -0.5, 7.0, -0.0], dtype=np.float32)
    assert_same(evaluate_one(program, x), np.array([2, -2, 0, 0, 7, 0], dtype=np.int32))


@pytest.mark.parametrize(
    "source, target",
    [(f32, i32), (f64, i32), (f32, i64), (f64, i64), (f32, u8), (f16, i32), (f16, u8)],
)
def test_convert_float_to_integer_saturates_and_sends_nan_to_zero(source, target):
    info = np.iinfo(target.numpy)
    big = float(np.finfo(source.numpy).max)
    values = [math.nan, math.inf, -math.inf, big, -big, 3.7, -3.7, 255.9]

    def saturated(v: float) -> int:
        """Truncate toward zero, then clamp; NaN gives 0 (Python ints cannot overflow)."""
        if math.isnan(v):
            return 0
        if math.isinf(v):
            return info.max if v > 0 else info.min
        return min(max(math.trunc(v), info.min), info.max)

    program = trace([spec(source, lane=len(values))], lambda b, a: a[0].convert(target))
    got = evaluate_one(program, np.array(values, dtype=source.numpy))
    expected = [saturated(float(v)) for v in np.array(values, dtype=source.numpy)]
    assert_same(got, np.array(expected, dtype=target.numpy))


def test_convert_saturates_just_past_the_int32_range():
    x = np.array([2.0**31, -(2.0**31) - 4096.0, 2.0**31 - 128.0, -(2.0**31)], dtype=np.float32)
    program = trace([spec(f32, lane=4)], lambda b, a: a[0].convert(i32))
    expected = np.array([2**31 - 1, -(2**31), 2**31 - 128, -(2**31)], dtype=np.int32)
    assert_same(evaluate_one(program, x), expected)


def test_convert_to_bool_is_nonzero_and_from_bool_is_zero_or_one():
    program = trace(
        [spec(f32, lane=4), spec(bool_, lane=2)],
        lambda b, a: (a[0].convert(bool_), a[1].convert(i32)),
    )
    flags, ints = evaluate(
        program, np.array([0.0, -0.0, 2.5, np.nan], np.float32), np.array([True, False])
    )
    assert_same(flags, np.array([False, False, True, True]))
    assert_same(ints, np.array([1, 0], np.int32))


def test_convert_to_bf16_rounds_to_nearest_even():
    program = trace([spec(f32, lane=4)], lambda b, a: a[0].convert(bf16))
    assert program.output_types == (spec(bf16, lane=4),)
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-7, 3.0], dtype=np.float32)
    expected = np.array([1.0, 1.0 + 2**-6, 1.0 + 2**-7, 3.0], dtype=ml_dtypes.bfloat16)
    assert_same(evaluate_one(program, x), expected)


def test_bf16_arithmetic_rounds_every_result():
    t = spec(bf16, lane=2)
    program = trace([t, t], lambda b, a: a[0] + a[1])
    x = np.array([1.0, 256.0], dtype=ml_dtypes.bfloat16)
    y = np.array([2**-9, 1.0], dtype=ml_dtypes.bfloat16)
    # 1 + 2**-9 rounds back to 1; 257 is not a bf16 (8 significant bits) and ties to 256.
    assert_same(evaluate_one(program, x, y), np.array([1.0, 256.0], dtype=ml_dtypes.bfloat16))


def test_convert_to_the_same_dtype_records_nothing():
    program = trace([spec(f32, lane=2)], lambda b, a: a[0].convert(f32))
    assert program.count("convert") == 0


# ---------------------------------------------------------------------------------------------
# layout: broadcast_in_dim, transpose, reshape, slice, pad, concatenate


@kind_test("broadcast_in_dim")
@pytest.mark.parametrize("dtype", [f32, i32, bool_])
def test_elementwise_ops_broadcast_by_name_left_axes_first(rng, dtype):
    x_t, y_t = spec(dtype, b=3, a=2), spec(dtype, c=4, a=2)
    program = trace([x_t, y_t], lambda b, a: a[0].max(a[1]))
    traced_once(program, "broadcast_in_dim")
    assert program.output_types == (spec(dtype, b=3, a=2, c=4),)
    x, y = random_array(rng, x_t), random_array(rng, y_t)
    # x[b, a] and y[c, a] meet on a; laid out as [b, a, c].
    expected = np.maximum(x[:, :, None], np.transpose(y)[None, :, :])
    assert_same(evaluate_one(program, x, y), expected)


@kind_test("broadcast_in_dim")
def test_broadcast_to_places_existing_axes_by_name(rng):
    target = spec(f32, c=4, a=2, b=3)
    program = trace([spec(f32, b=3, a=2)], lambda b, a: a[0].broadcast_to(target))
    assert program.output_types == (target,)
    x = random_array(rng, spec(f32, b=3, a=2))
    assert_same(evaluate_one(program, x), np.broadcast_to(x.T[None], (4, 2, 3)))


def test_broadcast_in_dim_type_rule_only_adds_axes():
    x = spec(f32, a=2, b=3)
    attrs = accy.core.Attrs(shape=(("a", 2), ("c", 5)))
    with pytest.raises(accy.AxisError, match="axis 'b' of the operand .* is not in the result"):
        RULES["broadcast_in_dim"].infer((x,), attrs)
    attrs = accy.core.Attrs(shape=(("b", 4), ("a", 2)))
    with pytest.raises(accy.AxisError, match="axis 'b' has extent 3 in the operand"):
        RULES["broadcast_in_dim"].infer((x,), attrs)


@kind_test("transpose")
@pytest.mark.parametrize("dtype", [f64, u8])
def test_transpose_lays_axes_out_in_the_given_order(rng, dtype):
    t = spec(dtype, a=2, b=3, c=4)
    program = trace([t], lambda b, a: a[0].transpose("c", "a", "b"))
    traced_once(program, "transpose")
    assert program.output_types == (spec(dtype, c=4, a=2, b=3),)
    x = random_array(rng, t)
    assert_same(evaluate_one(program, x), np.transpose(x, (2, 0, 1)))


def test_transpose_must_name_each_axis_once():
    with pytest.raises(accy.AxisError, match=r"order \['a', 'a'\] must name each axis"):
        trace([spec(f32, a=2, b=3)], lambda b, a: a[0].transpose("a", "a"))


@kind_test("reshape")
def test_merge_and_split_reshape_row_major(rng):
    t = spec(i32, a=2, b=3, c=4)
    program = trace(
        [t],
        lambda b, a: (a[0].merge(["c", "a"], "ca"), a[0].split("c", hi=2, lo=2)),
    )
    traced_once(program, "reshape")
    # The merged axis takes the place of the first of its axes in the layout.
    assert program.output_types == (spec(i32, ca=8, b=3), spec(i32, a=2, b=3, hi=2, lo=2))
    x = random_array(rng, t)
    merged, split = evaluate(program, x)
    assert_same(merged, np.transpose(x, (2, 0, 1)).reshape(8, 3))
    assert_same(split, x.reshape(2, 3, 2, 2))


@kind_test("reshape")
def test_rename_changes_only_the_name(rng):
    t = spec(f32, token=4, channel=3)
    program = trace([t], lambda b, a: a[0].rename("token", "key"))
    assert program.output_types == (spec(f32, key=4, channel=3),)
    x = random_array(rng, t)
    assert_same(evaluate_one(program, x), x)


def test_reshape_keeps_the_number_of_elements():
    with pytest.raises(accy.AxisError, match="split: parts .* have 6 elements but axis 'a'"):
        trace([spec(f32, a=4)], lambda b, a: a[0].split("a", x=2, y=3))
    with pytest.raises(accy.AxisError, match="reshape: f32\\[a=4\\] has 4 elements but"):
        trace([spec(f32, a=4)], lambda b, a: b.reshape(a[0], [("a", 5)]))


@kind_test("slice")
@pytest.mark.parametrize("dtype", [f32, i64])
def test_slice_takes_start_stop_step_along_a_named_axis(rng, dtype):
    t = spec(dtype, a=3, b=10)
    program = trace([t], lambda b, a: a[0].slice("b", 1, 8, 3))
    traced_once(program, "slice")
    assert program.output_types == (spec(dtype, a=3, b=3),)
    x = random_array(rng, t)
    assert_same(evaluate_one(program, x), x[:, 1:8:3])


def test_slice_to_the_end_and_empty_slices():
    t = spec(f32, a=5)
    program = trace([t], lambda b, a: (a[0].slice("a", 2), a[0].slice("a", 3, 3)))
    assert program.output_types == (spec(f32, a=3), spec(f32, a=0))
    x = np.arange(5, dtype=np.float32)
    tail, empty = evaluate(program, x)
    assert_same(tail, x[2:])
    assert_same(empty, x[3:3])


def test_slice_bounds_are_checked():
    with pytest.raises(accy.AxisError, match="the slice 2:6 must satisfy 0 <= start <= stop <= 5"):
        trace([spec(f32, a=5)], lambda b, a: a[0].slice("a", 2, 6))
    with pytest.raises(accy.TypeRuleError, match="strides of axis 'a' must be an int >= 1"):
        trace([spec(f32, a=5)], lambda b, a: a[0].slice("a", 0, 5, 0))


@kind_test("pad")
@pytest.mark.parametrize("dtype", [f32, i32])
def test_pad_adds_low_high_and_interior_elements(rng, dtype):
    t = spec(dtype, a=2, b=3)
    program = trace([t], lambda b, a: a[0].pad("b", low=1, high=2, value=7, interior=1))
    traced_once(program, "pad")
    assert program.output_types == (spec(dtype, a=2, b=8),)
    x = random_array(rng, t)
    expected = np.full((2, 8), 7, dtype=dtype.numpy)
    expected[:, 1:6:2] = x
    assert_same(evaluate_one(program, x), expected)


def test_pad_with_a_traced_value_and_an_empty_axis():
    program = trace(
        [spec(f32, a=0), spec(f32)], lambda b, a: a[0].pad("a", low=2, high=1, value=a[1])
    )
    assert program.output_types == (spec(f32, a=3),)
    got = evaluate_one(program, np.zeros(0, np.float32), np.float32(-1.5))
    assert_same(got, np.full(3, -1.5, np.float32))


@kind_test("concatenate")
@pytest.mark.parametrize("dtype", [f32, bool_])
def test_concatenate_joins_along_an_axis_matching_other_axes_by_name(rng, dtype):
    x_t, y_t, z_t = spec(dtype, a=2, b=3), spec(dtype, b=3, a=4), spec(dtype, a=1, b=3)
    program = trace([x_t, y_t, z_t], lambda b, a: b.concatenate(a, "a"))
    traced_once(program, "concatenate")
    assert program.output_types == (spec(dtype, a=7, b=3),)
    x, y, z = random_array(rng, x_t), random_array(rng, y_t), random_array(rng, z_t)
    assert_same(evaluate_one(program, x, y, z), np.concatenate([x, y.T, z], axis=0))


def test_concatenate_needs_equal_other_extents():
    with pytest.raises(accy.AxisError, match="equal extents except along 'a'"):
        trace([spec(f32, a=2, b=3), spec(f32, a=2, b=4)], lambda b, a: b.concatenate(a, "a"))


# ---------------------------------------------------------------------------------------------
# reduce


REDUCERS = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}


@kind_test("reduce")
@pytest.mark.parametrize("op", sorted(REDUCERS))
@pytest.mark.parametrize("dtype", [f32, f64, i32, i64])
def test_reduce_over_named_axes_starts_from_its_init(rng, op, dtype):
    t = spec(dtype, a=3, b=4, c=2)
    program = trace([t, spec(dtype)], lambda b, a: a[0].reduce(a[1], op, ["c", "a"]))
    traced_once(program, "reduce")
    assert program.output_types == (spec(dtype, b=4),)
    x = random_array(rng, t, *((0.5, 1.5) if op == "prod" and dtype.is_float else (-4, 5)))
    init = random_array(rng, spec(dtype))
    combine = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[op]
    with np.errstate(over="ignore"):
        expected = combine(REDUCERS[op](x, axis=(0, 2)), init).astype(dtype.numpy)
    tolerance = 1e-5 if dtype.is_float else 0.0
    assert_same(evaluate_one(program, x, init), expected, rtol=tolerance)


@kind_test("reduce")
def test_reduce_max_and_min_of_bools_are_any_and_all():
    t = spec(bool_, row=2, col=3)
    program = trace([t], lambda b, a: (a[0].max("col"), a[0].min("col")))
    x = np.array([[True, False, False], [True, True, True]])
    anyone, everyone = evaluate(program, x)
    assert_same(anyone, np.array([True, True]))
    assert_same(everyone, np.array([False, True]))


def test_sum_max_min_prod_mean_without_axes_reduce_everything(rng):
    t = spec(f64, a=3, b=2)
    program = trace(
        [t], lambda b, a: (a[0].sum(), a[0].max(), a[0].min(), a[0].prod(), a[0].mean())
    )
    assert program.output_types == (spec(f64),) * 5
    x = random_array(rng, t)
    got = evaluate(program, x)
    for value, expected in zip(got, [x.sum(), x.max(), x.min(), x.prod(), x.mean()], strict=True):
        assert_same(value, np.asarray(expected), rtol=1e-12)


def test_reduce_max_with_lowest_init_handles_all_negative_inputs():
    program = trace([spec(i32, lane=3)], lambda b, a: a[0].max("lane"))
    assert_same(evaluate_one(program, np.array([-9, -2, -5], np.int32)), np.int32(-2).reshape(()))


def test_reduce_over_an_empty_axis_gives_the_init():
    program = trace([spec(f32, a=0, b=2)], lambda b, a: (a[0].sum("a"), a[0].max("a")))
    total, highest = evaluate(program, np.zeros((0, 2), np.float32))
    assert_same(total, np.zeros(2, np.float32))
    assert_same(highest, np.full(2, -np.inf, np.float32))


def test_reduce_type_rule_rejects():
    t = spec(f32, a=2)
    with pytest.raises(accy.TypeRuleError, match="reduce: unknown op 'mean'"):
        trace([t], lambda b, a: a[0].reduce(0.0, "mean", "a"))
    with pytest.raises(accy.AxisError, match=r"reduce: axes \['a', 'a'\] name an axis twice"):
        trace([t], lambda b, a: a[0].sum(["a", "a"]))
    with pytest.raises(accy.AxisError, match="init value .* must be a scalar"):
        trace([t, t], lambda b, a: a[0].reduce(a[1], "sum", "a"))
    with pytest.raises(accy.DTypeError, match="reduce sum does not apply to bool"):
        trace([spec(bool_, a=2)], lambda b, a: a[0].sum("a"))


# ---------------------------------------------------------------------------------------------
# dot_general


@kind_test("dot_general")
@pytest.mark.parametrize("dtype", [f32, f64, i32])
def test_contract_sums_products_over_named_axes_and_keeps_shared_axes_as_batch(rng, dtype):
    x_t, y_t = spec(dtype, m=2, b=3, k=4), spec(dtype, k=4, n=5, b=3)
    program = trace([x_t, y_t], lambda b, a: a[0].contract(a[1], "k"))
    traced_once(program, "dot_general")
    assert program.output_types == (spec(dtype, b=3, m=2, n=5),)
    x, y = random_array(rng, x_t), random_array(rng, y_t)
    expected = np.zeros((3, 2, 5), dtype=np.float64)
    for bi in range(3):
        for mi in range(2):
            for ni in range(5):
                expected[bi, mi, ni] = sum(
                    float(x[mi, bi, ki]) * float(y[ki, ni, bi]) for ki in range(4)
                )
    tolerance = {f32: 1e-5, f64: 1e-12, i32: 0.0}[dtype]
    got = evaluate_one(program, x, y)
    assert_same(got, expected.astype(dtype.numpy), rtol=tolerance, atol=tolerance)


@kind_test("dot_general")
def test_dot_general_with_positional_dimensions(rng):
    x_t, y_t = spec(f64, k=3, bb=2, m=4), spec(f64, bb=2, n=5, k=3)
    program = trace([x_t, y_t], lambda b, a: b.dot_general(a[0], a[1], [0], [2], [1], [0]))
    assert program.output_types == (spec(f64, bb=2, m=4, n=5),)
    x, y = random_array(rng, x_t), random_array(rng, y_t)
    expected = np.einsum("kbm,bnk->bmn", x, y)
    assert_same(evaluate_one(program, x, y), expected, rtol=1e-12)


def test_contract_over_several_axes_and_over_nothing(rng):
    x_t, y_t = spec(f64, a=2, b=3, c=4), spec(f64, c=4, a=2, d=5)
    program = trace(
        [x_t, y_t],
        lambda b, a: (
            a[0].contract(a[1], ["a", "c"]),
            a[0].contract(b.iota(spec(f64, e=2), "e"), []),
        ),
    )
    assert program.output_types == (spec(f64, b=3, d=5), spec(f64, a=2, b=3, c=4, e=2))
    x, y = random_array(rng, x_t), random_array(rng, y_t)
    both, outer = evaluate(program, x, y)
    assert_same(both, np.einsum("abc,cad->bd", x, y), rtol=1e-12)
    assert_same(outer, x[..., None] * np.arange(2.0))


def test_dot_general_type_rule_rejects():
    x, y = spec(f32, a=2, b=3), spec(f32, a=3, c=2)
    infer = RULES["dot_general"].infer

    def attrs(lc, rc, lb=(), rb=()):
        return accy.core.Attrs(lhs_contracting=lc, rhs_contracting=rc, lhs_batch=lb, rhs_batch=rb)

    with pytest.raises(
        accy.AxisError, match="contracting axes 'b' of .* 'c' of .* different extents"
    ):
        infer((x, y), attrs((1,), (1,)))
    with pytest.raises(accy.AxisError, match=r"lhs dimensions \[2\] out of range"):
        infer((x, y), attrs((2,), (0,)))
    with pytest.raises(accy.AxisError, match="as many contracting dimensions"):
        infer((x, y), attrs((1,), ()))
    with pytest.raises(accy.AxisError, match="the result would have axis 'a' twice"):
        infer((x, spec(f32, b=3, a=2)), attrs((1,), (0,)))
    assert infer((x, y), attrs((1,), (0,))) == spec(f32, a=2, c=2)


# ---------------------------------------------------------------------------------------------
# gather, scatter_add


@kind_test("gather")
@pytest.mark.parametrize("index_dtype", [i32, i64])
@pytest.mark.parametrize("dtype", [f32, i32, bool_])
def test_gather_replaces_the_axis_in_place_by_the_index_axes(rng, index_dtype, dtype):
    table_t = spec(dtype, row=2, vocab=5, channel=3)
    index_t = spec(index_dtype, batch=2, token=4)
    program = trace([table_t, index_t], lambda b, a: a[0].gather(a[1], "vocab"))
    traced_once(program, "gather")
    assert program.output_types == (spec(dtype, row=2, batch=2, token=4, channel=3),)
    table = random_array(rng, table_t)
    indices = rng.integers(0, 5, size=(2, 4)).astype(index_dtype.numpy)
    expected = np.empty((2, 2, 4, 3), dtype=dtype.numpy)
    for r in range(2):
        for bi in range(2):
            for t in range(4):
                expected[r, bi, t] = table[r, indices[bi, t]]
    assert_same(evaluate_one(program, table, indices), expected)


def test_gather_clamps_out_of_range_indices():
    program = trace(
        [spec(f32, vocab=3), spec(i32, token=5)], lambda b, a: a[0].gather(a[1], "vocab")
    )
    table = np.array([10.0, 20.0, 30.0], np.float32)
    indices = np.array([-5, -1, 0, 3, 99], np.int32)
    expected = np.array([10.0, 10.0, 10.0, 30.0, 30.0], np.float32)
    assert_same(evaluate_one(program, table, indices), expected)


def test_gather_with_scalar_indices_drops_the_axis():
    program = trace([spec(f32, vocab=3, c=2), spec(i32)], lambda b, a: a[0].gather(a[1], "vocab"))
    assert program.output_types == (spec(f32, c=2),)
    table = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert_same(evaluate_one(program, table, np.int32(2)), table[2])


def test_gather_type_rule_rejects():
    with pytest.raises(accy.DTypeError, match="gather: indices must be i32 or i64, got f32"):
        trace([spec(f32, v=3), spec(f32, t=2)], lambda b, a: a[0].gather(a[1], "v"))
    with pytest.raises(accy.AxisError, match="share axis 'c'; rename it on one of them"):
        # the kind has no batch axes (OpsApi.gather composes them)
        trace(
            [spec(f32, v=3, c=2), spec(i32, c=2)],
            lambda b, a: b.emit("gather", list(a), {"axis": "v"}),
        )


@kind_test("scatter_add")
@pytest.mark.parametrize("dtype", [f32, f64, i32])
def test_scatter_add_accumulates_repeated_and_clamped_indices(rng, dtype):
    operand_t, index_t = spec(dtype, vocab=4, channel=3), spec(i32, token=6)
    updates_t = spec(dtype, token=6, channel=3)
    program = trace(
        [operand_t, index_t, updates_t],
        lambda b, a: a[0].scatter_add(a[1], a[2], "vocab"),
    )
    traced_once(program, "scatter_add")
    assert program.output_types == (operand_t,)
    operand, updates = random_array(rng, operand_t), random_array(rng, updates_t)
    indices = np.array([1, 3, 1, -2, 7, 0], np.int32)
    expected = operand.astype(np.float64)
    for position, index in enumerate(indices):
        expected[min(max(int(index), 0), 3)] += updates[position]
    tolerance = 1e-6 if dtype == f32 else 0.0
    assert_same(
        evaluate_one(program, operand, indices, updates),
        expected.astype(dtype.numpy),
        rtol=tolerance,
    )


def test_scatter_add_into_a_middle_axis(rng):
    operand_t = spec(f64, row=2, vocab=3, channel=2)
    updates_t = spec(f64, row=2, token=4, channel=2)
    program = trace(
        [operand_t, spec(i32, token=4), updates_t],
        lambda b, a: a[0].scatter_add(a[1], a[2], "vocab"),
    )
    operand, updates = random_array(rng, operand_t), random_array(rng, updates_t)
    indices = np.array([2, 0, 2, 1], np.int32)
    expected = operand.copy()
    for position, index in enumerate(indices):
        expected[:, index, :] += updates[:, position, :]
    assert_same(evaluate_one(program, operand, indices, updates), expected, rtol=1e-12)


@kind_test("scatter")
@pytest.mark.parametrize("combine", ["mul", "max", "min"])
@pytest.mark.parametrize("dtype", [f32, f16, i32])
def test_scatter_combines_repeated_and_clamped_indices(rng, dtype, combine):
    operand_t, index_t = spec(dtype, vocab=4, channel=3), spec(i32, token=6)
    updates_t = spec(dtype, token=6, channel=3)
    program = trace(
        [operand_t, index_t, updates_t],
        lambda b, a: b.emit("scatter", list(a), {"axis": "vocab", "combine": combine}),
    )
    operand, updates = random_array(rng, operand_t), random_array(rng, updates_t)
    indices = np.array([1, 3, 1, -2, 7, 0], np.int32)
    expected = operand.copy()
    numpy_op = {"mul": np.multiply, "max": np.maximum, "min": np.minimum}[combine]
    for position, index in enumerate(indices):  # in order, rounding each step as NumPy's .at
        row = min(max(int(index), 0), 3)
        expected[row] = numpy_op(expected[row], updates[position])
    assert_same(evaluate_one(program, operand, indices, updates), expected)


@kind_test("conv")
def test_conv_sums_the_windows_of_the_input_times_the_kernel():
    attrs = {
        "spatial": ("w",),
        "contract": ("c",),
        "stride": (2,),
        "low": (1,),
        "high": (0,),
        "lhs_dilation": (1,),
        "rhs_dilation": (1,),
    }
    program = trace(
        [spec(f64, w=5, c=2), spec(f64, o=3, w=2, c=2)],
        lambda b, a: b.emit("conv", list(a), attrs),
    )
    traced_once(program, "conv")
    assert program.output_types == (spec(f64, w=3, o=3),)
    x = np.arange(10.0).reshape(5, 2)
    k = np.arange(12.0).reshape(3, 2, 2)
    padded = np.concatenate([np.zeros((1, 2)), x])  # low 1: windows start at -1, 1, 3
    expected = np.array(
        [[np.sum(padded[2 * j : 2 * j + 2] * k[o]) for o in range(3)] for j in range(3)]
    )
    assert_same(evaluate_one(program, x, k), expected)


POOL_ATTRS = {  # windows of 3 at stride 2 over w=5, padded by 1 before: -1..1, 1..3, 3..5
    "op": "max",
    "axes": ("w",),
    "window": (3,),
    "stride": (2,),
    "low": (1,),
    "high": (1,),
    "dilation": (1,),
}


@kind_test("reduce_window")
def test_reduce_window_reduces_each_padded_window():
    x = np.array([[1.0, 5.0, 5.0, -2.0, 4.0], [0.0, np.nan, 1.0, 2.0, 3.0]])
    for op, expected in [
        ("max", [[5.0, 5.0, 4.0], [np.nan, np.nan, 3.0]]),
        ("min", [[1.0, -2.0, -2.0], [np.nan, np.nan, 2.0]]),
        ("sum", [[6.0, 8.0, 2.0], [np.nan, np.nan, 5.0]]),
    ]:
        attrs = {**POOL_ATTRS, "op": op}
        program = trace(
            [spec(f64, r=2, w=5)], lambda b, a, attrs=attrs: b.emit("reduce_window", a, attrs)
        )
        traced_once(program, "reduce_window")
        assert program.output_types == (spec(f64, r=2, w=3),)
        assert_same(evaluate_one(program, x), np.array(expected))


@kind_test("select_and_gather_add")
def test_select_and_gather_add_picks_the_tangent_at_each_window_s_first_extreme():
    x = np.array([1.0, 5.0, 5.0, np.nan, 4.0])
    t = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    program = trace(
        [spec(f64, w=5)] * 2, lambda b, a: b.emit("select_and_gather_add", a, POOL_ATTRS)
    )
    traced_once(program, "select_and_gather_add")
    # windows [pad, 1, 5], [5, 5, nan], [nan, 4, pad]: the first 5, then the first NaN twice
    assert_same(evaluate_one(program, t, x), np.array([20.0, 40.0, 40.0]))


@kind_test("select_and_scatter_add")
def test_select_and_scatter_add_adds_each_window_s_source_at_its_first_extreme():
    x = np.array([[0.0, 6.0, 1.0, 6.0, -np.inf], [-np.inf] * 5])
    s = np.array([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]])
    program = trace(
        [spec(f64, r=2, w=3), spec(f64, r=2, w=5)],
        lambda b, a: b.emit("select_and_scatter_add", a, POOL_ATTRS),
    )
    traced_once(program, "select_and_scatter_add")
    assert program.output_types == (spec(f64, r=2, w=5),)
    # Row 0: element 1 is the first maximum of two windows. Row 1 is all -inf: each window's
    # first candidate wins, the padding before the first window (its source goes nowhere),
    # then elements 1 and 3.
    expected = np.array([[0.0, 3.0, 0.0, 4.0, 0.0], [0.0, 16.0, 0.0, 32.0, 0.0]])
    assert_same(evaluate_one(program, s, x), expected)


def test_windowed_kinds_say_what_is_wrong():
    x = spec(f32, w=5)
    with pytest.raises(accy.AxisError, match="axis 'h' is not on the operand"):
        RULES["reduce_window"].infer((x,), {**POOL_ATTRS, "axes": ("h",)})
    with pytest.raises(accy.TypeRuleError, match="op 'sum' is not one of"):
        RULES["select_and_gather_add"].infer((x, x), {**POOL_ATTRS, "op": "sum"})
    with pytest.raises(accy.TypeRuleError, match=r"stride needs one integer per axis \('w',\)"):
        RULES["reduce_window"].infer((x,), {**POOL_ATTRS, "stride": (1, 1)})
    with pytest.raises(accy.AxisError, match="stride 0 and dilation 1 of 'w' must all be >= 1"):
        RULES["reduce_window"].infer((x,), {**POOL_ATTRS, "stride": (0,)})
    with pytest.raises(accy.AxisError, match="spans 8 elements; the padded axis has 7"):
        RULES["reduce_window"].infer((x,), {**POOL_ATTRS, "window": (8,)})
    with pytest.raises(accy.TypeRuleError, match=r"operand 0 must have the type f32\[w=3\]"):
        RULES["select_and_scatter_add"].infer((x, x), POOL_ATTRS)
    with pytest.raises(accy.DTypeError, match="does not apply to bool operands"):
        RULES["reduce_window"].infer((spec(accy.bool_, w=5),), POOL_ATTRS)


@kind_test("sort")
def test_sort_orders_by_the_first_operand_stably_and_carries_the_second():
    program = trace(
        [spec(f32, n=5), spec(i32, n=5)],
        lambda b, a: b.emit("sort", list(a), {"axis": "n", "descending": False}),
    )
    traced_once(program, "sort")
    assert program.output_types == (spec(f32, n=5), spec(i32, n=5))
    keys = np.array([2.0, np.nan, 1.0, 2.0, -1.0], np.float32)
    values, carried = evaluate(program, keys, np.arange(5, dtype=np.int32))
    assert_same(values, np.array([-1.0, 1.0, 2.0, 2.0, np.nan], np.float32))
    assert_same(carried, np.array([4, 2, 0, 3, 1], np.int32))


def test_scatter_add_needs_updates_of_the_gathered_type():
    with pytest.raises(accy.AxisError, match=r"updates must have type f32\[token=2, c=3\]"):
        trace(
            [spec(f32, v=4, c=3), spec(i32, token=2), spec(f32, token=3, c=3)],
            lambda b, a: a[0].scatter_add(a[1], a[2], "v"),
        )


# ---------------------------------------------------------------------------------------------
# custom_call


@kind_test("custom_call")
def test_custom_call_has_its_declared_type_and_runs_the_given_implementation(rng):
    t = spec(f32, lane=4)
    out = spec(f32, pair=2)
    program = trace([t, t], lambda b, a: b.custom_call("test.sum_diff", 3, [a[0], a[1]], out))
    traced_once(program, "custom_call")
    (op,) = [op for op in program.operations if op.kind == "custom_call"]
    assert (op.attrs["target"], op.attrs["version"]) == ("test.sum_diff", 3)
    assert program.output_types == (out,)
    x, y = random_array(rng, t), random_array(rng, t)

    def sum_diff(a, b):
        return np.array([(a + b).sum(), (a - b).sum()], np.float32)

    got = evaluate_one(program, x, y, custom_calls={("test.sum_diff", 3): sum_diff})
    assert_same(got, np.array([(x + y).sum(), (x - y).sum()], np.float32), rtol=1e-6)
    by_target = evaluate_one(program, x, y, custom_calls={"test.sum_diff": sum_diff})
    assert_same(by_target, got)


def test_custom_call_without_an_implementation_names_its_target():
    program = trace([spec(f32, lane=2)], lambda b, a: b.custom_call("nowhere", 1, a, a[0].ty))
    with pytest.raises(accy.AccyError, match="custom_call 'nowhere' version 1 has no reference"):
        evaluate(program, np.zeros(2, np.float32))


def test_registered_custom_call_is_found_by_target_and_version():
    accy.reference.register_custom_call("test.registered_double", 1, lambda x: 2 * x)
    program = trace(
        [spec(f32, lane=2)], lambda b, a: b.custom_call("test.registered_double", 1, a, a[0].ty)
    )
    got = evaluate_one(program, np.array([1.0, -3.0], np.float32))
    assert_same(got, np.array([2.0, -6.0], np.float32))


def test_custom_call_type_rule_rejects_an_empty_target_or_a_bad_version():
    t = spec(f32, lane=2)
    with pytest.raises(accy.TypeRuleError, match="target must be a non-empty string"):
        trace([t], lambda b, a: b.custom_call("", 1, a, t))
    with pytest.raises(accy.TypeRuleError, match="version must be an int, got '1'"):
        trace([t], lambda b, a: b.custom_call("x", "1", a, t))


# ---------------------------------------------------------------------------------------------
# scan


def _running_body():
    """carry' = carry * decay + x; y = carry' + bias: consts (decay, bias), one carry, one x."""
    c = spec(f64, c=3)
    return accy.trace.define(
        "running",
        [spec(f64), c, c, c],
        lambda b, a: (a[2] * a[0] + a[3], a[2] * a[0] + a[3] + a[1]),
    )


@kind_test("scan")
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_threads_carries_and_stacks_ys_first(rng, reverse):
    xs_t = spec(f64, c=3, t=5)

    def body(b, a):
        carries, ys = b.scan(
            _running_body(), consts=a[:2], carries=[a[2]], xs=[a[3]], axis="t", reverse=reverse
        )
        return carries + ys

    program = trace([spec(f64), spec(f64, c=3), spec(f64, c=3), xs_t], body)
    traced_once(program, "scan")
    assert program.contains_scan()
    (scan_op,) = [op for op in program.operations if op.kind == "scan"]
    assert scan_op.result_types == (spec(f64, c=3), spec(f64, t=5, c=3))
    assert program.output_types == (spec(f64, c=3), spec(f64, t=5, c=3))
    decay, bias, init = (
        np.float64(0.5),
        random_array(rng, spec(f64, c=3)),
        random_array(rng, spec(f64, c=3)),
    )
    xs = random_array(rng, xs_t)
    carry, ys = init.copy(), np.zeros((5, 3))
    steps = range(4, -1, -1) if reverse else range(5)
    for step in steps:
        carry = carry * decay + xs[:, step]
        ys[step] = carry + bias
    final, stacked = evaluate(program, decay, bias, init, xs)
    assert_same(final, carry, rtol=1e-12)
    assert_same(stacked, ys, rtol=1e-12)


def test_scan_with_a_traced_python_body_computes_a_cumulative_sum():
    program = trace(
        [spec(i32, t=4, c=2)],
        lambda b, a: b.scan(
            lambda bb, args: (args[0] + args[1], args[0] + args[1]),
            carries=[b.zeros(spec(i32, c=2))],
            xs=[a[0]],
            axis="t",
        )[1][0],
    )
    assert program.output_types == (spec(i32, t=4, c=2),)
    x = np.arange(8, dtype=np.int32).reshape(4, 2)
    assert_same(evaluate_one(program, x), np.cumsum(x, axis=0).astype(np.int32))


def test_scan_body_must_fit_its_operands():
    body = accy.trace.define("body", [spec(f32, c=2), spec(f32, c=3)], lambda b, a: (a[0], a[1]))
    with pytest.raises(accy.TypeRuleError, match="scan: the body 'body' takes"):
        trace(
            [spec(f32, c=2), spec(f32, t=4, c=2)],
            lambda b, a: b.scan(body, carries=[a[0]], xs=[a[1]], axis="t"),
        )
    with pytest.raises(accy.AxisError, match="scan: axis 't' is not on f32\\[c=2\\]"):
        trace([spec(f32, c=2)], lambda b, a: b.scan(body, xs=[a[0]], axis="t"))


@kind_test("cond")
def test_cond_runs_the_selected_branch():
    program = trace(
        [spec(accy.bool_), spec(f32, c=2)],
        lambda b, a: b.cond(a[0], lambda b, v: v[0] * 2.0, lambda b, v: v[0] - 1.0, [a[1]]),
    )
    traced_once(program, "cond")
    x = np.array([1.0, 3.0], np.float32)
    assert_same(evaluate_one(program, np.bool_(True), x), x * 2.0)
    assert_same(evaluate_one(program, np.bool_(False), x), x - 1.0)


@kind_test("while_loop")
def test_while_loop_repeats_until_the_condition_fails():
    program = trace(
        [spec(i32)],
        lambda b, a: b.while_loop(lambda b, c: c[0] < 100, lambda b, c: [c[0] * 3], a)[0],
    )
    traced_once(program, "while_loop")
    assert_same(evaluate_one(program, np.int32(2)), np.int32(162))
    assert_same(evaluate_one(program, np.int32(500)), np.int32(500))


@kind_test("psum", "all_gather", "reduce_scatter", "all_to_all", "ppermute", "axis_index")
def test_collectives_on_one_device_and_on_a_mesh():
    """Over a mesh axis of one device each collective is the identity (or a reshape) and the plain
    evaluator runs it; tests/mesh checks them on meshes of 2, 4 and 8 devices."""
    one = {"mesh_axis": "data", "size": 1}

    def body(b, a):
        x = a[0]
        return [
            b.emit("psum", [x], one),
            b.emit("all_gather", [x], {**one, "axis": "c"}),
            b.emit("reduce_scatter", [x], {**one, "axis": "c"}),
            b.emit("all_to_all", [x], {**one, "split_axis": "c", "concat_axis": "r"}),
            b.emit("ppermute", [x], {**one, "perm": ((0, 0),)}),
            b.emit("axis_index", [], one),
        ]

    program = trace([spec(f32, r=2, c=3)], body)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    *same, index = evaluate(program, x)
    for result in same:
        assert_same(result, x)
    assert_same(index, np.int32(0))
    two = trace(
        [spec(f32, c=3)], lambda b, a: b.emit("all_gather", [a[0]], {**one, "size": 2, "axis": "c"})
    )
    assert str(two.output_types[0]) == "f32[c=6]"
    mesh = accy.Mesh(range(2), "data")
    gathered = accy.mesh.run(two, mesh, [[x[0]], [x[1]]])
    assert_same(gathered[1][0], x.ravel())


# ---------------------------------------------------------------------------------------------


def test_every_kind_is_tested_here():
    assert set(RULES) == KINDS_TESTED_HERE, set(RULES) ^ KINDS_TESTED_HERE


def test_type_rules_give_the_type_the_program_records(rng):
    """Each traced op's recorded result type is what its rule infers from its operand types."""
    program = trace(
        [spec(f32, a=2, b=3), spec(i32, t=2)],
        lambda b, a: a[0].gather(a[1], "a").pad("b", 1, 1).sum("b").max(0.0),
    )
    for op in program.operations:
        inferred = RULES[op.kind].infer(op.operand_types, op.attrs)
        assert (inferred,) == op.result_types
        assert op.operand_types == tuple(program.type_of(v) for v in op.operands)


def test_type_of_and_result_types_agree():
    program = trace([spec(f32, a=2)], lambda b, a: (a[0] + 1.0, a[0].sum()))
    for op in program.operations:
        for value, t in zip(op.results, op.result_types, strict=True):
            assert program.type_of(value) == t
    assert isinstance(program.output_types[1], TensorType)


def test_custom_call_implementation_of_the_wrong_shape_is_reported_by_target():
    program = trace([spec(f32, lane=4)], lambda b, a: b.custom_call("test.bad", 2, a, a[0].ty))
    with pytest.raises(
        accy.InvalidInput,
        match=r"custom_call 'test.bad' version 2: its reference implementation returned an array "
        r"of shape \(3,\), but the call's result type is f32\[lane=4\]",
    ):
        evaluate(program, np.zeros(4, np.float32), custom_calls={"test.bad": lambda x: x[:3]})


def test_bf16_parameters_take_bf16_arrays_that_the_caller_rounded():
    program = trace([spec(bf16, lane=2)], lambda b, a: a[0] * 1.0)
    x = np.array([1.0 + 2**-9, 3.0], np.float32)
    rounded = x.astype(ml_dtypes.bfloat16)  # to nearest, ties to even: 1 + 2**-9 is 1
    assert_same(evaluate_one(program, rounded), np.array([1.0, 3.0], ml_dtypes.bfloat16))
    with pytest.raises(accy.InvalidInput, match=r"convert it with .astype\(ml_dtypes.bfloat16\)"):
        evaluate_one(program, x)  # the one argument rule: no silent rounding


def test_bf16_scalars_keep_rank_zero():
    program = trace([spec(bf16), spec(bf16, lane=3)], lambda b, a: (a[0] + 1.0, a[1].sum()))
    plus_one, total = evaluate(
        program, ml_dtypes.bfloat16(2.0), np.array([1.0, 2.0, 2**-8], ml_dtypes.bfloat16)
    )
    assert_same(plus_one, np.array(3.0, ml_dtypes.bfloat16))
    # 1 + 2 = 3, then 3 + 2**-8 rounds back to 3 in bf16 (8 significant bits).
    assert_same(total, np.array(3.0, ml_dtypes.bfloat16))


def test_reducing_over_no_axes_combines_each_element_with_the_init():
    program = trace(
        [spec(f32, a=3)], lambda b, a: (a[0].sum(()), a[0].max([]), a[0].reduce(10.0, "min", []))
    )
    assert program.output_types == (spec(f32, a=3),) * 3
    x = np.array([1.0, 20.0, -3.0], np.float32)
    total, highest, lowest = evaluate(program, x)
    assert_same(total, x)
    assert_same(highest, x)
    assert_same(lowest, np.minimum(x, 10.0))
