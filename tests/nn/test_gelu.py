"""`accy.nn.gelu_tanh` (one unary op, `gelu_tanh`, with its derivative `gelu_tanh_slope`) and
`accy.nn.gelu` against JAX's `jax.nn.gelu`: values, first and second derivatives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import accy

X = np.linspace(-7.0, 7.0, 57).astype(np.float32)


def _theirs(approximate: bool):
    return lambda x: jax.nn.gelu(x, approximate=approximate)


def _ours(approximate: bool):
    return accy.nn.gelu_tanh if approximate else accy.nn.gelu


@pytest.mark.parametrize("approximate", [True, False])
def test_gelu_and_its_derivatives_match_jax(approximate):
    ours, theirs = _ours(approximate), _theirs(approximate)
    x = accy.named(X, "n", device="reference")
    # In the far negative tail 1 + tanh(u) and 1 - tanh(u)^2 cancel: the two tanh
    # implementations differ there by float32 roundings of 1, not relatively, so each check
    # allows a few float32 units of its function's largest value (about 7, 1.1 and 0.8).
    np.testing.assert_allclose(ours(x).array, theirs(X), rtol=2e-6, atol=2e-6)

    def slope(v):
        return accy.grad(lambda u: ours(u).sum())(v)

    np.testing.assert_allclose(
        slope(x).array, jax.grad(lambda u: theirs(u).sum())(X), rtol=2e-6, atol=5e-6
    )
    curvature = accy.grad(lambda u: slope(u).sum())(x)
    expected = jax.grad(lambda u: jax.grad(lambda w: theirs(w).sum())(u).sum())(X)
    np.testing.assert_allclose(curvature.array, expected, rtol=1e-5, atol=5e-5)


def test_gelu_tanh_is_one_op_and_its_gradient_another():
    t = accy.spec(accy.f32, n=4)
    program = accy.trace.define("g", [t], lambda b, a: accy.nn.gelu_tanh(a[0]).sum("n"))
    assert [op.attrs["op"] for op in program.operations if op.kind == "unary"] == ["gelu_tanh"]
    gradient = accy.grad(program, wrt=(0,))
    ops = {op.attrs["op"] for op in gradient.operations if op.kind == "unary"}
    assert "gelu_tanh_slope" in ops


def test_bf16_gelu_tanh_rounds_once_from_float32():
    x = np.linspace(-4, 4, 33).astype(accy.bf16.numpy)
    got = accy.nn.gelu_tanh(accy.named(x, "n", device="reference")).array
    exact = jax.nn.gelu(jnp.asarray(x.astype(np.float32)), approximate=True)
    np.testing.assert_array_equal(got, np.asarray(exact).astype(accy.bf16.numpy))
