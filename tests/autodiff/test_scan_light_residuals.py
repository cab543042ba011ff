"""Reverse mode of a scan recomputes light primal values (arithmetic without transcendentals,
layout, constants, and transcendentals of values at hand) in the backward scan instead of
stacking them (`scan_split.light_recompute`):
fewer stacked bytes, the same gradient as the unrolled program and finite differences."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import accy
from accy import bf16, f32, spec
from accy.transforms import scan_split, unroll

from .test_scan_gradients import _check


def _gelu_layers(b, args):
    """A scan over `t` of a tanh-GELU layer with a per-step weight and a broadcast scale."""
    x0, ws = args

    def step(_, a):
        x, w = a
        h = x * w
        inner = (h + h * h * h * 0.044715) * 0.7978846
        return h * 0.5 * (inner.tanh() + 1.0) + x

    (final,), _ = b.scan(step, carries=[x0], xs=[ws], axis="t")
    return (final * final).sum("h")


def _stacked_bytes(gradient) -> int:
    forward = [op for op in gradient.operations if op.kind == "scan"][0]
    return sum(t.nbytes for t in forward.result_types[forward.attrs["num_carry"] :])


@pytest.mark.slow
def test_light_values_are_recomputed_and_the_gradient_is_unchanged(monkeypatch):
    program = accy.trace.define("gelu", [spec(f32, h=6), spec(f32, t=4, h=6)], _gelu_layers)
    light = _check(program, wrt=(0, 1), cpu=True)
    # The residuals as they were stacked before: every primal value the linear body reads.
    monkeypatch.setattr(
        scan_split,
        "light_recompute",
        lambda body, needed, role_of, producer: {
            v for v in needed if v not in role_of and not producer[v].operands
        },
    )
    stacked_all = _check(program, wrt=(0, 1), cpu=True)
    # h and tanh(inner) per step (h is x*w, read back as the residual of the product rule);
    # before, also the products h*h, h*h*h, inner and the broadcast constants' products.
    assert _stacked_bytes(light) <= 2 * 4 * 6 * 4
    assert _stacked_bytes(light) < _stacked_bytes(stacked_all)


@pytest.mark.slow
def test_the_demo_scan_stacks_less_and_matches_the_unrolled_model():
    import numpy as np

    from accy.demo.data import VOCAB, SortingTask
    from accy.demo.model import Config, initial_parameters, loss, parameter_specs

    task = SortingTask()
    results = {}
    for scan in (False, True):
        config = Config(vocab=VOCAB, tokens=task.tokens, layers=2, scan_layers=scan, batch=4)
        values = initial_parameters(config, np.random.default_rng(0))
        specs = parameter_specs(config)
        params = {k: accy.named(v, specs[k].axes) for k, v in values.items()}
        batch = [accy.named(a, ("batch", "token")) for a in task.batch(np.random.default_rng(1), 4)]
        step = accy.jit(
            lambda p, i, t, w, c=config: accy.value_and_grad(lambda p: loss(p, i, t, w, c))(p)
        )
        value, grads = step(params, *batch)
        results[scan] = (float(np.asarray(value.array)), grads)
    assert abs(results[True][0] - results[False][0]) < 1e-5
    stacked = results[True][1]["layers_up"].array
    for layer in range(2):
        np.testing.assert_allclose(
            np.asarray(stacked)[layer],
            np.asarray(results[False][1][f"l{layer}_up"].array),
            rtol=1e-4,
            atol=1e-6,
        )


def _swish_layers(b, args):
    """A scan over `t` of x + g * logistic(g), g = exp(x * w): the derivative reads g (g' = g)
    and logistic(g), which is recomputed from g rather than stacked."""
    x0, ws = args

    def step(_, a):
        x, w = a
        g = (x * w).exp()
        return g * g.logistic() + x

    (final,), _ = b.scan(step, carries=[x0], xs=[ws], axis="t")
    return (final * final).sum("h")


def test_a_transcendental_of_a_stacked_value_is_recomputed():
    program = accy.trace.define("swish", [spec(f32, h=6), spec(f32, t=4, h=6)], _swish_layers)
    gradient = _check(program, wrt=(0, 1))
    # x (read by the derivative of x * w) and g, 4 steps of 6 f32 each; not logistic(g).
    assert _stacked_bytes(gradient) == 2 * 4 * 6 * 4


def _rms_norm_layers(b, args):
    """A scan over `t` of x + tanh(w * bf16(f32(x) * rstd)): the norm weight's derivative reads
    the bf16 normalized x, a conversion of an f32 product twice its bytes."""
    x0, ws = args

    def step(_, a):
        x, w = a
        x32 = x.convert(f32)
        rstd = ((x32 * x32).sum("h") * 0.125 + 1e-6).rsqrt()
        return ((x32 * rstd).convert(bf16) * w).tanh() + x

    (final,), _ = b.scan(step, carries=[x0], xs=[ws], axis="t")
    return (final.convert(f32) * final.convert(f32)).sum("h")


def test_a_narrowing_chain_over_stacked_values_is_recomputed():
    program = accy.trace.define("rms", [spec(bf16, h=8), spec(bf16, t=4, h=8)], _rms_norm_layers)
    gradient = accy.value_and_grad(program, (0, 1))
    # x, its mean square and the tanh per step (4 steps); not the normalized x, which the
    # backward scan computes again from x and the mean square.
    assert _stacked_bytes(gradient) == 4 * (8 * 2 + 4 + 8 * 2)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(t.extents).astype(ml_dtypes.bfloat16) for t in
              program.parameter_types]  # fmt: skip
    oracle = accy.value_and_grad(unroll.apply(program), (0, 1))
    got, want = accy.reference.run(gradient, inputs), accy.reference.run(oracle, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
