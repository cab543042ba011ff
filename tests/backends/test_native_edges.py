"""The derivative conventions at non-differentiable points (tests/autodiff/test_edges.py), in
gradient programs run on every backend (reference, native CPU, CUDA): values against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.trace import define

from ..executors import EXECUTORS


@pytest.mark.parametrize("executor", EXECUTORS)
def test_prod_gradient_with_zeros(executor):
    # Reduced over (b, c), kept a: each a-slab's gradient is the product of the others in it.
    program = define(
        "prod_loss", [spec(f32, a=2, b=2, c=3)], lambda b, x: x[0].prod(("b", "c")).sum()
    )
    x = np.array(
        [[[0.0, 2.0, 3.0], [1.5, -1.0, 0.5]], [[0.0, 2.0, 0.0], [1.0, 4.0, 2.0]]], np.float32
    )
    (d_x,) = executor(accy.grad(program), [x])
    expected = np.zeros((2, 2, 3))
    for index in np.ndindex(x.shape):
        others = x[index[0]].astype(np.float64)  # the slab of the element
        others[index[1:]] = 1.0
        expected[index] = np.prod(others)
    # Slab 0 has one zero: only that element's gradient is nonzero, 2*3*1.5*-1*0.5 = -4.5.
    assert expected[0, 0, 0] == -4.5 and not expected[1].any()
    np.testing.assert_allclose(d_x, expected, rtol=1e-6)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_prod_second_derivative_with_zeros(executor):
    # The gradient of d(x0 x1 x2)/dx0 = x1 x2 is [0, x2, x1] = [0, 3, 0] at x = [0, 0, 3].
    inner = define("prod", [spec(f32, n=3)], lambda b, y: y[0].prod("n"))
    program = define(
        "d_prod_d_x0",
        [spec(f32, n=3)],
        lambda b, x: b.call(accy.grad(inner), [x[0]]).slice("n", 0, 1).sum("n"),
    )
    (row,) = executor(accy.grad(program), [np.array([0.0, 0.0, 3.0], np.float32)])
    np.testing.assert_array_equal(row, [0.0, 3.0, 0.0])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_pow_and_relu_gradients_at_zero(executor):
    def body(b, x):
        base, exponent = x
        return (base**exponent).sum("n") + accy.nn.relu(exponent - 2.0).sum("n")

    program = define("power", [spec(f32, n=3), spec(f32, n=3)], body)
    x = np.array([0.0, 0.0, 2.0], np.float32)
    y = np.array([0.0, 2.0, 0.5], np.float32)
    d_x, d_y = executor(accy.grad(program, wrt=(0, 1)), [x, y])
    # d/dx: 0 at y = 0, 2 * 0 = 0, 0.5 / sqrt(2). d/dy: 0 at x = 0 (twice), log(2) sqrt(2);
    # relu(y - 2) adds nothing: y - 2 is 0 at y = 2 (relu'(0) = 0) and negative elsewhere.
    np.testing.assert_allclose(d_x, [0.0, 0.0, 0.5 / np.sqrt(2.0)], rtol=1e-6)
    np.testing.assert_allclose(d_y, [0.0, 0.0, np.log(2.0) * np.sqrt(2.0)], rtol=1e-6)
