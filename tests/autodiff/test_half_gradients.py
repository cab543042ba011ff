"""Gradients of bf16 losses (an MLP and attention, with f32 accumulation) against float64.

Two checks per loss:

1. The rules are exact. The gradient program traced in bf16 (its converts and its contractions
   with `accumulate=f32`, transposed with the cotangent converted back to each operand's
   dtype), retyped to float64 afterwards, must equal the float64 gradient, which
   `check_grads` verifies against float64 finite differences of the same computation. Any
   missing or extra term in a transpose rule shows up here at 1e-10, rounding aside.
2. The bf16 evaluation is as accurate as the format allows. Every path from an input to a
   gradient passes through at most K = 8 bf16 roundings (forward: the parameter, the hidden
   activation, the output; backward: the cotangents and products converted back to bf16), each
   off by at most the unit roundoff u = 2^-8 relative; sums accumulate in f32 (error ~1e-7).
   To first order the gradient is off by at most K * u = 2^-5 relative, normwise; the test
   asserts exactly that bound.
"""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bf16, f32, f64, nn, spec
from accy.transforms.retype import promote_floats

U = 2.0**-8  # bf16's unit roundoff (8 significant bits)
K = 8  # bf16 roundings on any path through the losses below (see the module doc)


def mlp_loss(b, args):
    x, w1, w2 = args  # x: [batch, feature]; w1: [feature, hidden]; w2: [hidden, out]
    hidden = x.contract(w1, "feature", accumulate=f32).tanh().convert(bf16)
    out = hidden.contract(w2, "hidden", accumulate=f32)
    return (out * out).mean(("batch", "out"))


def attention_loss(b, args):
    q, k, v = args  # [token, channel] each
    scores = q.contract(k.rename("token", "key"), "channel", accumulate=f32) * 0.5
    weights = nn.softmax(scores, "key").convert(bf16)
    mixed = weights.contract(v.rename("token", "key"), "key", accumulate=f32)
    return (mixed * mixed).sum(("token", "channel"))


LOSSES = {
    "mlp": (
        mlp_loss,
        [
            spec(bf16, batch=6, feature=5),
            spec(bf16, feature=5, hidden=7),
            spec(bf16, hidden=7, out=3),
        ],
    ),
    "attention": (attention_loss, [spec(bf16, token=4, channel=6)] * 3),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", LOSSES)
def test_bf16_gradients_are_exact_rules_and_within_the_format_bound(name):
    body, types = LOSSES[name]
    loss = accy.trace.define(name, types, body)
    wrt = tuple(range(len(types)))
    rng = np.random.default_rng(3)
    values = [rng.standard_normal(t.extents).astype(bf16.numpy) for t in types]
    wide_values = [v.astype(np.float64) for v in values]

    wide_loss = promote_floats(loss, f64)
    accy.testing.check_grads(wide_loss, wide_values, wrt=wrt, order=1, atol=1e-6, rtol=1e-6)
    exact = accy.reference.run(accy.grad(wide_loss, wrt=wrt), wide_values)

    gradient = accy.grad(loss, wrt=wrt)
    assert any(op.kind == "convert" for op in gradient.operations)
    retyped = accy.reference.run(promote_floats(gradient, f64), wide_values)
    for got, want in zip(retyped, exact, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)

    for device in ("reference", "cpu"):
        computed = accy.compile(gradient, device=device)(*values)
        for got, want in zip(computed, exact, strict=True):
            assert got.dtype == bf16.numpy
            error = np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want)
            assert error <= K * U, f"{device}: relative error {error:.4f} > {K * U:.4f}"
