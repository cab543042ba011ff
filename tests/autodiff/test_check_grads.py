"""Every differentiable kind and the usual compositions, checked against central differences
in float64, in forward and reverse mode, to second order where the op is twice
differentiable."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, i32, nn, spec
from accy.testing import check_grads
from accy.trace import define

RNG = np.random.default_rng(1234)


def away_from_zero(*shape):
    """Random values with magnitude in [0.3, 1.3]: away from the kinks of abs, max, sign."""
    return RNG.uniform(0.3, 1.3, shape) * RNG.choice([-1.0, 1.0], shape)


def positive(*shape):
    return RNG.uniform(0.5, 2.0, shape)


def distinct(*shape):
    """Values at least 0.05 apart, so max and min have no ties."""
    values = RNG.permutation(np.arange(int(np.prod(shape)))) * 0.1 - 0.3
    return values.reshape(shape) + RNG.uniform(-0.02, 0.02, shape)


UNARY_CASES = {
    "neg": away_from_zero,
    "exp": away_from_zero,
    "log": positive,
    "log1p": positive,
    "expm1": away_from_zero,
    "sin": away_from_zero,
    "cos": away_from_zero,
    "tan": lambda *s: RNG.uniform(-1.0, 1.0, s),
    "tanh": away_from_zero,
    "logistic": away_from_zero,
    "sqrt": positive,
    "rsqrt": positive,
    "abs": away_from_zero,
    "sign": away_from_zero,
    "floor": lambda *s: RNG.uniform(0.1, 0.9, s) + RNG.integers(-3, 3, s),
    "ceil": lambda *s: RNG.uniform(0.1, 0.9, s) + RNG.integers(-3, 3, s),
    "round": lambda *s: RNG.uniform(0.1, 0.4, s) + RNG.integers(-3, 3, s),
}


@pytest.mark.parametrize("op", sorted(UNARY_CASES))
def test_unary(op):
    program = define(
        f"unary_{op}", [spec(f32, a=2, b=3)], lambda b, x: x[0].builder.unary(op, x[0])
    )
    check_grads(program, [UNARY_CASES[op](2, 3)], wrt=(0,), order=2)


BINARY_CASES = {
    "add": (away_from_zero, away_from_zero),
    "sub": (away_from_zero, away_from_zero),
    "mul": (away_from_zero, away_from_zero),
    "div": (away_from_zero, away_from_zero),
    "pow": (positive, away_from_zero),
    "max": (distinct, lambda *s: distinct(*s) + 0.05),
    "min": (distinct, lambda *s: distinct(*s) + 0.05),
}


@pytest.mark.parametrize("kind", sorted(BINARY_CASES))
def test_binary_broadcasting_by_name(kind):
    left, right = BINARY_CASES[kind]
    program = define(
        f"binary_{kind}",
        [spec(f32, a=2, b=3), spec(f32, b=3, a=2)],
        lambda b, x: b.binary(kind, x[0], x[1]),
    )
    check_grads(program, [left(2, 3), right(3, 2)], wrt=(0, 1), order=2)


def test_binary_with_a_broadcast_operand():
    program = define(
        "broadcast_mul", [spec(f32, a=2, b=3), spec(f32, b=3)], lambda b, x: x[0] * x[1].exp()
    )
    check_grads(program, [away_from_zero(2, 3), away_from_zero(3)], wrt=(0, 1), order=2)


def test_select_and_compare():
    def body(b, x):
        return b.select(x[0] > 0.0, x[0] * x[1], x[1].sin())

    program = define("select", [spec(f32, n=5), spec(f32, n=5)], body)
    check_grads(program, [away_from_zero(5), away_from_zero(5)], wrt=(0, 1), order=2)


def test_convert_between_float_dtypes():
    program = define(
        "convert", [spec(f32, n=4)], lambda b, x: (x[0].convert(accy.f64) * 3.0).convert(f32)
    )
    check_grads(program, [away_from_zero(4)], wrt=(0,), order=2)


def test_layout_kinds():
    def body(b, x):
        t = x[0].transpose("b", "a")  # transpose
        merged = t.merge(("b", "a"), "ab")  # reshape
        strided = merged.slice("ab", 1, 6, 2)  # slice with a stride
        padded = strided.pad("ab", 2, 1, value=x[1], interior=1)  # pad with a traced value
        joined = b.concatenate([padded, merged], "ab")
        return (joined * joined).sum("ab")

    program = define("layout", [spec(f32, a=2, b=3), spec(f32)], body)
    check_grads(program, [away_from_zero(2, 3), np.array(0.7)], wrt=(0, 1), order=2)


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_reduce_with_an_init_parameter(op):
    program = define(
        f"reduce_{op}",
        [spec(f32, a=3, b=4), spec(f32)],
        lambda b, x: x[0].reduce(x[1], op, "b"),
    )
    values = distinct(3, 4) if op in ("max", "min") else away_from_zero(3, 4)
    init = {"sum": 0.3, "prod": 0.9, "max": -5.0, "min": 5.0}[op]
    check_grads(program, [values, np.array(init)], wrt=(0, 1), order=2)


def test_reduce_max_where_the_init_wins():
    program = define(
        "max_init_wins", [spec(f32, n=3), spec(f32)], lambda b, x: x[0].reduce(x[1], "max", "n")
    )
    check_grads(program, [np.array([0.1, 0.2, 0.3]), np.array(2.0)], wrt=(0, 1), order=2)


@pytest.mark.parametrize(
    "name, lhs, rhs, body",
    [
        ("contract", {"m": 2, "k": 3}, {"k": 3, "n": 4}, lambda b, x: x[0].contract(x[1], "k")),
        (
            "batched",
            {"b": 2, "m": 2, "k": 3},
            {"k": 3, "b": 2, "n": 2},
            lambda b, x: x[0].contract(x[1], "k"),
        ),
        (
            "noncanonical",
            {"k": 3, "m": 2},
            {"k": 3, "n": 2},
            lambda b, x: b.dot_general(x[0], x[1], [0], [0], [], []),
        ),
        (
            "two_contracted_axes",
            {"i": 2, "j": 3, "m": 2},
            {"j": 3, "n": 2, "i": 2},
            lambda b, x: x[0].contract(x[1], ("i", "j")),
        ),
    ],
)
def test_dot_general(name, lhs, rhs, body):
    program = define(name, [spec(f32, lhs), spec(f32, rhs)], body)
    lhs_value = away_from_zero(*lhs.values())
    rhs_value = away_from_zero(*rhs.values())
    check_grads(program, [lhs_value, rhs_value], wrt=(0, 1), order=2)


def test_gather_and_scatter_add():
    def body(b, x):
        table, ids, updates = x
        gathered = table.gather(ids, "vocab")
        scattered = table.scatter_add(ids, updates * gathered, "vocab")
        return (scattered * scattered).sum(("vocab", "channel"))

    program = define(
        "gather_scatter",
        [spec(f32, vocab=5, channel=2), spec(i32, token=4), spec(f32, token=4, channel=2)],
        body,
    )
    ids = np.array([1, 3, 1, 0], np.int32)
    check_grads(program, [away_from_zero(5, 2), ids, away_from_zero(4, 2)], wrt=(0, 2), order=2)


def test_scan_is_differentiated_through_unrolling():
    def step(b, args):
        weight, carry, x = args
        new = (carry * weight + x).tanh()
        return new, new * new

    def body(b, x):
        (final,), (ys,) = b.scan(step, consts=[x[0]], carries=[x[1]], xs=[x[2]], axis="time")
        return final.sum("h") + ys.sum(("time", "h"))

    program = define("scan", [spec(f32, h=3), spec(f32, h=3), spec(f32, time=4, h=3)], body)
    args = [away_from_zero(3), away_from_zero(3), away_from_zero(4, 3)]
    check_grads(program, args, wrt=(0, 1, 2), order=2)


def test_iota_and_constants_have_zero_derivative():
    def body(b, x):
        positions = b.iota(spec(f32, n=4), "n")
        return (x[0] * positions + b.constant([1.0, 2.0, 3.0, 4.0], spec(f32, n=4))).sum("n")

    program = define("iota", [spec(f32, n=4)], body)
    check_grads(program, [away_from_zero(4)], wrt=(0,), order=2)
    (gradient,) = accy.reference.run(accy.grad(program), [np.zeros(4, np.float32)])
    np.testing.assert_array_equal(gradient, [0, 1, 2, 3])


# -- compositions -------------------------------------------------------------------------------


@pytest.mark.slow
def test_softmax_logsumexp_layer_norm_gelu():
    def body(b, x):
        soft = nn.softmax(x[0], "c")
        normed = nn.layer_norm(x[0], "c")
        return (soft * normed).sum(("r", "c")) + nn.logsumexp(nn.gelu_tanh(x[0]), "c").sum("r")

    program = define("compositions", [spec(f32, r=2, c=5)], body)
    check_grads(program, [away_from_zero(2, 5)], wrt=(0,), order=2)


def attention_loss(b, args):
    q, k, v, mask = args
    scores = q.contract(k.rename("token", "key"), "channel") + mask
    mixed = nn.softmax(scores, "key").contract(v.rename("token", "key"), "key")
    return (mixed * mixed).sum(("token", "channel"))


def attention_program(tokens=4, channels=3):
    specs = [spec(f32, token=tokens, channel=channels)] * 3 + [spec(f32, token=tokens, key=tokens)]
    return define("attention", specs, attention_loss)


def causal_mask(tokens):
    rows, cols = np.indices((tokens, tokens))
    return np.where(cols <= rows, 0.0, -30.0)


def test_causal_attention():
    args = [away_from_zero(4, 3) for _ in range(3)] + [causal_mask(4)]
    check_grads(attention_program(), args, wrt=(0, 1, 2), order=2)


def test_embedding_lookup():
    def body(b, x):
        gathered = x[0].gather(x[1], "vocab")
        return (gathered * gathered).sum(("token", "channel"))

    program = define("embedding", [spec(f32, vocab=6, channel=3), spec(i32, token=5)], body)
    check_grads(program, [away_from_zero(6, 3), np.array([0, 5, 2, 2, 9], np.int32)], order=2)


def mlp_loss(b, args):
    x, w1, w2, y = args
    hidden = x.contract(w1, "inp").tanh()
    logits = hidden.contract(w2, "hidden")
    return nn.cross_entropy(logits, y, "out").sum("batch")


def mlp_program():
    return define(
        "mlp",
        [
            spec(f32, batch=3, inp=4),
            spec(f32, inp=4, hidden=5),
            spec(f32, hidden=5, out=2),
            spec(f32, batch=3, out=2),
        ],
        mlp_loss,
    )


def mlp_args():
    return [away_from_zero(3, 4), away_from_zero(4, 5), away_from_zero(5, 2), np.eye(2)[[0, 1, 1]]]


def test_two_layer_mlp():
    check_grads(mlp_program(), mlp_args(), wrt=(1, 2), order=2)


def test_hessian_vector_product_of_an_mlp_matches_differences_of_its_gradient():
    program = accy.transforms.retype.promote_floats(mlp_program(), accy.f64)
    gradient = accy.grad(program, wrt=(1,))
    hvp = accy.jvp(gradient, wrt=(1,))  # forward over reverse
    args = mlp_args()
    direction = RNG.standard_normal((4, 5))
    (_, analytic) = accy.reference.run(hvp, args + [direction])
    eps = 1e-5
    plus = [a.copy() for a in args]
    minus = [a.copy() for a in args]
    plus[1] = args[1] + eps * direction
    minus[1] = args[1] - eps * direction
    numeric = (accy.reference.run(gradient, plus)[0] - accy.reference.run(gradient, minus)[0]) / (
        2 * eps
    )
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)

    # and reverse over reverse: the gradient of <grad, v> is H v too
    def inner(b, a):
        (g,) = (b.call(gradient, a[:4]),)
        return (g * a[4]).sum(("inp", "hidden"))

    dotted = define(
        "inner", list(program.parameter_types) + [spec(accy.f64, inp=4, hidden=5)], inner
    )
    (reverse,) = accy.reference.run(accy.grad(dotted, wrt=(1,)), args + [direction])
    np.testing.assert_allclose(reverse, numeric, rtol=1e-6, atol=1e-8)


def test_custom_call_with_user_rules():
    from .test_grad_zig import CUSTOM_DOUBLE, DoubleJvpRule, DoubleVjpRule, double_sum_loss

    program = define("custom", [spec(f32, lane=4)], double_sum_loss)
    gradient = accy.grad_with_rules(program, (0,), DoubleJvpRule(), DoubleVjpRule())
    (values,) = accy.reference.run(
        gradient,
        [away_from_zero(4).astype(np.float32)],
        custom_calls={(CUSTOM_DOUBLE, 1): lambda x: 2 * x},
    )
    np.testing.assert_array_equal(values, [2.0] * 4)
