"""Scans run in blocks of steps on the CPU (`accy.backends.cpu.blocking`): a carry that sums
per-step outer products (a remat RNN's weight gradient) is summed by one GEMM a block. The
values are checked against the unrolled gradient (the oracle, on the reference evaluator) and
central finite differences of the compiled forward program; the plan's memory does not grow
with the length beyond the stacked carries."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, f64, spec
from accy.backends.cpu import blocking
from accy.backends.cpu.blocking import block_scans, block_size
from accy.lower.plan import build_plan
from accy.transforms import unroll
from bench.scan_rnn import accy_program


@pytest.fixture(autouse=True)
def _compiler():
    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")


@pytest.fixture
def blocks_of_8(monkeypatch):
    """Blocks of 8 steps, so that short scans have several blocks."""
    monkeypatch.setattr(blocking, "BLOCK_STEPS", 8)


def _inputs(program, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (0.5 * rng.standard_normal(t.extents)).astype(t.dtype.numpy)
        for t in program.parameter_types
    ]


def _rnn(length, remat, *, reverse=False, batch=None, time_last=False, mixed=False, dtype=f32):
    """h' = tanh(h W + x U) over `length` steps; the loss reads every step's carry. Variants:
    batched carries, xs laid out (i, t), and W also entering elementwise (a per-step weight
    cotangent that is not an outer product, which stays in the carry)."""

    def loss(b, args):
        w, u, h0, xs = args

        def step(_, a):
            h, x = a
            pre = h.contract(w, "h") + x.contract(u, "i")
            if mixed:
                pre = pre + (w * h).sum("h").sin() * 0.1
            new = pre.rename("o", "h").tanh()
            return new, new

        (final,), (hs,) = b.scan(
            step, carries=[h0], xs=[xs], axis="t", remat=remat, reverse=reverse
        )
        return (final * final).sum() + (hs * hs).sum() * 0.5

    batch_axes = {"b": batch} if batch else {}
    xs = spec(dtype, i=3, t=length) if time_last else spec(dtype, t=length, **batch_axes, i=3)
    if time_last and batch:
        xs = spec(dtype, i=3, t=length, **batch_axes)
    types = [spec(dtype, h=5, o=5), spec(dtype, i=3, o=5), spec(dtype, **batch_axes, h=5), xs]
    return accy.trace.define("rnn", types, loss)


def _scans(program):
    return [op for op in program.operations if op.kind == "scan"]


CASES = {
    "remat": dict(remat=True),
    "plain": dict(remat=False),
    "remat reverse": dict(remat=True, reverse=True),
    "remat batched": dict(remat=True, batch=2),
    "remat time last": dict(remat=True, time_last=True),
    "remat mixed": dict(remat=True, mixed=True),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.slow
def test_blocked_gradients_match_the_unrolled_gradient(case, blocks_of_8):
    program = _rnn(24, **CASES[case])
    wrt = (0, 1, 2, 3)
    gradient = accy.grad(program, wrt)
    inputs = _inputs(program, seed=1)
    oracle = accy.reference.run(accy.grad(unroll.apply(program), wrt), inputs)
    blocked = block_scans(gradient)
    for got in (accy.reference.run(blocked, inputs), accy.compile(gradient, "cpu")(*inputs)):
        for g, w in zip(got, oracle, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_the_remat_weight_gradient_is_one_gemm_a_block(blocks_of_8):
    gradient = accy.grad(_rnn(24, remat=True), (0, 1, 2, 3))
    backward = _scans(gradient)[-1]
    carried = [set(t.axes) for t in backward.result_types[: backward.attrs["num_carry"]]]
    assert {"h", "o"} in carried  # remat: W's gradient is a carry of the reverse scan
    outer = _scans(block_scans(gradient))[-1]
    assert (outer.attrs["length"], outer.attrs["reverse"]) == (3, True)
    body = outer.attrs["body"]
    (inner,) = _scans(body)
    assert inner.attrs["length"] == 8
    # The inner loop carries only the carry's cotangent: no weight-sized accumulator, and
    # the recomputation (h W + x U over the block's stacked carries) runs before it.
    inner_carries = inner.result_types[: inner.attrs["num_carry"]]
    assert [set(t.axes) for t in inner_carries] == [{"h"}]
    assert sum(op.kind == "dot_general" for op in inner.attrs["body"].operations) == 1
    after = body.operations[body.operations.index(inner) + 1 :]
    weights = [{"h", "o"}, {"i", "o"}]
    assert sum(op.kind == "dot_general" and set(op.type.axes) in weights for op in after) == 2


def test_a_users_scan_that_sums_outer_products(blocks_of_8):
    # Not a gradient: a forward scan whose carry adds x_t ⊗ h_t at each step.
    def accumulate(b, args):
        w, h0, acc0, xs = args

        def step(_, a):
            h, acc, x = a
            new = (h.contract(w, "h").rename("o", "h") + x.sum("i")).tanh()
            return new, acc + x * new, new

        (h, acc), (hs,) = b.scan(step, carries=[h0, acc0], xs=[xs], axis="t")
        return h, acc, hs

    types = [spec(f32, h=4, o=4), spec(f32, h=4), spec(f32, i=3, h=4), spec(f32, i=3, t=40)]
    program = accy.trace.define("outer", types, accumulate)
    (outer,) = _scans(block_scans(program))
    assert outer.attrs["length"] == 5
    inputs = _inputs(program, seed=2)
    want = accy.reference.run(program, inputs)
    for got in (accy.reference.run(block_scans(program), inputs), accy.compile(program)(*inputs)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_remat_gradient_against_finite_differences(blocks_of_8):
    program = _rnn(32, remat=True, dtype=f64)
    wrt = (0, 1, 2, 3)
    inputs = _inputs(program, seed=3)
    forward = accy.compile(program, "cpu")
    gradient = accy.compile(accy.grad(program, wrt), "cpu")(*inputs)
    rng = np.random.default_rng(4)
    directions = [rng.standard_normal(x.shape) for x in inputs]
    eps = 1e-6
    plus = forward(*[x + eps * d for x, d in zip(inputs, directions, strict=True)])[0]
    minus = forward(*[x - eps * d for x, d in zip(inputs, directions, strict=True)])[0]
    numeric = (float(plus) - float(minus)) / (2 * eps)
    analytic = sum(float(np.sum(g * d)) for g, d in zip(gradient, directions, strict=True))
    assert analytic == pytest.approx(numeric, rel=1e-6)


def test_memory_grows_with_the_length_only_by_the_carries():
    # Blocks of 64 steps: the plan's workspace grows with the length as the unblocked one does
    # (the stacked carries), plus a block's factors; no output-sized copy of the blocked ys.
    # (The benchmark's RNN: with a loss that reads every step's carry elementwise, the plan
    # does not yet write that product over the carries through the blocks' reshape, which
    # costs one more carries-sized buffer.)
    def workspace(length, blocked):
        gradient = accy.grad(accy_program(length, True, carry=5, inputs=3), (0, 1, 2, 3))
        program = block_scans(gradient, outputs_as_blocks=True) if blocked else gradient
        plan = build_plan(program)
        assert not any(step.kind == "loop" and step.op.kind == "reshape" for step in plan.steps)
        return plan.workspace_bytes

    grown = workspace(1024, True) - workspace(256, True)
    assert grown == workspace(1024, False) - workspace(256, False)
    block = 64 * 5 * 4  # a block of one stacked vector of 5 floats
    assert workspace(1024, True) <= workspace(1024, False) + 16 * block


@pytest.mark.parametrize("length", [7, 67])
def test_lengths_without_a_block_size_run_as_they_are(length):
    assert block_size(length) is None
    gradient = accy.grad(_rnn(length, remat=True), (0, 1, 2, 3))
    assert block_scans(gradient) is gradient


def test_block_sizes():
    assert [block_size(n) for n in (8, 64, 96, 1024, 16384, 200, 9)] == [8, 64, 48, 64, 64, 50, 9]


def test_the_plain_gradient_runs_as_it_is():
    # Without remat the weight gradients are already one GEMM after the loop and x_t U one
    # before it: nothing for blocks to do.
    gradient = accy.grad(accy_program(1024, False, carry=5, inputs=3), (0, 1, 2, 3))
    assert block_scans(gradient) is gradient


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.slow
def test_nested_scans_in_blocks(remat, blocks_of_8):
    # A remat scan over t whose body scans j: the blocked scans' bodies hold scans themselves.
    def loss(b, args):
        w, u, h0, xs = args

        def outer(_, a):
            h, x = a

            def inner(_, c):
                new = (c[0].contract(w, "h") + c[1].contract(u, "i")).rename("o", "h").tanh()
                return (new,)

            (h,), _ = b.scan(inner, carries=[h], xs=[x], axis="j")
            return h, (h * h).sum("h")

        (final,), (ys,) = b.scan(outer, carries=[h0], xs=[xs], axis="t", remat=remat)
        return final.sum("h") + ys.sum("t")

    types = [spec(f32, h=4, o=4), spec(f32, i=3, o=4), spec(f32, h=4), spec(f32, t=16, j=2, i=3)]
    program = accy.trace.define("nested", types, loss)
    wrt = (0, 1, 2, 3)
    gradient = accy.grad(program, wrt)
    inputs = _inputs(program, seed=5)
    oracle = accy.reference.run(accy.grad(unroll.apply(program), wrt), inputs)
    for got in (accy.reference.run(block_scans(gradient), inputs), accy.compile(gradient)(*inputs)):
        for g, w in zip(got, oracle, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
