"""Convolution and windowed reductions (accy.core.windows, nn.max_pool/avg_pool): values
against direct NumPy loops, derivatives against finite differences, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import accy
from accy import f32, f64, spec
from accy.core.windows import padding_pairs
from accy.testing import check_grads


def _numpy_conv(x, k, stride, pairs, dilation, groups):
    """x: [batch, h, w, c]; k: [h, w, c / groups, o] (NHWC, HWIO) by direct loops."""
    x = np.pad(x, ((0, 0), *[(max(lo, 0), max(hi, 0)) for lo, hi in pairs], (0, 0)))
    crop = [slice(-min(lo, 0), x.shape[1 + d] + min(hi, 0)) for d, (lo, hi) in enumerate(pairs)]
    x = x[:, crop[0], crop[1]]
    kh, kw, per_group, outputs = k.shape
    oh = (x.shape[1] - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    ow = (x.shape[2] - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    out = np.zeros((x.shape[0], oh, ow, outputs))
    per_out = outputs // groups
    for i, j, o in itertools.product(range(oh), range(ow), range(outputs)):
        g = o // per_out
        rows = i * stride[0] + dilation[0] * np.arange(kh)
        cols = j * stride[1] + dilation[1] * np.arange(kw)
        patch = x[:, rows][:, :, cols][..., g * per_group : (g + 1) * per_group]
        out[:, i, j, o] = np.einsum("bhwc,hwc->b", patch, k[..., o])
    return out


CONVS = [  # (stride, padding, dilation, groups, channels, outputs)
    ((1, 1), "valid", (1, 1), 1, 3, 4),
    ((2, 1), "same", (1, 1), 1, 2, 3),
    ((1, 2), ((2, 0), (1, -1)), (2, 1), 1, 2, 2),
    ((2, 2), "same", (1, 2), 2, 4, 6),
]


def _conv_program(stride, padding, dilation, groups, channels, outputs, dtype=f64):
    types = [
        spec(dtype, batch=2, height=7, width=6, channel=channels),
        spec(dtype, height=3, width=2, channel=channels // groups, out_channel=outputs),
    ]

    def body(b, args):
        x, k = args
        return x.conv(
            k, ("height", "width"), "channel", "out_channel", stride, padding, dilation, groups
        )

    return accy.trace.define("conv", types, body)


@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv_matches_direct_loops(case):
    stride, padding, dilation, groups, channels, outputs = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 6, channels))
    k = rng.standard_normal((3, 2, channels // groups, outputs))
    program = _conv_program(*case)
    got = accy.reference.run(program, [x, k])[0]
    pairs = padding_pairs(padding, [7, 6], [3, 2], stride, dilation)
    np.testing.assert_allclose(got, _numpy_conv(x, k, stride, pairs, dilation, groups), 1e-12)


@pytest.mark.parametrize("case", CONVS[1:], ids=str)
def test_conv_derivatives_are_the_transposed_and_kernel_gradient_convolutions(case):
    program = _conv_program(*case, dtype=f32)
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(t.extents) for t in program.parameter_types]
    check_grads(program, args, wrt=(0, 1), order=1, eps=1e-6, atol=1e-4, rtol=1e-4)


def test_pooling_matches_numpy_and_differentiates():
    x = np.random.default_rng(2).standard_normal((2, 6, 5))

    def body(b, args):
        return (
            accy.nn.max_pool(args[0], {"h": 2, "w": 2}),
            accy.nn.avg_pool(args[0], {"h": 3, "w": 2}, {"h": 1, "w": 2}, "same"),
        )

    program = accy.trace.define("pool", [spec(f64, n=2, h=6, w=5)], body)
    largest, mean = accy.reference.run(program, [x])
    expected = x[:, :6, :4].reshape(2, 3, 2, 2, 2).max((2, 4))
    np.testing.assert_array_equal(largest, expected)
    padded = np.pad(x, ((0, 0), (1, 1), (0, 1)))
    windows = [padded[:, i : i + 3, j : j + 2].mean((1, 2)) for i in range(6) for j in (0, 2, 4)]
    np.testing.assert_allclose(mean, np.stack(windows, 1).reshape(2, 6, 3), 1e-12)
    check_grads(program, [x], order=1, eps=1e-6)


def test_conv_errors_name_the_axes():
    types = [spec(f32, h=5, c=3), spec(f32, h=2, c=2, o=4)]
    with pytest.raises(accy.AxisError, match="2 groups"):
        accy.trace.define("e", types, lambda b, a: a[0].conv(a[1], ["h"], "c", "o", groups=2))
    with pytest.raises(accy.TypeRuleError, match="padding 'full'"):
        accy.trace.define(
            "e",
            [spec(f32, h=5, c=2), types[1]],
            lambda b, a: a[0].conv(a[1], ["h"], "c", "o", padding="full"),
        )
    with pytest.raises(accy.AxisError, match="spans"):
        accy.trace.define(
            "e", [spec(f32, h=1, c=2), types[1]], lambda b, a: a[0].conv(a[1], ["h"], "c", "o")
        )


@pytest.mark.slow
def test_tiling_pools_read_their_input_once_and_match_jax_with_their_gradients():
    """Windows that tile (stride = window): a reshape and a reduction, no gathered windows,
    and the same values and gradients as JAX's reduce_window (distinct inputs: no ties)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = np.random.default_rng(3).permutation(2 * 7 * 5 * 3).reshape(2, 7, 5, 3) / 10.0

    def body(b, args):
        pooled = accy.nn.max_pool(args[0], {"h": 2, "w": 2}, padding="same")
        mean = accy.nn.avg_pool(args[0], {"h": 3, "w": 2})
        return (pooled * pooled).sum() + (mean * mean).sum()

    program = accy.trace.define("tiles", [spec(f64, n=2, h=7, w=5, c=3)], body)
    assert program.count("concatenate") == 0
    grad_program = accy.value_and_grad(program)
    assert grad_program.count("concatenate") == 0
    value, grad = accy.reference.run(grad_program, [x])

    def jax_loss(a):
        windows = (1, 2, 2, 1)
        pooled = jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, windows, windows, "SAME")
        sizes = (1, 3, 2, 1)
        mean = jax.lax.reduce_window(a, 0.0, jax.lax.add, sizes, sizes, "VALID") / 6.0
        return (pooled * pooled).sum() + (mean * mean).sum()

    with jax.enable_x64(True):
        want_value, want_grad = jax.value_and_grad(jax_loss)(jnp.asarray(x))
    np.testing.assert_allclose(value, want_value, rtol=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-12, atol=1e-12)
