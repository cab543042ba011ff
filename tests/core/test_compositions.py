"""Operations composed of the closed set of kinds (accy.core.compositions, accy.nn): values
against NumPy on the reference evaluator, derivatives against finite differences, errors.
(Native backends run them in tests/backends/kind_programs.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

import accy
from accy import f32, f64, i32, spec
from accy.testing import check_grads

X = np.random.default_rng(3).standard_normal((5, 4))


def _run(body, x=X, *extra):
    types = [spec(f64, n=x.shape[0], m=x.shape[1])] + [spec(i32)] * len(extra)
    program = accy.trace.define("c", types, lambda b, a: body(b, *a))
    return accy.reference.run(program, [x, *(np.int32(e) for e in extra)])[0]


ARRAY_CASES = {
    "flip": (lambda b, x: x.flip("n"), lambda x: x[::-1]),
    "roll": (lambda b, x: x.roll(2, "n"), lambda x: np.roll(x, 2, 0)),
    "roll_negative": (lambda b, x: x.roll(-1, "m"), lambda x: np.roll(x, -1, 1)),
    "tril": (lambda b, x: x.tril("n", "m"), np.tril),
    "triu_1": (lambda b, x: x.triu("n", "m", 1), lambda x: np.triu(x, 1)),
    "cumsum": (lambda b, x: x.cumsum("n"), lambda x: np.cumsum(x, 0)),
    "cumsum_reverse": (
        lambda b, x: x.cumsum("m", True),
        lambda x: np.cumsum(x[:, ::-1], 1)[:, ::-1],
    ),
    "cumprod": (lambda b, x: x.cumprod("n"), lambda x: np.cumprod(x, 0)),
    "cummax": (lambda b, x: x.cummax("n"), lambda x: np.maximum.accumulate(x, 0)),
    "cummin": (lambda b, x: x.cummin("m"), lambda x: np.minimum.accumulate(x, 1)),
    "pad_reflect": (
        lambda b, x: x.pad("n", 3, 2, mode="reflect"),
        lambda x: np.pad(x, ((3, 2), (0, 0)), mode="reflect"),
    ),
    "pad_edge": (
        lambda b, x: x.pad("m", 2, 5, mode="edge"),
        lambda x: np.pad(x, ((0, 0), (2, 5)), mode="edge"),
    ),
    "pad_symmetric": (
        lambda b, x: x.pad("n", 1, 6, mode="symmetric"),
        lambda x: np.pad(x, ((1, 6), (0, 0)), mode="symmetric"),
    ),
    "pad_negative": (
        lambda b, x: x.pad("n", -2, 1, value=7.0),
        lambda x: np.pad(x, ((0, 1), (0, 0)), constant_values=7.0)[2:],
    ),
    "pad_negative_interior": (
        lambda b, x: x.pad("m", -1, -2, interior=1),
        lambda x: np.insert(x, [1, 2, 3], 0.0, axis=1)[:, 1:-2],
    ),
    "logaddexp": (
        lambda b, x: accy.nn.logaddexp(x, x.roll(1, "n")),
        lambda x: np.logaddexp(x, np.roll(x, 1, 0)),
    ),
    "softplus": (lambda b, x: accy.nn.softplus(x * 30.0), lambda x: np.logaddexp(x * 30.0, 0.0)),
    "silu": (lambda b, x: accy.nn.silu(x), lambda x: x / (1 + np.exp(-x))),
    "mish": (lambda b, x: accy.nn.mish(x), lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    "gelu": (
        lambda b, x: accy.nn.gelu(x),
        lambda x: x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    ),
    "rms_norm": (
        lambda b, x: accy.nn.rms_norm(x, "m"),
        lambda x: x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6),
    ),
    "log_softmax": (
        lambda b, x: accy.nn.log_softmax(x, "m"),
        lambda x: x - np.log(np.exp(x).sum(1, keepdims=True)),
    ),
}


@pytest.mark.parametrize("name", sorted(ARRAY_CASES))
def test_compositions_match_numpy(name):
    body, expected = ARRAY_CASES[name]
    np.testing.assert_allclose(_run(body), expected(X), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "name",
    ["flip", "tril", "cumsum_reverse", "cumprod", "cummax", "pad_reflect", "pad_negative"]
    + ["logaddexp", "softplus", "mish", "gelu", "rms_norm"],
)
def test_composition_derivatives_match_finite_differences(name):
    body, _ = ARRAY_CASES[name]
    program = accy.trace.define("c", [spec(f32, n=5, m=4)], lambda b, a: body(b, a[0]))
    check_grads(program, [X], order=1, atol=1e-4, rtol=1e-4, eps=1e-6)


def test_logaddexp_is_exact_at_ties_and_infinities():
    def body(b, args):
        return accy.nn.logaddexp(args[0], args[1])

    program = accy.trace.define("l", [spec(f64, n=3)] * 2, body)
    a = np.array([-np.inf, np.inf, 2.0])
    got = accy.reference.run(program, [a, np.array([-np.inf, np.inf, 2.0])])[0]
    np.testing.assert_array_equal(got, [-np.inf, np.inf, 2.0 + math.log(2.0)])
    loss = accy.trace.define("l", [spec(f64, n=1)], lambda b, x: accy.nn.softplus(x[0]).sum())
    assert accy.reference.run(accy.grad(loss), [[0.0]])[0].tolist() == [0.5]


def test_argmax_and_argmin_take_the_first_tie_and_the_first_nan():
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, np.nan, 5.0, np.nan], [0.0, 0.0, -1.0, -1.0]])
    program = accy.trace.define(
        "a", [spec(f64, r=3, n=4)], lambda b, a: (a[0].argmax("n"), a[0].argmin("n"))
    )
    largest, smallest = accy.reference.run(program, [x])
    assert largest.dtype == np.int32
    assert largest.tolist() == np.argmax(x, 1).tolist() == [1, 1, 0]
    assert smallest.tolist() == np.argmin(x, 1).tolist() == [3, 1, 2]


@pytest.mark.parametrize("start", [-3, 0, 2, 4, 99])
def test_dynamic_slices_clamp_their_starts_as_jax(start):
    clamped = min(max(start, 0), 5 - 2)
    got = _run(lambda b, x, s: x.dynamic_slice({"n": s, "m": 1}, {"n": 2, "m": 3}), X, start)
    np.testing.assert_array_equal(got, X[clamped : clamped + 2, 1:4])

    def update(b, x, s):
        return x.dynamic_update_slice(b.full(spec(f64, n=2, m=3), -1.0), {"n": s, "m": 1})

    expected = X.copy()
    expected[clamped : clamped + 2, 1:4] = -1.0
    np.testing.assert_array_equal(_run(update, X, start), expected)


def test_dynamic_slice_gradients_reach_the_operand_and_the_update():
    def body(b, args):
        x, u = args
        start = b.scalar(i32, 2)
        window = x.dynamic_slice({"n": start}, {"n": 2})
        return x.dynamic_update_slice(u * window, {"n": start}).sum(), window

    types = [spec(f32, n=5, m=4), spec(f32, n=2, m=4)]
    program = accy.trace.define("d", types, body)
    check_grads(program, [X, X[:2] * 0.5], wrt=(0, 1), order=1, eps=1e-6)


def test_composition_errors_name_the_operation():
    with pytest.raises(accy.AxisError, match="flip: axis 'q'"):
        accy.trace.define("e", [spec(f32, n=2)], lambda b, a: a[0].flip("q"))
    with pytest.raises(accy.AxisError, match="dynamic_slice: size 3"):
        accy.trace.define("e", [spec(f32, n=2)], lambda b, a: a[0].dynamic_slice({}, {"n": 3}))
    with pytest.raises(accy.TypeRuleError, match="integer scalar"):
        accy.trace.define(
            "e", [spec(f32, n=2)], lambda b, a: a[0].dynamic_slice({"n": a[0]}, {"n": 1})
        )
    with pytest.raises(accy.TypeRuleError, match="unknown mode 'mirror'"):
        accy.trace.define("e", [spec(f32, n=2)], lambda b, a: a[0].pad("n", 1, 1, mode="mirror"))
    with pytest.raises(accy.AxisError, match="removing"):
        accy.trace.define("e", [spec(f32, n=2)], lambda b, a: a[0].pad("n", -2, -1))


def test_sort_is_stable_puts_nan_last_and_carries_operands():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 4, (3, 9)).astype(np.float64)
    keys[0, 2] = keys[1, 5] = np.nan
    carried = rng.standard_normal((3, 9))

    def body(b, args):
        k, c = args
        return (*b.sort([k, c], "n"), k.argsort("n"), k.argsort("n", descending=True))

    program = accy.trace.define("s", [spec(f64, r=3, n=9)] * 2, body)
    got_keys, got_carried, order, descending = accy.reference.run(program, [keys, carried])
    expected = np.argsort(keys, 1, kind="stable")
    np.testing.assert_array_equal(order, expected)
    np.testing.assert_array_equal(got_keys, np.take_along_axis(keys, expected, 1))
    np.testing.assert_array_equal(got_carried, np.take_along_axis(carried, expected, 1))
    finite = np.where(np.isnan(keys), -np.inf, -keys)  # NaN first when descending
    np.testing.assert_array_equal(descending, np.argsort(finite, 1, kind="stable"))


def test_top_k_takes_the_first_of_equal_elements():
    x = np.array([[1.0, 5.0, 3.0, 5.0, 0.0], [2.0, 2.0, 2.0, 1.0, 9.0]])
    program = accy.trace.define("t", [spec(f64, r=2, n=5)], lambda b, a: a[0].top_k(3, "n"))
    values, positions = accy.reference.run(program, [x])
    assert positions.tolist() == [[1, 3, 2], [4, 0, 1]]
    assert values.tolist() == [[5.0, 5.0, 3.0], [9.0, 2.0, 2.0]]


def test_sort_and_top_k_derivatives_follow_the_permutation():
    def body(b, args):
        values, _ = args[0].top_k(2, "n")
        return args[0].sort("n") * args[0].sort("n").exp(), values

    program = accy.trace.define("s", [spec(f32, n=5, m=4)], body)
    check_grads(program, [X], order=1, eps=1e-6)
    with pytest.raises(accy.AxisError, match="top_k: k=6"):
        accy.trace.define("e", [spec(f32, n=5)], lambda b, a: a[0].top_k(6, "n"))
