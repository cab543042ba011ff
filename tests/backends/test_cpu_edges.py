"""The derivative conventions at non-differentiable points (tests/autodiff/test_edges.py), in
gradient programs compiled for the native CPU: values checked against NumPy."""

from __future__ import annotations

import numpy as np

import accy
from accy import f32, spec
from accy.trace import define


def test_prod_gradient_with_zeros_on_cpu(native_cpu):
    # Reduced over (b, c), kept a: each a-slab's gradient is the product of the others in it.
    program = define(
        "prod_loss", [spec(f32, a=2, b=2, c=3)], lambda b, x: x[0].prod(("b", "c")).sum()
    )
    x = np.array(
        [[[0.0, 2.0, 3.0], [1.5, -1.0, 0.5]], [[0.0, 2.0, 0.0], [1.0, 4.0, 2.0]]], np.float32
    )
    (d_x,) = accy.compile(accy.grad(program), device="cpu")(x)
    expected = np.zeros((2, 2, 3))
    for index in np.ndindex(x.shape):
        others = x[index[0]].astype(np.float64)  # the slab of the element
        others[index[1:]] = 1.0
        expected[index] = np.prod(others)
    # Slab 0 has one zero: only that element's gradient is nonzero, 2*3*1.5*-1*0.5 = -4.5.
    assert expected[0, 0, 0] == -4.5 and not expected[1].any()
    np.testing.assert_allclose(d_x, expected, rtol=1e-6)


def test_pow_gradient_at_a_zero_base_on_cpu(native_cpu):
    program = define(
        "power", [spec(f32, n=3), spec(f32, n=3)], lambda b, x: (x[0] ** x[1]).sum("n")
    )
    x = np.array([0.0, 0.0, 2.0], np.float32)
    y = np.array([0.0, 2.0, 0.5], np.float32)
    d_x, d_y = accy.compile(accy.grad(program, wrt=(0, 1)), device="cpu")(x, y)
    # d/dx: 0 at y = 0, 2 * 0 = 0, 0.5 / sqrt(2); d/dy: 0, 0 at x = 0, log(2) sqrt(2).
    np.testing.assert_allclose(d_x, [0.0, 0.0, 0.5 / np.sqrt(2.0)], rtol=1e-6)
    np.testing.assert_allclose(d_y, [0.0, 0.0, np.log(2.0) * np.sqrt(2.0)], rtol=1e-6)


def test_prod_second_derivative_with_zeros_on_cpu(native_cpu):
    # The gradient of d(x0 x1 x2)/dx0 = x1 x2 is [0, x2, x1] = [0, 3, 0] at x = [0, 0, 3].
    inner = define("prod", [spec(f32, n=3)], lambda b, y: y[0].prod("n"))
    program = define(
        "d_prod_d_x0",
        [spec(f32, n=3)],
        lambda b, x: b.call(accy.grad(inner), [x[0]]).slice("n", 0, 1).sum("n"),
    )
    x = np.array([0.0, 0.0, 3.0], np.float32)
    (row,) = accy.compile(accy.grad(program), device="cpu")(x)
    np.testing.assert_array_equal(row, [0.0, 3.0, 0.0])
