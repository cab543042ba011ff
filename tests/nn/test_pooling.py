"""max_pool and avg_pool against JAX's lax.reduce_window (values and gradients): ties (each
window's cotangent goes to its first maximum, as JAX's select_and_scatter_add), overlapping
windows, 'same' and explicit padding, odd sizes, bf16; on the reference, the native CPU and CUDA
backends. The gradients of tiling windows gather nothing: no value exceeds the padded input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import accy
from accy import bf16, f32, spec
from accy.core.windows import padding_pairs
from tests.executors import available_backends

jax = pytest.importorskip("jax")
jnp = jax.numpy

# (window, stride, accy padding, JAX padding) over the axes h, w of an [n, h, w, c] input.
POOLS = [
    ((2, 2), (2, 2), "valid", "VALID"),
    ((2, 3), (2, 3), "same", "SAME"),
    ((3, 3), (2, 2), "same", "SAME"),
    ((3, 2), (1, 2), "valid", "VALID"),
    ((2, 3), (2, 1), ((1, 0), (2, 1)), ((0, 0), (1, 0), (2, 1), (0, 0))),
]
BACKENDS = available_backends()  # the reference, and the native CPU and CUDA where they run


def _tied_input(shape, seed=0):
    """Small integers (exact in f32 and bf16) with many ties in every window."""
    return np.random.default_rng(seed).integers(0, 3, shape).astype(np.float32)


def _jax_pool(kind, x, window, stride, padding):
    dims, strides = (1, *window, 1), (1, *stride, 1)
    if kind == "max":
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, dims, strides, padding)
    total = jax.lax.reduce_window(x, 0.0, jax.lax.add, dims, strides, padding)
    return total / math.prod(window)


def _check_against_jax(kind, case, dtype, backend, x_shape=(2, 7, 6, 3)):
    window, stride, padding, jax_padding = case
    x = _tied_input(x_shape)
    pooled_shape = _jax_pool(kind, x, window, stride, jax_padding).shape
    weights = np.random.default_rng(1).integers(1, 5, pooled_shape).astype(np.float32)
    pool = accy.nn.max_pool if kind == "max" else accy.nn.avg_pool

    def body(b, args):
        named = dict(zip("hw", window, strict=True))
        pooled = pool(args[0], named, dict(zip("hw", stride, strict=True)), padding)
        return (pooled.convert(f32) * args[1]).sum()

    n, h, w, c = x_shape
    oh, ow = pooled_shape[1:3]
    types = [spec(dtype, n=n, h=h, w=w, c=c), spec(f32, n=n, h=oh, w=ow, c=c)]
    program = accy.trace.define(f"{kind}_pool", types, body)
    gradient = accy.value_and_grad(program)
    if window == stride:  # tiling windows: a reshape of the padded input, nothing gathered
        pairs = padding_pairs(padding, [h, w], window, stride, [1, 1])
        padded = math.prod(e + lo + hi for e, (lo, hi) in zip((h, w), pairs, strict=True))
        assert gradient.count("concatenate") == 0
        assert max(math.prod(op.type.extents) for op in gradient.operations) <= n * c * padded

    inputs = [x.astype(dtype.numpy), weights]
    value, grad = backend(gradient, inputs)

    def jax_loss(a, wts):
        return (_jax_pool(kind, a, window, stride, jax_padding).astype(jnp.float32) * wts).sum()

    want_value, want_grad = jax.value_and_grad(jax_loss)(jnp.asarray(inputs[0]), weights)
    # bf16: a backend may sum a window in f32 and round once where JAX rounds as it goes (the
    # CUDA backend's avg pool differs from JAX's by a bf16 rounding, 1e-4 of the total).
    rtol = 1e-6 if dtype == f32 else 2**-7
    np.testing.assert_allclose(value, want_value, rtol=rtol)
    np.testing.assert_allclose(
        np.asarray(grad, np.float32), np.asarray(want_grad, np.float32), rtol=rtol, atol=1e-6
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", [b for _, b in BACKENDS], ids=[n for n, _ in BACKENDS])
@pytest.mark.parametrize("case", POOLS, ids=str)
def test_max_pool_sends_each_window_cotangent_to_its_first_maximum_as_jax(case, backend):
    _check_against_jax("max", case, f32, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [b for _, b in BACKENDS], ids=[n for n, _ in BACKENDS])
@pytest.mark.parametrize("case", POOLS[1:], ids=str)
def test_avg_pool_of_overlapping_and_padded_windows_matches_jax(case, backend):
    _check_against_jax("avg", case, f32, backend)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_bf16_pools_match_jax(kind):
    _check_against_jax(kind, POOLS[1], bf16, BACKENDS[-1][1], x_shape=(1, 5, 5, 2))


def test_max_pool_forward_tangent_is_the_first_maximum_s_tangent():
    """Forward mode agrees with reverse: JAX's jvp of reduce_window max picks the tangent of
    each window's first maximum too."""
    x = np.array([[1, 3, 3, 0], [3, 2, 1, 1], [0, 0, 5, 5], [0, 0, 5, 5]], np.float32)
    tangent = np.arange(16, dtype=np.float32).reshape(4, 4)

    def pooled_sum(b, args):
        return accy.nn.max_pool(args[0], {"h": 2, "w": 2}).sum()

    program = accy.trace.define("p", [spec(f32, h=4, w=4)], pooled_sum)
    _, got = accy.reference.run(accy.jvp(program), [x, tangent])

    def jax_sum(a):
        return jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, (2, 2), (2, 2), "VALID").sum()

    _, want = jax.jvp(jax_sum, (jnp.asarray(x),), (jnp.asarray(tangent),))
    assert float(got) == float(want) == 21.0


def test_reduce_window_errors_say_what_is_wrong():
    x_type = [spec(f32, h=3, w=3)]
    with pytest.raises(accy.TypeRuleError, match="op 'mean' is not one of"):
        accy.trace.define("e", x_type, lambda b, a: a[0].reduce_window("mean", {"h": 2}))
    with pytest.raises(accy.AxisError, match="spans 4 elements"):
        accy.trace.define("e", x_type, lambda b, a: accy.nn.max_pool(a[0], {"h": 4}, 1))
    with pytest.raises(accy.AxisError, match="must all be >= 1"):
        accy.trace.define("e", x_type, lambda b, a: accy.nn.avg_pool(a[0], {"w": 2}, 0))


def test_a_window_with_a_nan_pools_to_nan_as_jax():
    x = np.array([[1, np.nan, 2, 0], [3, 2, 1, 1]], np.float32)
    program = accy.trace.define(
        "p", [spec(f32, h=2, w=4)], lambda b, a: accy.nn.max_pool(a[0], {"h": 2, "w": 2})
    )
    for _, backend in BACKENDS:
        got = backend(program, [x])[0]
        want = jax.lax.reduce_window(jnp.asarray(x), -jnp.inf, jax.lax.max, (2, 2), (2, 2), "VALID")
        np.testing.assert_array_equal(got, np.asarray(want))
