"""Long scans on CUDA run as one graph WHILE node whose body is recorded once, with the
iteration counter and the body's pointer table on the device (`steps.scan`); short ones are
unrolled into the graph. The schedule's size does not grow with the length; values (forward,
reverse, odd and even lengths, a scanned axis that is not outermost, gradients) match the
unrolled schedule and NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.backends.cuda import compile_program
from accy.backends.cuda.schedule import Conditional, Gemm, SetCondition
from accy.kernel import toolchain
from accy.trace import define
from bench.scan_rnn import accy_program

from ..executors import cuda_device_or_skip, run_fragment


def _leaky(length: int, reverse: bool = False, time_inner: bool = False):
    """h' = tanh(0.9 h + x w): a carry, a scanned input (time axis outermost or inner), a
    closure, stacked outputs of two kinds (the carry, and h * x)."""

    def program(b, args):
        w, h0, xs = args

        def step(_, a):
            h, x = a
            new = (h * 0.9 + x * w).tanh()
            return [new, new, new * x]

        (final,), (hs, products) = b.scan(step, carries=[h0], xs=[xs], axis="t", reverse=reverse)
        return final, hs, products

    xs = spec(f32, lane=5, t=length) if time_inner else spec(f32, t=length, lane=5)
    return define("leaky", [spec(f32, lane=5), spec(f32, lane=5), xs], program)


def _leaky_numpy(w, h0, xs, reverse: bool, time_inner: bool):
    xs = xs.T if time_inner else xs
    order = range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
    h = h0.astype(np.float32)
    hs, products = np.zeros_like(xs), np.zeros_like(xs)
    for s in order:
        h = np.tanh(h * np.float32(0.9) + xs[s] * w).astype(np.float32)
        hs[s], products[s] = h, h * xs[s]
    return h, hs, products  # stacked along the scanned axis, outermost


def _actions(actions):
    for action in actions:
        yield action
        if isinstance(action, Conditional):
            yield from _actions(action.body)


def test_a_long_scan_is_one_while_node_and_the_schedule_does_not_grow():
    sizes = []
    for length in (20_000, 80_000):
        compiled = compile_program(_leaky(length))
        nodes = [a for a in compiled.schedule.actions if isinstance(a, Conditional)]
        assert [node.kind for node in nodes] == ["while"]
        # Started before the node (negate=False: counter 0), advanced at the end of its body.
        assert [a.negate for a in compiled.schedule.actions if isinstance(a, SetCondition)] == [
            False
        ]
        assert isinstance(nodes[0].body[-1], SetCondition) and nodes[0].body[-1].negate
        sizes.append((len(list(_actions(compiled.schedule.actions))), len(compiled.schedule.pool)))
    assert sizes[0] == sizes[1]


def test_a_node_iteration_runs_several_scan_iterations(configure):
    # The body is recorded cuda_iterations_per_node_iteration times in the node, each copy with a
    # table of its own; 20,000 = 8 x 2,500, 20,001 leaves 7 copies that repeat iteration 0.
    def node_body(length: int, copies: int) -> tuple:
        configure(cuda_iterations_per_node_iteration=copies)
        compiled = compile_program(_leaky(length))
        (node,) = [a for a in compiled.schedule.actions if isinstance(a, Conditional)]
        return node.body, compiled

    once, _ = node_body(20_000, 1)
    for length, pad in ((20_000, 0), (20_001, 7)):
        body, compiled = node_body(length, 8)
        assert len(body) - 1 == 8 * (len(once) - 1)  # 8 copies of the body, then the step
        assert f"(long long)i * 8 + j - {pad};" in compiled.source
        assert f"i < {-(-length // 8)}ull" in compiled.source


def test_a_short_scan_stays_unrolled_with_cublas():
    compiled = compile_program(_rnn_gradient(8))
    assert not any(isinstance(a, Conditional) for a in compiled.schedule.actions)
    assert any(isinstance(a, Gemm) for a in compiled.schedule.actions)


def test_bodies_with_nested_loops_stay_unrolled(configure):
    configure(cuda_unrolled_nodes=0)

    def nested(b, args):
        (xs,) = args

        def outer(_, a):
            (row,) = a
            (total,), _ = b.scan(
                lambda b, c: [c[0] + c[1]], carries=[b.scalar(f32, 0.0)], xs=[row], axis="j"
            )
            return [total]

        _, (sums,) = b.scan(outer, xs=[xs], axis="i")
        return sums

    compiled = compile_program(define("nested", [spec(f32, i=3, j=4)], nested))
    nodes = [a for a in compiled.schedule.actions if isinstance(a, Conditional)]
    # The outer scan is unrolled (3 iterations), each running the inner one as a WHILE node.
    assert len(nodes) == 3 and all(node.kind == "while" for node in nodes)


@pytest.mark.skipif(toolchain.nvcc() is None, reason="cuda gate: nvcc is not on PATH")
def test_the_step_kernel_compiles_with_nvcc():
    compiled = compile_program(_leaky(20_000, reverse=True, time_inner=True), prefix="w0_")
    ptx = toolchain.ptx_with_nvcc(compiled.source, "a WHILE-node scan", arch="compute_90")
    assert ".entry w0_scan_step" in ptx and "cudaGraphSetConditional" in ptx


@pytest.mark.parametrize("length", [7, 8])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("time_inner", [False, True])
@pytest.mark.parametrize("copies", [1, 3, 8])
def test_while_node_scan_values(length, reverse, time_inner, copies, configure):
    # copies: scan iterations per node iteration (3: lengths 7 and 8 leave 2 and 1 copies of
    # the first node iteration that run iteration 0 again; 8: one node iteration, or 7 copies).
    cuda_device_or_skip()
    configure(cuda_unrolled_nodes=0)  # every scan is a WHILE node
    configure(cuda_iterations_per_node_iteration=copies)
    program = _leaky(length, reverse, time_inner)
    compiled = compile_program(program)
    assert any(isinstance(a, Conditional) for a in compiled.schedule.actions)
    rng = np.random.default_rng(length)
    inputs = [rng.standard_normal(t.extents).astype(np.float32) for t in program.parameter_types]
    got = run_fragment(compiled, inputs)
    want = _leaky_numpy(*inputs, reverse=reverse, time_inner=time_inner)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _rnn_gradient(length: int, remat: bool = False):
    return accy.grad(accy_program(length, remat, carry=16, inputs=8), wrt=(0, 1, 2, 3))


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("copies", [1, 8])
def test_while_node_rnn_gradient_matches_the_unrolled_schedule(remat, copies, configure):
    cuda_device_or_skip()
    configure(cuda_iterations_per_node_iteration=copies)
    gradient = _rnn_gradient(33, remat)
    rng = np.random.default_rng(1)
    inputs = [
        (0.3 * rng.standard_normal(t.extents)).astype(np.float32) for t in gradient.parameter_types
    ]
    unrolled = run_fragment(compile_program(gradient), inputs)
    configure(cuda_unrolled_nodes=0)
    looped = compile_program(gradient)
    assert any(isinstance(a, Conditional) for a in looped.schedule.actions)
    got = run_fragment(looped, inputs)
    want = accy.reference.run(gradient, inputs)
    for g, u, w in zip(got, unrolled, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(u, w, rtol=1e-4, atol=1e-5)


def test_a_scan_of_20000_steps_on_cuda_matches_the_cpu():
    # Long enough to be a WHILE node with the default threshold.
    cuda_device_or_skip()
    program = _leaky(20_000)
    rng = np.random.default_rng(3)
    inputs = [
        (0.5 * rng.standard_normal(t.extents)).astype(np.float32) for t in program.parameter_types
    ]
    assert any(isinstance(a, Conditional) for a in compile_program(program).schedule.actions)
    got = [np.asarray(x.get()) for x in accy.compile(program, device="cuda")(*inputs)]
    want = _leaky_numpy(*inputs, reverse=False, time_inner=False)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _long_contraction(dtype):
    """Two contracted axes (5 x 61 = 305: not a multiple of the warp) into a small result."""
    return define(
        "long",
        [spec(dtype, r=3, a=5, b=61), spec(dtype, a=5, b=61, c=4)],
        lambda b, x: x[0].contract(x[1], ("a", "b")),
    )


def test_long_contractions_into_small_results_are_a_warp_per_element():
    compiled = compile_program(_long_contraction(accy.i32))
    assert any("a warp per result" in c for c in compiled.kernel_comments.values())


@pytest.mark.parametrize("dtype", [accy.i32, f32])
def test_warp_per_element_contraction_values(dtype):
    cuda_device_or_skip()
    program = _long_contraction(dtype)
    rng = np.random.default_rng(7)
    x = rng.integers(-9, 10, size=(3, 5, 61))
    y = rng.integers(-9, 10, size=(5, 61, 4))
    inputs = [x.astype(dtype.numpy), y.astype(dtype.numpy)]
    if dtype == f32:  # not integers: rounding differs from NumPy's order of additions
        inputs = [a * np.float32(0.37) for a in inputs]
    (got,) = [np.asarray(v.get()) for v in accy.compile(program, device="cuda")(*inputs)]
    want = np.einsum("rab,abc->rc", *[a.astype(np.float64) for a in inputs])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
