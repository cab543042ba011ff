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
    # x = 0. JAX's _pow_jvp_lhs computes y x^(y == 0 ? 1 : y - 1), which is 0 there.
    x = np.array([0.0, 3.0, 0.0], np.float32)
    exponent = np.array([0.0, 0.0, 2.0], np.float32)
    d_base, d_exponent = gradients(POWER, [x, exponent], wrt=(0, 1))
    # d/dx: 0, 0, and 2 * 0^1 = 0; d/dy: 0 (zero base), log(3) * 3^0, 0 (zero base).
    np.testing.assert_array_equal(d_base, [0.0, 0.0, 0.0])
    np.testing.assert_allclose(d_exponent, [0.0, np.log(3.0), 0.0], rtol=1e-6)


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
