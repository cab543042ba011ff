"""What a scan's gradient keeps in memory: `simplify` drops the stacked outputs nobody reads
and reads a splat x (a gradient's seed of 1.0 at every step) as a scalar in the body, and under
`remat=True` weight cotangents accumulate in carries, so that the gradient holds the carries
(one per step), its inputs and outputs, and one step's intermediates; nothing else grows with
the length."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.transforms import unroll
from bench.scan_rnn import accy_program

from ..executors import EXECUTORS


def _rnn(length: int, remat: bool):
    return accy_program(length, remat, carry=6, inputs=4)


def _inputs(program, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (0.5 * rng.standard_normal(t.extents)).astype(np.float32) for t in program.parameter_types
    ]


def _stacked(t) -> bool:
    return "t" in t.axes


@pytest.mark.parametrize("remat", [False, True])
def test_what_grows_with_the_length(remat):
    gradient = accy.grad(_rnn(9, remat), (0, 1, 2, 3))
    stacked = [
        (op.kind, str(t)) for op in gradient.operations for t in op.result_types if _stacked(t)
    ]
    # No stacked seed of ones, no stacked primal ys the gradient ignores (hs).
    assert ("constant", "f32[t=9, h=6]") not in stacked
    forward, backward = [op for op in gradient.operations if op.kind == "scan"]
    # Residuals: the carries under remat; else the carries and tanh's derivative.
    assert sum(_stacked(t) for t in forward.result_types) == (1 if remat else 2)
    # Under remat, no per-step factors either: the reverse scan's only stacked result is the
    # inputs' cotangent, and W's and U's cotangents are carries.
    if remat:
        assert sum(_stacked(t) for t in backward.result_types) == 1
        carried = [set(t.axes) for t in backward.result_types[: backward.attrs["num_carry"]]]
        assert {"h", "o"} in carried and {"i", "o"} in carried


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("remat", [False, True])
def test_values_against_the_unrolled_gradient(executor, remat):
    program = _rnn(7, remat)
    inputs = _inputs(program, seed=4)
    oracle = accy.reference.run(accy.grad(unroll.apply(program), (0, 1, 2, 3)), inputs)
    got = executor(accy.grad(program, (0, 1, 2, 3)), inputs)
    for g, w in zip(got, oracle, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _two_xs(b, args):
    h0, xs = args
    ones = b.full(xs.ty, 2.0)
    (final,), (ys, unused) = b.scan(
        lambda b, a: [a[0] * a[2] + a[1], a[0], a[1] * 3.0],
        carries=[h0],
        xs=[xs, ones],
        axis="t",
    )
    return final, ys


def test_simplify_reads_a_splat_x_in_the_body_and_drops_unread_ys():
    program = accy.trace.define("two", [spec(f32, lane=3), spec(f32, t=5, lane=3)], _two_xs)
    simpler = accy.simplify(program)
    (scan,) = [op for op in simpler.operations if op.kind == "scan"]
    assert len(scan.operands) == 2  # h0 and xs: the splat x is a constant inside the body
    assert len(scan.results) == 2  # final and ys: `unused` is gone
    assert not any(op.kind == "constant" and _stacked(op.type) for op in simpler.operations)
    inputs = _inputs(program, seed=5)
    for got, want in zip(
        accy.reference.run(simpler, inputs), accy.reference.run(program, inputs), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_scan_over_splats_alone_keeps_one_x_for_its_length():
    def only_splats(b, args):
        (h0,) = args
        (final,), _ = b.scan(
            lambda b, a: [a[0] + a[1]],
            carries=[h0],
            xs=[b.full(spec(f32, t=4, lane=2), 1.5)],
            axis="t",
        )
        return final

    program = accy.trace.define("splats", [spec(f32, lane=2)], only_splats)
    simpler = accy.simplify(program)
    (got,) = accy.reference.run(simpler, [np.zeros(2, np.float32)])
    np.testing.assert_allclose(got, np.full(2, 6.0, np.float32))


def _dots(program) -> int:
    return sum(op.kind == "dot_general" for op in program.operations)


@pytest.mark.parametrize("remat", [False, True])
def test_contractions_of_the_xs_with_consts_run_before_the_loop(remat):
    # x_t U reads no carry: one contraction over every step before the forward scan instead
    # of one per step inside it (not under remat, whose forward scan stacks only carries).
    gradient = accy.grad(_rnn(9, remat), (0, 1, 2, 3))
    forward = next(op for op in gradient.operations if op.kind == "scan")
    before = gradient.operations[: gradient.operations.index(forward)]
    assert _dots(forward.attrs["body"]) == (2 if remat else 1)
    stepped = [op for op in before if op.kind == "dot_general" and "t" in op.type.axes]
    assert len(stepped) == (0 if remat else 1)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_hoisted_contractions_with_the_scanned_axis_inside(executor):
    # xs laid out (i, t): the hoisted contraction reads them with the scanned axis moved first;
    # a second x is read both by the hoisted work and in the loop.
    def loss(b, args):
        u, h0, xs, gates = args

        def step(_, a):
            h, x, gate = a
            new = ((x.contract(u, "i") * gate).rename("o", "h") + h * 0.5).tanh()
            return new, new * gate.rename("o", "h")

        (final,), (hs,) = b.scan(step, carries=[h0], xs=[xs, gates], axis="t")
        return (final * final).sum() + (hs * hs).sum()

    types = [spec(f32, i=4, o=3), spec(f32, h=3), spec(f32, i=4, t=6), spec(f32, o=3, t=6)]
    program = accy.trace.define("inner", types, loss)
    gradient = accy.grad(program, (0, 1, 2, 3))
    forward = next(op for op in gradient.operations if op.kind == "scan")
    assert _dots(forward.attrs["body"]) == 0
    inputs = _inputs(program, seed=6)
    oracle = accy.reference.run(accy.grad(unroll.apply(program), (0, 1, 2, 3)), inputs)
    for got, want in zip(executor(gradient, inputs), oracle, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_input_cotangents_are_one_contraction_after_the_reverse_scan():
    # g_t U^T reads only g_t (stacked for the weight gradient anyway) and a const: one
    # contraction over every step after the loop instead of one per step inside it.
    gradient = accy.grad(_rnn(9, False), (0, 1, 2, 3))
    backward = [op for op in gradient.operations if op.kind == "scan"][-1]
    assert _dots(backward.attrs["body"]) == 1  # the carry's cotangent, g_t W^T
    after = gradient.operations[gradient.operations.index(backward) + 1 :]
    stepped = [op for op in after if op.kind == "dot_general" and "t" in op.type.axes]
    assert len(stepped) == 1
