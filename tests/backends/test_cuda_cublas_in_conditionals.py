"""cuBLAS GEMMs inside CUDA graph conditional nodes (`steps.dot.CUBLAS_IN_CONDITIONALS`): in a
cond's branches and a while_loop's body they read pool tables as elsewhere; in a scan run as a
WHILE node their pointer arrays are entries of the scan's region, which the step kernel
rewrites every iteration (`StepContext.region`). With the flag off, contractions there are
accy's kernels. Values against NumPy and the unrolled schedule, both ways."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, i32, spec
from accy.backends.cuda import compile_program
from accy.backends.cuda.schedule import Conditional, Gemm, SetCondition
from accy.trace import define

from ..executors import cuda_device_or_skip, run_fragment

ROWS, WIDTH = 24, 32  # GEMMs of at least CONDITIONAL_GEMM_MIN rows and columns


def _gemms(actions, inside: bool = False):
    """(GEMM, whether it is inside a conditional node's body) for every GEMM of `actions`."""
    for action in actions:
        if isinstance(action, Conditional):
            yield from _gemms(action.body, True)
        elif isinstance(action, Gemm):
            yield action, inside


def _matrix_scan(length: int, reverse: bool = False):
    """H' = tanh(H W + X_t); the stacked output is H W itself (a GEMM writing a slice of a
    stacked output, whose address moves with the iteration)."""

    def program(b, args):
        w, h0, xs = args

        def step(_, a):
            h, x = a
            product = h.contract(w, "h").rename("o", "h")
            return [(product + x).tanh(), product]

        (final,), (products,) = b.scan(step, carries=[h0], xs=[xs], axis="t", reverse=reverse)
        return final, products

    types = [spec(f32, h=WIDTH, o=WIDTH), spec(f32, r=ROWS, h=WIDTH)]
    types.append(spec(f32, t=length, r=ROWS, h=WIDTH))
    return define("matrix_scan", types, program)


def _matrix_scan_numpy(w, h0, xs, reverse: bool):
    h = h0.astype(np.float64)
    products = np.zeros(xs.shape)
    for s in range(len(xs) - 1, -1, -1) if reverse else range(len(xs)):
        products[s] = h @ w
        h = np.tanh(products[s] + xs[s])
    return h, products


def _matrix_while(steps: int):
    def program(b, args):
        w, h0, xs = args

        def body(b, c):
            h, step = c
            x = xs.dynamic_slice({"t": step}, {"t": 1}).sum("t")
            return [(h.contract(w, "h").rename("o", "h") + x).tanh(), step + 1]

        final, _ = b.while_loop(lambda b, c: c[1] < steps, body, [h0, b.scalar(i32, 0)])
        return final

    types = [spec(f32, h=WIDTH, o=WIDTH), spec(f32, r=ROWS, h=WIDTH)]
    types.append(spec(f32, t=steps, r=ROWS, h=WIDTH))
    return define("matrix_while", types, program)


def _matrix_cond():
    def program(b, args):
        p, x, w = args
        return b.cond(
            p,
            lambda b, v: v[0].contract(v[1], "k"),
            lambda b, v: v[0].contract(v[1], "k").tanh(),
            [x, w],
        )

    types = [spec(accy.bool_), spec(f32, m=ROWS, k=WIDTH), spec(f32, k=WIDTH, n=WIDTH)]
    return define("matrix_cond", types, program)


@pytest.fixture(params=[True, False], ids=["cublas", "kernels"])
def cublas_inside(request, configure):
    """Both paths: cuBLAS inside conditional bodies (the default) and accy's kernels there."""
    configure(cuda_cublas_in_conditionals=request.param)
    return request.param


def test_gemms_inside_while_nodes_follow_the_flag(cublas_inside, configure):
    configure(cuda_unrolled_nodes=0)
    for program in (_matrix_scan(5), _matrix_while(5)):
        inside = [g for g, within in _gemms(compile_program(program).schedule.actions) if within]
        assert bool(inside) == cublas_inside, program.name


def test_gemms_inside_if_nodes_stay_kernels(cublas_inside):
    # On the H200 cuBLAS GEMMs of 256 x 256 x 256 in a cond's branches made the
    # graph fail to instantiate (cudaErrorInvalidValue); the same GEMMs in WHILE bodies ran.
    inside = [g for g, within in _gemms(compile_program(_matrix_cond()).schedule.actions) if within]
    assert inside == []


def test_a_while_node_scan_gemm_reads_pointer_arrays_in_the_region(configure):
    configure(cuda_unrolled_nodes=0)
    compiled = compile_program(_matrix_scan(6))
    (node,) = [a for a in compiled.schedule.actions if isinstance(a, Conditional)]
    (start,) = [a for a in compiled.schedule.actions if isinstance(a, SetCondition)]
    gemms = [a for a in node.body if isinstance(a, Gemm)]
    # The body is recorded once per scan iteration a node iteration runs (6 < 8 here), each
    # copy with its own table. The region is [a table per copy | even bases | odd bases |
    # counter]; each GEMM's three pointer arrays are among its copy's entries, which the step
    # kernel rewrites.
    copies = min(accy.config.cuda_iterations_per_node_iteration, 6)
    assert len(gemms) == copies
    count = (len(compiled.schedule.pool) - start.io - 1) // (copies + 2)
    for copy, gemm in enumerate(gemms):
        table = start.io + copy * count
        assert table <= gemm.arrays and gemm.arrays + 3 <= table + count
    # The product is written straight into the stacked output's slice: a moving entry.
    assert "* (long long)s);" in compiled.source


def test_cublas_dot_products_inside_a_branch_stay_kernels():
    # A 1 x 1 x 3 cuBLAS dot product in an IF node failed to instantiate on the H200.
    program = define(
        "dot_in_cond",
        [spec(accy.bool_), spec(f32, k=3), spec(f32, k=3)],
        lambda b, a: b.cond(
            a[0], lambda b, v: v[0].contract(v[1], "k"), lambda b, v: v[0].sum("k"), [a[1], a[2]]
        ),
    )
    assert not list(_gemms(compile_program(program).schedule.actions))


def _inputs(program, seed: int, scale: float = 0.3):
    rng = np.random.default_rng(seed)
    return [
        (scale * rng.standard_normal(t.extents)).astype(np.float32) for t in program.parameter_types
    ]


@pytest.mark.parametrize("length", [5, 6])
@pytest.mark.parametrize("reverse", [False, True])
def test_while_node_scan_with_gemms_values(cublas_inside, length, reverse, configure):
    cuda_device_or_skip()
    program = _matrix_scan(length, reverse)
    inputs = _inputs(program, length)
    unrolled = run_fragment(compile_program(program), inputs)
    configure(cuda_unrolled_nodes=0)
    compiled = compile_program(program)
    assert any(isinstance(a, Conditional) for a in compiled.schedule.actions)
    got = run_fragment(compiled, inputs)
    want = _matrix_scan_numpy(*inputs, reverse=reverse)
    for g, u, w in zip(got, unrolled, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(g, u, rtol=1e-5, atol=1e-6)


def test_while_loop_with_gemms_values(cublas_inside):
    cuda_device_or_skip()
    program = _matrix_while(7)
    inputs = _inputs(program, 2)
    (got,) = run_fragment(compile_program(program), inputs)
    want, _ = _matrix_scan_numpy(*inputs, reverse=False)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("predicate", [True, False])
def test_cond_with_gemms_values(cublas_inside, predicate):
    cuda_device_or_skip()
    program = _matrix_cond()
    _, x, w = _inputs(program, 3)
    (got,) = run_fragment(compile_program(program), [np.array(predicate), x, w])
    want = x.astype(np.float64) @ w
    np.testing.assert_allclose(got, want if predicate else np.tanh(want), rtol=1e-4, atol=1e-5)


def _matrix_rnn_gradient():
    def loss(b, args):
        w, h0, xs = args
        (final,), (products,) = b.scan(
            lambda _, a: [
                (a[0].contract(w, "h").rename("o", "h") + a[1]).tanh(),
                a[0].contract(w, "h").rename("o", "h"),
            ],
            carries=[h0],
            xs=[xs],
            axis="t",
        )
        return final.sum(("r", "h")) + (products * products).sum(("t", "r", "h"))

    types = [spec(f32, h=WIDTH, o=WIDTH), spec(f32, r=ROWS, h=WIDTH)]
    types.append(spec(f32, t=9, r=ROWS, h=WIDTH))
    return accy.grad(define("matrix_rnn", types, loss), wrt=(0, 1, 2))


def test_while_node_matrix_rnn_gradient_is_scheduled_without_a_gpu(cublas_inside, configure):
    # A WHILE node's body has no table known on the host: its GEMMs' operands and results
    # that are the body's inputs and outputs go through scratch without looking them up.
    configure(cuda_unrolled_nodes=0)
    compiled = compile_program(_matrix_rnn_gradient())
    assert any(isinstance(a, Conditional) for a in compiled.schedule.actions)


def test_while_node_matrix_rnn_gradient_matches_the_reference(cublas_inside, configure):
    # The reverse scan's GEMMs (the carry's cotangent through W, the weight gradient summed in a
    # carry) in a WHILE node, against the reference evaluator.
    cuda_device_or_skip()
    gradient = _matrix_rnn_gradient()
    configure(cuda_unrolled_nodes=0)
    compiled = compile_program(gradient)
    assert any(isinstance(a, Conditional) for a in compiled.schedule.actions)
    inputs = _inputs(gradient, 4, scale=0.2)
    got = run_fragment(compiled, inputs)
    want = accy.reference.run(gradient, inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
