"""Scans differentiated as scans: forward mode is one scan, reverse mode a primal scan with
stacked residuals and a transposed scan running the other way. Every gradient is compared with
the gradient of the unrolled program (`accy.transforms.unroll`, the oracle), with finite
differences (`accy.testing.check_grads`, which also checks second order), on the reference
evaluator and the native CPU backend."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, i32, spec
from accy.transforms import unroll


def _inputs(program, seed=0):
    rng = np.random.default_rng(seed)
    arrays = []
    for t in program.parameter_types:
        if t.dtype.is_float:
            arrays.append((0.5 * rng.standard_normal(t.extents)).astype(t.dtype.numpy))
        else:
            arrays.append(rng.integers(0, 3, t.extents).astype(t.dtype.numpy))
    return arrays


def _scans(program) -> int:
    return sum(op.kind == "scan" for op in program.operations)


def _check(program, wrt, *, order=2, cpu=False, atol=1e-4):
    """The scan gradient equals the unrolled one, matches finite differences, is not unrolled,
    and (with `cpu`) runs natively with the same result."""
    inputs = _inputs(program)
    gradient = accy.value_and_grad(program, wrt)
    assert _scans(gradient) >= 1, "the gradient was unrolled"
    oracle = accy.value_and_grad(unroll.apply(program), wrt)
    assert not oracle.contains_scan()
    got = accy.reference.run(gradient, inputs)
    want = accy.reference.run(oracle, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    accy.testing.check_grads(program, inputs, wrt=wrt, order=order, atol=atol, rtol=atol)
    if cpu:
        try:
            accy.backends.cpu.find_compiler()
        except accy.RuntimeUnavailable:
            pytest.skip("native CPU backend: no C compiler")
        native = accy.compile(gradient, device="cpu")(*inputs)
        for g, w in zip(native, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    return gradient


def _rnn(length=5, reverse=False, remat=False, layout_time_first=True):
    """A tanh RNN: the weight is a const, the input projection a closure."""

    def loss(b, args):
        w, u, h0, xs = args

        def step(_, a):
            weight, h, x = a
            new = (h.contract(weight, "h").rename("o", "h") + x.contract(u, "i")).tanh()
            return new, (new * x.sum("i")).sum("h")

        (final,), (ys,) = b.scan(
            step, consts=[w], carries=[h0], xs=[xs], axis="t", reverse=reverse, remat=remat
        )
        return (final * final).sum("h") + (ys * ys).sum("t")

    xs = spec(f32, t=length, i=2) if layout_time_first else spec(f32, i=2, t=length)
    types = [spec(f32, h=3, o=3), spec(f32, i=2, h=3), spec(f32, h=3), xs]
    return accy.trace.define("rnn", types, loss)


@pytest.mark.slow
def test_rnn_gradient_is_a_reverse_scan_and_matches_the_unrolled_one():
    gradient = _check(_rnn(), wrt=(0, 1, 2, 3), cpu=True)
    reverse = [op for op in gradient.operations if op.kind == "scan" and op.attrs["reverse"]]
    assert len(reverse) == 1


@pytest.mark.slow
def test_gradient_of_a_reverse_scan():
    _check(_rnn(reverse=True), wrt=(0, 1, 2, 3), cpu=True)


@pytest.mark.slow
def test_scanned_axis_need_not_be_outermost():
    _check(_rnn(layout_time_first=False), wrt=(0, 1, 2, 3), cpu=True)


@pytest.mark.slow
def test_remat_stores_only_the_carries():
    plain = accy.grad(_rnn(), (0, 1, 2, 3))
    remat = _check(_rnn(remat=True), wrt=(0, 1, 2, 3), cpu=True)

    def stacked_residuals(gradient):
        forward = [op for op in gradient.operations if op.kind == "scan"][0]
        body = forward.attrs["body"]
        return len(body.outputs) - forward.attrs["num_carry"]

    # The forward scan of the remat gradient stacks the carry (and the loss's y); the plain
    # one stacks the body's intermediates too.
    assert stacked_residuals(remat) < stacked_residuals(plain)
    forward = [op for op in remat.operations if op.kind == "scan"][0]
    carry_type = spec(f32, h=3)
    stacked = forward.attrs["body"].output_types[forward.attrs["num_carry"] :]
    assert carry_type in stacked


def test_closure_cotangents_are_summed_over_steps():
    def loss(b, args):
        scale, h0, xs = args
        (final,), _ = b.scan(
            lambda _, a: ((a[0] * scale + a[1]).sin(),), carries=[h0], xs=[xs], axis="t"
        )
        return final.sum("h")

    program = accy.trace.define(
        "closure", [spec(f32, h=2), spec(f32, h=2), spec(f32, t=4, h=2)], loss
    )
    assert program.operations[3].attrs["num_consts"] == 1
    _check(program, wrt=(0, 1, 2), cpu=True)


@pytest.mark.slow
def test_nested_scans_with_a_closure_from_the_outermost_program():
    def loss(b, args):
        w, h0, xs = args

        def outer(_, a):
            h, row = a

            def inner(_, c):
                return ((c[0] * w + c[1]).tanh(),)

            (h,), _ = b.scan(inner, carries=[h], xs=[row], axis="j")
            return h, (h * h).sum("h")

        (final,), (ys,) = b.scan(outer, carries=[h0], xs=[xs], axis="i")
        return final.sum("h") + ys.sum("i")

    types = [spec(f32, h=2), spec(f32, h=2), spec(f32, i=3, j=2, h=2)]
    program = accy.trace.define("nested", types, loss)
    _check(program, wrt=(0, 1, 2), cpu=True)


def test_integer_carries_and_xs_are_not_differentiated():
    def loss(b, args):
        h0, xs, ids = args

        def step(_, a):
            h, count, x, i = a
            shifted = h * (i.convert(f32) + 1.0) + x
            return shifted.tanh(), count + 1, shifted

        (final, count), (ys,) = b.scan(step, carries=[h0, b.scalar(i32, 0)], xs=[xs, ids], axis="t")
        return final.sum("h") * count.convert(f32) + ys.sum(("t", "h"))

    types = [spec(f32, h=2), spec(f32, t=3, h=2), spec(i32, t=3)]
    program = accy.trace.define("ints", types, loss)
    _check(program, wrt=(0, 1), cpu=True)


def test_unused_results_and_zero_tangent_carries():
    def loss(b, args):
        h0, xs = args

        def step(_, a):
            h, other, x = a
            return h * x, other + 1.0, x * 2.0

        (final, _), _ = b.scan(step, carries=[h0, b.full(spec(f32, h=2), 0.0)], xs=[xs], axis="t")
        return final.sum("h")

    program = accy.trace.define("unused", [spec(f32, h=2), spec(f32, t=3, h=2)], loss)
    _check(program, wrt=(0, 1), cpu=True)


def test_forward_mode_is_one_scan():
    program = _rnn()
    forward = accy.jvp(program, (0, 1, 2, 3))
    assert _scans(forward) == 1
    inputs = _inputs(program)
    tangents = [np.ones_like(x) for x in inputs]
    oracle = accy.jvp(unroll.apply(program), (0, 1, 2, 3))
    got = accy.reference.run(forward, inputs + tangents)
    want = accy.reference.run(oracle, inputs + tangents)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_gradient_size_does_not_grow_with_length():
    short = accy.grad(_rnn(length=4), (0, 1, 2, 3))
    long = accy.grad(_rnn(length=4096), (0, 1, 2, 3))
    assert len(short.operations) == len(long.operations)


def test_vjp_and_linear_transpose_of_scans():
    program = _rnn()
    vjp = accy.vjp(program, (0, 3))
    assert _scans(vjp) >= 1

    def linear(b, args):
        (h0, xs) = args
        (final,), (ys,) = b.scan(
            lambda _, a: (a[0] * 0.5 + a[1], a[0] * 3.0), carries=[h0], xs=[xs], axis="t"
        )
        return final, ys

    program = accy.trace.define("linear", [spec(f32, h=2), spec(f32, t=3, h=2)], linear)
    transposed = accy.linear_transpose(program)
    oracle = accy.linear_transpose(unroll.apply(program))
    cts = [np.arange(2, dtype=np.float32), np.ones((3, 2), np.float32)]
    for g, w in zip(
        accy.reference.run(transposed, cts), accy.reference.run(oracle, cts), strict=True
    ):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_checkpoint_recomputes_its_region_in_the_backward_pass():
    layer = accy.checkpoint(lambda b, a: ((a[0] * a[1]).tanh() * a[1]).sin())

    def loss(b, args):
        x, w = args
        return (layer(b, [x, w]) * x).sum("lane")

    program = accy.trace.define("checkpointed", [spec(f32, lane=3)] * 2, loss)
    plain = accy.trace.define(
        "plain",
        [spec(f32, lane=3)] * 2,
        lambda b, a: (((a[0] * a[1]).tanh() * a[1]).sin() * a[0]).sum("lane"),
    )
    inputs = _inputs(program)
    gradient = _check(program, wrt=(0, 1), cpu=True)
    for g, w in zip(
        accy.reference.run(gradient, inputs),
        accy.reference.run(accy.value_and_grad(plain, (0, 1)), inputs),
        strict=True,
    ):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # Nothing is stacked: the backward scan's body computes the tanh again.
    backward = [op for op in gradient.operations if op.kind == "scan" and op.attrs["reverse"]]
    assert backward and backward[0].attrs["body"].count("unary") >= 2


@pytest.mark.slow
def test_checkpoint_inside_a_scan_body_and_with_several_results():
    def loss(b, args):
        h0, xs = args

        def step(b, a):
            h, x = a
            new, extra = b.checkpoint(lambda b, v: ((v[0] * v[1]).tanh(), v[0] * 2.0), [h, x])
            return new + extra * 0.1, new.sum("h")

        (final,), (ys,) = b.scan(step, carries=[h0], xs=[xs], axis="t", remat=True)
        return final.sum("h") + ys.sum("t")

    program = accy.trace.define("scan_checkpoint", [spec(f32, h=2), spec(f32, t=3, h=2)], loss)
    _check(program, wrt=(0, 1), cpu=True)
