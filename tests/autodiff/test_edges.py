"""Derivatives at the points where a function is not differentiable or a textbook rule divides by
zero: each convention of the autodiff README ("Conventions at non-differentiable points") is
pinned here, with the expected values worked out by hand and, where JAX differs, why."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.testing import check_grads
from accy.trace import define

RNG = np.random.default_rng(2024)


def gradients(program, args, wrt):
    """The gradients of a scalar program on the reference evaluator, in float64."""
    return [np.asarray(g, np.float64) for g in accy.reference.run(accy.grad(program, wrt), args)]


# -- pow --------------------------------------------------------------------------------------


def power_sum(b, args):
    return (args[0] ** args[1]).sum("n")


POWER = define("power", [spec(f32, n=3), spec(f32, n=3)], power_sum)


@pytest.mark.parametrize("y", [2.0, 0.5, 0.0])
def test_pow_exponent_derivative_is_zero_at_a_zero_base(y):
    # 0^y is 0 for every y > 0 (and 1 at y = 0): constant in y, so d/dy is 0. JAX's
    # _pow_jvp_rhs takes log(x) at x = 1 where x == 0 and gives 0 too; log(0) * 0^y is NaN.
    # At the nonzero bases d/dy x^y = log(x) x^y.
    x = np.array([0.0, 2.0, 0.5], np.float32)
    exponent = np.full(3, y, np.float32)
    _, d_exponent = gradients(POWER, [x, exponent], wrt=(0, 1))
    expected = [0.0, np.log(2.0) * 2.0**y, np.log(0.5) * 0.5**y]
    np.testing.assert_allclose(d_exponent, expected, rtol=1e-6, atol=0)


def test_pow_base_derivative_at_a_zero_exponent_is_zero():
    # x^0 = 1 for every x, 0^0 included: d/dx is 0, where y x^(y-1) would be 0 * inf = NaN at
    # x = 0. Older JAX computed y x^(y == 0 ? 1 : y - 1), 0 there; JAX 0.11 (seen: jax.grad of
    # x ** y at (0., 0.)) gives NaN for float exponents. accy keeps the true derivative, 0.
    x = np.array([0.0, 3.0, 0.0], np.float32)
    exponent = np.array([0.0, 0.0, 2.0], np.float32)
    d_base, d_exponent = gradients(POWER, [x, exponent], wrt=(0, 1))
    # d/dx: 0, 0, and 2 * 0^1 = 0; d/dy: 0 (zero base), log(3) * 3^0, 0 (zero base).
    np.testing.assert_array_equal(d_base, [0.0, 0.0, 0.0])
    np.testing.assert_allclose(d_exponent, [0.0, np.log(3.0), 0.0], rtol=1e-6)


def test_pow_base_derivative_at_a_zero_exponent_is_zero_at_infinite_bases_too():
    # tinygrad's test_pow_zero_exponent: x^0 is 1 for every x, so d/dx is 0 at -inf, inf and 0
    # (JAX gives 0 at the infinities and NaN at 0 for a float exponent; 0 for x ** 0).
    x = np.array([-np.inf, np.inf, 0.0], np.float32)
    d_base = gradients(POWER, [x, np.zeros(3, np.float32)], wrt=(0,))[0]
    np.testing.assert_array_equal(d_base, [0.0, 0.0, 0.0])


@pytest.mark.parametrize("point", [(4.0, 0.0), (4.0, 1.5), (0.5, 0.0), (2.0, -1.0)])
def test_pow_mixed_second_derivative_matches_jax_in_either_order(point):
    # JAX's lax_autodiff_test testPowSecondDerivative: d2/dxdy x^y at (4, 0) is 1/4.
    jax = pytest.importorskip("jax")
    power = define("power", [spec(f32), spec(f32)], lambda b, args: args[0] ** args[1])
    args = [np.array(v, np.float32) for v in point]
    for first, second in ((0, 1), (1, 0)):
        twice = accy.grad(accy.grad(power, wrt=(first,)), wrt=(second,))
        (value,) = accy.reference.run(twice, args)
        expected = jax.grad(jax.grad(lambda x, y: x**y, first), second)(*point)
        np.testing.assert_allclose(value, expected, rtol=1e-5, err_msg=f"d/d{second} d/d{first}")


def test_pow_learnable_exponent_on_a_relu_output_has_finite_gradients():
    def body(b, args):
        x, exponent = args
        return (accy.nn.relu(x) ** exponent).sum("n")

    program = define("relu_power", [spec(f32, n=4), spec(f32)], body)
    x = np.array([-1.0, 0.0, 2.0, 3.0], np.float32)
    _, d_exponent = gradients(program, [x, np.array(1.5, np.float32)], wrt=(0, 1))
    # Only the positive entries depend on the exponent: log(2) 2^1.5 + log(3) 3^1.5.
    expected = np.log(2.0) * 2.0**1.5 + np.log(3.0) * 3.0**1.5
    np.testing.assert_allclose(d_exponent, expected, rtol=1e-6)


def test_pow_matches_finite_differences_away_from_zero():
    base = RNG.uniform(0.3, 2.0, 3)
    exponent = RNG.uniform(-1.5, 2.5, 3)
    check_grads(POWER, [base, exponent], wrt=(0, 1), order=2)


# -- prod -------------------------------------------------------------------------------------


def products_of_the_others(x, axes):
    """NumPy: for each element, the product over `axes` of the others (that element set to 1)."""
    result = np.empty_like(x)
    for index in np.ndindex(x.shape):
        masked = x.copy()
        masked[index] = 1.0
        # Only the elements that share index's position on the kept axes are in its product.
        keep = tuple(slice(None) if i in axes else index[i] for i in range(x.ndim))
        result[index] = np.prod(masked[keep])
    return result


def prod_program(axes):
    return define(
        "prod_loss",
        [spec(f32, a=2, b=3, c=4), spec(f32, a=2, b=3, c=4)],
        # A weighted sum of the products, so that each kept position has its own cotangent.
        lambda b, x: (x[0].prod(axes) * x[1].sum(axes)).sum(),
    )


def prod_inputs():
    x = RNG.uniform(0.5, 1.5, (2, 3, 4)) * RNG.choice([-1.0, 1.0], (2, 3, 4))
    x[0, 0, 0] = 0.0  # one zero in the (a=0, b=0) row and the a=0 slab
    x[1, 2, 1] = x[1, 2, 3] = 0.0  # two zeros in the (a=1, b=2) row
    x[1, 0, 2] = 0.0  # with the one above, two zeros in the a=1 slab
    return x.astype(np.float32), RNG.uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)


@pytest.mark.parametrize("axes", [("c",), ("a",), ("b", "c"), ("a", "c"), ("a", "b", "c")])
def test_prod_gradient_is_exact_with_zeros(axes):
    x, w = prod_inputs()
    program = prod_program(axes)
    (d_x,) = gradients(program, [x, w], wrt=(0,))
    positions = tuple("abc".index(a) for a in axes)
    weight = np.sum(w.astype(np.float64), axis=positions, keepdims=True)
    expected = products_of_the_others(x.astype(np.float64), positions) * weight
    assert np.isfinite(d_x).all()
    np.testing.assert_allclose(d_x, expected, rtol=1e-5, atol=1e-6)


def test_prod_gradient_of_the_worked_examples():
    # d prod / dx_i is the product of the others: [0, 2, 3] -> [6, 0, 0]; [0, 0, 3] -> 0.
    program = define("prod", [spec(f32, n=3)], lambda b, x: x[0].prod("n"))
    (one_zero,) = gradients(program, [np.array([0.0, 2.0, 3.0], np.float32)], wrt=(0,))
    (two_zeros,) = gradients(program, [np.array([0.0, 0.0, 3.0], np.float32)], wrt=(0,))
    np.testing.assert_array_equal(one_zero, [6.0, 0.0, 0.0])
    np.testing.assert_array_equal(two_zeros, [0.0, 0.0, 0.0])


def test_prod_with_a_zero_init_parameter():
    # init * prod(x): d/d init = prod(x) = 6 and d/dx = init * (others) = 0, with init = 0
    # (a rule that divided by init as well would give NaN here).
    program = define(
        "prod_init", [spec(f32, n=3), spec(f32)], lambda b, x: x[0].reduce(x[1], "prod", "n")
    )
    d_x, d_init = gradients(program, [np.array([1.0, 2.0, 3.0], np.float32), np.float32(0)], (0, 1))
    np.testing.assert_array_equal(d_x, [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(d_init, 6.0)


@pytest.mark.slow
@pytest.mark.parametrize("axes", [("c",), ("a", "c"), ("a", "b", "c")])
def test_prod_matches_finite_differences_to_second_order(axes):
    x = RNG.uniform(0.5, 1.5, (2, 3, 4)) * RNG.choice([-1.0, 1.0], (2, 3, 4))
    check_grads(prod_program(axes), [x, RNG.uniform(0.5, 1.5, (2, 3, 4))], wrt=(0, 1), order=2)


def test_prod_second_derivative_is_exact_with_zeros():
    # f = x0 x1 x2: d2f/dx0 dx1 = x2, at x = [0, 0, 3] that is 3 (not NaN).
    # Checked through the gradient of the first partial: grad(df/dx0) = [0, x2, x1] = [0, 3, 0].
    def first_partial(b, x):
        inner = define("prod", [spec(f32, n=3)], lambda b, y: y[0].prod("n"))
        g = b.call(accy.grad(inner, wrt=(0,)), [x[0]])
        return g.slice("n", 0, 1).sum("n")

    program = define("d_prod_d_x0", [spec(f32, n=3)], first_partial)
    (hessian_row,) = gradients(program, [np.array([0.0, 0.0, 3.0], np.float32)], wrt=(0,))
    np.testing.assert_array_equal(hessian_row, [0.0, 3.0, 0.0])


def test_prod_over_an_axis_of_one_element():
    # prod over b (extent 1) is x itself: the gradient is 1 everywhere, zeros included.
    program = define("prod1", [spec(f32, a=3, b=1)], lambda b, x: x[0].prod("b").sum("a"))
    (d_x,) = gradients(program, [np.array([[0.0], [2.0], [-1.0]], np.float32)], wrt=(0,))
    np.testing.assert_array_equal(d_x, np.ones((3, 1)))


# -- abs, relu, max ---------------------------------------------------------------------------


def test_abs_derivative_at_zero_is_zero():
    # sign(0) = 0: the even tie split of abs(x) = max(x, -x), 0.5 * 1 + 0.5 * (-1). accy differs
    # from JAX deliberately (its _abs_jvp_rule is select(x >= 0, g, -g): jax.grad(jnp.abs)(0.)
    # is 1.0); PyTorch gives 0.
    program = define("abs", [spec(f32, n=3)], lambda b, x: x[0].abs().sum("n"))
    as_max = define("abs_max", [spec(f32, n=3)], lambda b, x: x[0].max(-x[0]).sum("n"))
    x = np.array([-2.0, 0.0, 3.0], np.float32)
    for source in (program, as_max):
        (d_x,) = gradients(source, [x], wrt=(0,))
        np.testing.assert_array_equal(d_x, [-1.0, 0.0, 1.0])


def test_relu_derivative_at_zero_is_zero_while_max_ties_split():
    # jax.nn.relu's custom JVP is select(x > 0, g, 0): 0 at x = 0, as PyTorch's relu. max(x, 0)
    # itself keeps the even split at the tie (0.5), as JAX's maximum does.
    relu = define("relu", [spec(f32, n=4)], lambda b, x: accy.nn.relu(x[0]).sum("n"))
    maximum = define("max0", [spec(f32, n=4)], lambda b, x: x[0].max(0.0).sum("n"))
    x = np.array([-1.0, 0.0, 2.0, 3.0], np.float32)
    (d_relu,) = gradients(relu, [x], wrt=(0,))
    (d_max,) = gradients(maximum, [x], wrt=(0,))
    np.testing.assert_array_equal(d_relu, [0.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(d_max, [0.0, 0.5, 1.0, 1.0])


def test_relu_values_at_the_edges():
    program = define("relu", [spec(f32, n=5)], lambda b, x: accy.nn.relu(x[0]))
    x = np.array([-np.inf, -0.0, 0.0, np.inf, np.nan], np.float32)
    (y,) = accy.reference.run(program, [x])
    np.testing.assert_array_equal(y, [0.0, 0.0, 0.0, np.inf, np.nan])


# -- cross_entropy ----------------------------------------------------------------------------


def log_softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


CROSS_ENTROPY = define(
    "cross_entropy",
    [spec(f32, batch=2, out=3), spec(f32, batch=2, out=3)],
    lambda b, x: accy.nn.cross_entropy(x[0], x[1], "out").sum("batch"),
)


def test_cross_entropy_label_gradient_is_minus_log_softmax():
    # optax.softmax_cross_entropy(logits, labels) = -sum(labels * log_softmax(logits)): labels
    # are differentiable, with gradient -log_softmax(logits); the logits get
    # softmax * sum(labels) - labels. The second row's labels do not sum to 1 on purpose.
    logits = np.array([[1.0, 2.0, 0.5], [-1.0, 0.0, 3.0]], np.float32)
    labels = np.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.1]], np.float32)
    value = accy.reference.run(CROSS_ENTROPY, [logits, labels])[0]
    d_logits, d_labels = gradients(CROSS_ENTROPY, [logits, labels], wrt=(0, 1))
    log_p = log_softmax(logits.astype(np.float64))
    np.testing.assert_allclose(value, -(labels * log_p).sum(), rtol=1e-6)
    np.testing.assert_allclose(d_labels, -log_p, rtol=1e-6)
    expected = np.exp(log_p) * labels.sum(axis=-1, keepdims=True) - labels
    np.testing.assert_allclose(d_logits, expected, rtol=1e-5, atol=1e-7)


def test_cross_entropy_matches_finite_differences_in_both_arguments():
    logits = RNG.normal(size=(2, 3))
    labels = RNG.uniform(0.0, 1.0, (2, 3))
    check_grads(CROSS_ENTROPY, [logits, labels], wrt=(0, 1), order=2)


INTEGER_CROSS_ENTROPY = define(
    "integer_cross_entropy",
    [spec(f32, batch=2, token=3, out=5), spec(accy.i32, batch=2, token=3)],
    lambda b, x: accy.nn.cross_entropy(x[0], x[1], "out").sum(("batch", "token")),
)


def test_integer_label_cross_entropy_is_logsumexp_minus_the_labels_logit():
    logits = RNG.normal(size=(2, 3, 5)).astype(np.float32)
    labels = np.array([[0, 4, 2], [1, 1, 3]], np.int32)
    value = accy.reference.run(INTEGER_CROSS_ENTROPY, [logits, labels])[0]
    log_p = log_softmax(logits.astype(np.float64))
    picked = np.take_along_axis(log_p, labels[..., None], axis=-1)
    np.testing.assert_allclose(value, -picked.sum(), rtol=1e-6)
    (d_logits,) = gradients(INTEGER_CROSS_ENTROPY, [logits, labels], wrt=(0,))
    one_hot = np.eye(5)[labels]
    np.testing.assert_allclose(d_logits, np.exp(log_p) - one_hot, rtol=1e-5, atol=1e-7)
    check_grads(INTEGER_CROSS_ENTROPY, [logits, labels], wrt=(0,), order=2)


def test_integer_label_cross_entropy_stores_no_one_hot():
    # The one stored intermediate of the examples x classes size is logsumexp's exp(x - max)
    # (the softmax numerator): the label comparison is fused, never a stored one-hot.
    grad = accy.value_and_grad(INTEGER_CROSS_ENTROPY, wrt=(0,))
    plan = accy.lower.build_plan(grad)
    full = spec(f32, batch=2, token=3, out=5).size
    stored = [v for v, slot in plan.slots.items() if slot.storage == "workspace"]
    large = [op for op in grad.operations if op.results[0] in stored and op.type.size >= full]
    assert [(op.kind, op.attrs.get("op")) for op in large] == [("unary", "exp")]


@pytest.mark.parametrize(
    "labels, message",
    [
        (spec(f32, batch=2), "float labels are a distribution over 'out'"),
        (spec(accy.i32, batch=2, out=3), "cannot have the class axis 'out'"),
        (spec(accy.bool_, batch=2), "class indices"),
    ],
)
def test_cross_entropy_refuses_labels_of_the_wrong_form(labels, message):
    with pytest.raises((accy.AxisError, accy.DTypeError), match=message):
        accy.trace.define(
            "bad",
            [spec(f32, batch=2, out=3), labels],
            lambda b, x: accy.nn.cross_entropy(x[0], x[1], "out"),
        )


def test_causal_mask_comes_from_iota_and_compare_and_zeroes_future_keys():
    def body(b, x):
        return accy.nn.softmax(accy.nn.causal_mask(x[0]), "key")

    program = accy.trace.define("causal", [spec(f32, head=2, token=4, key=4)], body)
    assert all(
        not accy.core.arrays.is_array(op.attrs["value"])
        for op in program.operations
        if op.kind == "constant"
    )
    scores = RNG.normal(size=(2, 4, 4)).astype(np.float32)
    (weights,) = accy.reference.run(program, [scores])
    masked = np.where(np.tril(np.ones((4, 4), bool)), scores, -np.inf)
    expected = np.exp(masked - masked.max(-1, keepdims=True))
    np.testing.assert_allclose(weights, expected / expected.sum(-1, keepdims=True), rtol=1e-6)
