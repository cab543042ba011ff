"""The cotangents of a scan's loop-invariant operands (weights, closures): per-step
contractions of values that change with the step are stacked and contracted once after the
reverse scan (one GEMM over the steps) instead of being added into a carry at every step; other
terms still accumulate in a carry. Values against the unrolled gradient (the oracle) and
finite differences, on every backend."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.transforms import unroll

from ..executors import EXECUTORS


def _inputs(program, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (0.5 * rng.standard_normal(t.extents)).astype(np.float32) for t in program.parameter_types
    ]


def _reverse_scan(gradient):
    (scan,) = [op for op in gradient.operations if op.kind == "scan" and op.attrs["reverse"]]
    return scan


def _rnn(batch: int | None, extra_weight_term: bool, transposed_weight: bool, remat=False):
    """h' = tanh(h W + x U) (batched or not); optionally W also enters elementwise with the
    carry (a per-step term that is not a contraction) or is read transposed (a layout chain
    after the dot)."""

    def loss(b, args):
        w, u, h0, xs = args

        def step(_, a):
            h, x = a
            weight = w.transpose(("o", "h")) if transposed_weight else w
            pre = h.contract(weight, "h") + x.contract(u, "i")
            if extra_weight_term:
                pre = pre + (w * h).sum("h").sin() * 0.1  # a product, but not a dot_general
            new = pre.rename("o", "h").tanh()
            return new, new

        (final,), (hs,) = b.scan(step, carries=[h0], xs=[xs], axis="t", remat=remat)
        return (final * final).sum() + (hs * hs).sum() * 0.5

    batch_axes = {"b": batch} if batch else {}
    types = [
        spec(f32, h=8, o=8),
        spec(f32, i=3, o=8),
        spec(f32, **batch_axes, h=8),
        spec(f32, t=6, **batch_axes, i=3),
    ]
    return accy.trace.define("rnn", types, loss)


CASES = {
    "vector": dict(batch=None, extra_weight_term=False, transposed_weight=False),
    "batched": dict(batch=2, extra_weight_term=False, transposed_weight=False),
    "transposed": dict(batch=None, extra_weight_term=False, transposed_weight=True),
    "mixed": dict(batch=None, extra_weight_term=True, transposed_weight=False),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_weight_gradients_are_contracted_after_the_reverse_scan(case):
    program = _rnn(**CASES[case])
    gradient = accy.grad(program, (0, 1, 2, 3))
    scan = _reverse_scan(gradient)
    carried = [t.axes for t in scan.result_types[: scan.attrs["num_carry"]]]
    # No weight-sized accumulator, except for the elementwise term of the mixed case.
    weight_accumulators = [axes for axes in carried if set(axes) == {"h", "o"}]
    assert len(weight_accumulators) == (1 if case == "mixed" else 0)
    after = gradient.operations[gradient.operations.index(scan) + 1 :]
    weights = [{"h", "o"}, {"i", "o"}]  # W's and U's, over the steps (the inputs' too)
    assert sum(op.kind == "dot_general" and set(op.type.axes) in weights for op in after) == 2
    oracle = accy.grad(unroll.apply(program), (0, 1, 2, 3))
    inputs = _inputs(program)
    for got, want in zip(
        accy.reference.run(gradient, inputs), accy.reference.run(oracle, inputs), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    accy.testing.check_grads(program, inputs, wrt=(0, 1), order=1, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", CASES)
def test_weight_gradients_on_every_backend(executor, case):
    program = _rnn(**CASES[case])
    inputs = _inputs(program, seed=1)
    oracle = accy.reference.run(accy.grad(unroll.apply(program), (0, 1, 2, 3)), inputs)
    got = executor(accy.grad(program, (0, 1, 2, 3)), inputs)
    for g, w in zip(got, oracle, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_under_remat_weight_gradients_accumulate_in_carries(case):
    # remat's memory bar is the carries plus one step's intermediates: no per-step factors are
    # stacked for a GEMM after the loop (they would cost a vector per step and product).
    program = _rnn(**CASES[case], remat=True)
    gradient = accy.grad(program, (0, 1, 2, 3))
    scan = _reverse_scan(gradient)
    carried = [set(t.axes) for t in scan.result_types[: scan.attrs["num_carry"]]]
    assert {"h", "o"} in carried and {"i", "o"} in carried  # W's and U's cotangents
    # Its ys are the cotangents of the inputs alone.
    assert len(scan.result_types) - scan.attrs["num_carry"] == 1
    after = gradient.operations[gradient.operations.index(scan) + 1 :]
    assert not any(op.kind == "dot_general" for op in after)
    oracle = accy.grad(unroll.apply(program), (0, 1, 2, 3))
    inputs = _inputs(program, seed=2)
    for got, want in zip(
        accy.reference.run(gradient, inputs), accy.reference.run(oracle, inputs), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_remat_weight_gradients_on_every_backend(executor):
    program = _rnn(**CASES["batched"], remat=True)
    inputs = _inputs(program, seed=3)
    oracle = accy.reference.run(accy.grad(unroll.apply(program), (0, 1, 2, 3)), inputs)
    got = executor(accy.grad(program, (0, 1, 2, 3)), inputs)
    for g, w in zip(got, oracle, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_contraction_with_an_invariant_operand_still_accumulates():
    # d/dW of sum_t (x_t . W . c) with c a loop-invariant closure: the per-step term contracts
    # a stepwise value with an invariant one; stacking the invariant one would cost T copies.
    def loss(b, args):
        w, c, xs = args

        def step(_, a):
            (total,), (x,) = a[:1], a[1:]
            return total + x.contract(w, "i").contract(c, "o"), x.sum("i")

        (final,), _ = b.scan(step, carries=[b.scalar(f32, 0.0)], xs=[xs], axis="t")
        return final

    program = accy.trace.define(
        "inv", [spec(f32, i=3, o=2), spec(f32, o=2), spec(f32, t=5, i=3)], loss
    )
    gradient = accy.grad(program, (0,))
    inputs = _inputs(program)
    (got,) = accy.reference.run(gradient, inputs)
    w, c, xs = inputs
    np.testing.assert_allclose(got, np.outer(xs.sum(0), c), rtol=1e-5, atol=1e-6)
