"""cond and while_loop on every backend (reference, native CPU, CUDA), against NumPy: the
native backends run only the branch a cond takes (a C `if`; CUDA graph IF nodes) and a
while_loop as a loop in the generated code (a C loop; a CUDA graph WHILE node)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import accy
from accy import f32, i32, spec
from accy.backends.cpu.source import translation_unit
from accy.backends.cuda import compile_program
from accy.backends.cuda.schedule import Conditional, Gemm, SetCondition
from accy.kernel import toolchain
from accy.trace import define

from ..executors import EXECUTORS, cuda_gate, needs_nvcc


def _grow(b, args):
    """Scale and shift a vector until its sum reaches 100; also count the steps."""
    x, scale = args
    value, count = b.while_loop(
        lambda b, c: c[0].sum("lane") < 100.0,
        lambda b, c: [c[0] * scale + 1.0, c[1] + 1],
        [x, b.scalar(i32, 0)],
    )
    return value, count


def _grow_numpy(x, scale):
    v, count = x.astype(np.float32), 0
    while v.sum() < 100.0:
        v, count = (v * scale + np.float32(1.0)).astype(np.float32), count + 1
    return v, count


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("start", [[1.0, 2.0], [0.5, 0.25], [60.0, 70.0]])
def test_while_loop_values(executor, start):
    # [60, 70] runs no iteration, [1, 2] an odd number, [0.5, 0.25] an even one: the carries'
    # last values end in the result buffer or in scratch.
    program = define("grow", [spec(f32, lane=2), spec(f32)], _grow)
    x, scale = np.array(start, np.float32), np.float32(1.5)
    value, count = executor(program, [x, scale])
    want_value, want_count = _grow_numpy(x, scale)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    assert int(count) == want_count
    assert want_count % 2 == {1.0: 1, 0.5: 0, 60.0: 0}[start[0]]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_while_loop_with_a_matrix_product_in_its_body(executor):
    # Power iteration until the Rayleigh quotient settles: a GEMM (cuBLAS on the GPU) inside
    # the loop, a closure (the matrix) as a const.
    def power(b, args):
        a, v0 = args

        def body(b, c):
            v, _, steps = c
            w = a.contract(v.rename("row", "col"), "col")
            return [w / (w * w).sum("row").sqrt(), (v * w).sum("row"), steps + 1]

        v, rayleigh, steps = b.while_loop(
            lambda b, c: c[2] < 25, body, [v0, b.scalar(f32, 0.0), b.scalar(i32, 0)]
        )
        return v, rayleigh, steps

    rng = np.random.default_rng(0)
    m = rng.normal(size=(6, 6)).astype(np.float32)
    a = (m @ m.T + 6 * np.eye(6)).astype(np.float32)
    v0 = (np.ones(6) / np.sqrt(6)).astype(np.float32)
    program = define("power", [spec(f32, row=6, col=6), spec(f32, row=6)], power)
    v, rayleigh, steps = executor(program, [a, v0])
    want = v0.astype(np.float64)
    for _ in range(25):
        w = a.astype(np.float64) @ want
        quotient, want = want @ w, w / np.linalg.norm(w)
    np.testing.assert_allclose(v, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rayleigh, quotient, rtol=1e-4)
    assert int(steps) == 25


@pytest.mark.parametrize("executor", EXECUTORS)
def test_nested_while_loops_and_a_while_loop_inside_a_scan(executor):
    # For each x in xs: halve it until it is below 1 (an inner while per outer step), count
    # the halvings; the outer while repeats that three times over a doubling of the carry.
    def f(b, args):
        (xs,) = args

        def halvings(b, a):
            (total,), (x,) = a[:1], a[1:]
            smaller, count = b.while_loop(
                lambda b, c: c[0] >= 1.0, lambda b, c: [c[0] * 0.5, c[1] + 1.0], [x, total * 0.0]
            )
            return total + count, smaller

        def outer(b, c):
            ys, rounds = c
            (total,), (small,) = b.scan(halvings, carries=[b.scalar(f32, 0.0)], xs=[ys], axis="t")
            return [ys * 2.0 + total * 0.0 + small * 0.0, rounds + 1]

        twice, rounds = b.while_loop(lambda b, c: c[1] < 3, outer, [xs, b.scalar(i32, 0)])
        (total,), (small,) = b.scan(halvings, carries=[b.scalar(f32, 0.0)], xs=[twice], axis="t")
        return total, small, rounds

    xs = np.array([0.5, 3.0, 10.0, 1.0], np.float32)
    program = define("halvings", [spec(f32, t=4)], f)
    total, small, rounds = executor(program, [xs])
    scaled, counts = xs * 8.0, []
    for x in scaled:
        count = 0
        while x >= 1.0:
            x, count = x * 0.5, count + 1
        counts.append(count)
    counts = np.array(counts, np.float32)
    np.testing.assert_allclose(total, counts.sum())
    np.testing.assert_allclose(small, scaled / 2.0**counts)
    assert int(rounds) == 3


def _branches(b, args):
    x, w = args

    def on_true(b, v):
        return (v[0] * w).sin(), v[0].contract(w, "lane")

    def on_false(b, v):
        return v[0].tanh() * w, -(v[0] * v[0]).sum("lane")

    return b.cond(x.sum("lane") > 0.0, on_true, on_false, [x])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_values(executor, sign):
    program = define("branches", [spec(f32, lane=3)] * 2, _branches)
    x = sign * np.array([0.3, 0.5, 0.7], np.float32)
    w = np.array([1.5, -0.5, 0.25], np.float32)
    first, second = executor(program, [x, w])
    want = (np.sin(x * w), x @ w) if sign > 0 else (np.tanh(x) * w, -(x * x).sum())
    np.testing.assert_allclose(first, want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second, want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_cond_returning_its_arguments_and_inside_a_scan(executor):
    # The false branch returns its argument unchanged (an output that is an input: a copy).
    def f(b, args):
        h0, xs = args

        def step(b, a):
            h, x = a
            new = b.cond(x > 0.0, lambda b, v: (v[0] * v[1]).tanh(), lambda b, v: v[0], [h, x])
            return new, new * 2.0

        (final,), (ys,) = b.scan(step, carries=[h0], xs=[xs], axis="t")
        return final, ys

    program = define("scan_cond", [spec(f32), spec(f32, t=5)], f)
    xs = np.array([0.3, -0.2, 0.9, -1.1, 2.0], np.float32)
    final, ys = executor(program, [np.float32(0.5), xs])
    h, want = 0.5, []
    for x in xs.astype(np.float64):
        h = np.tanh(h * x) if x > 0 else h
        want.append(2 * h)
    np.testing.assert_allclose(ys, want, rtol=1e-5)
    np.testing.assert_allclose(final, h, rtol=1e-5)


def _never_ending_branch(b, args):
    """A cond whose false branch is a while_loop that never ends (1 stays below 2)."""
    (x,) = args
    spin = lambda b, v: b.while_loop(lambda b, c: c[0] < 2.0, lambda b, c: [c[0] * 1.0], v)[0]  # noqa: E731
    return b.cond(x > 0.0, lambda b, v: v[0] + 1.0, spin, [x])


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_native_backends_do_not_run_the_branch_not_taken(device):
    # If the false branch ran at all (as when both branches are computed and one selected),
    # it would never return: the child process would be killed at the timeout.
    if device == "cpu":
        try:
            accy.backends.cpu.find_compiler()
        except accy.RuntimeUnavailable:
            pytest.skip("native CPU backend: no C compiler")
    elif (reason := cuda_gate()) is not None:
        pytest.skip(reason)
    script = textwrap.dedent(
        f"""
        import numpy as np, accy
        from accy import f32, spec
        from tests.backends.test_control_flow import _never_ending_branch
        program = accy.trace.define("never", [spec(f32)], _never_ending_branch)
        result = accy.compile(program, device="{device}")(np.float32(1.5))[0]
        print(float(result))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2.5"


def test_the_plan_keeps_cond_and_while_loop_as_steps_with_sub_plans():
    program = define("never", [spec(f32)], _never_ending_branch)
    plan = accy.lower.build_plan(program)
    (step,) = [s for s in plan.steps if s.kind == "cond"]
    assert [p.program.name for p in step.branches][0].startswith("cond_branch")
    (inner,) = [s for s in step.branches[1].steps if s.kind == "while"]
    assert len(inner.branches) == 2
    assert "select" not in str(plan.program)
    text = accy.lower.explain(plan)
    assert "cond" in text and "while" in text


def test_the_generated_c_branches_and_loops(native_cpu):
    source = translation_unit(
        accy.lower.build_plan(define("never", [spec(f32)], _never_ending_branch))
    )
    assert "if (*(const uint8_t *)" in source and "else" in source
    assert "for (;;) {" in source and "break;" in source


def test_cuda_schedule_uses_conditional_nodes():
    compiled = compile_program(define("never", [spec(f32)], _never_ending_branch))
    nodes = [a for a in compiled.schedule.actions if isinstance(a, Conditional)]
    assert [node.kind for node in nodes] == ["if", "if"]  # the true branch, the false one
    setters = [a for a in compiled.schedule.actions if isinstance(a, SetCondition)]
    assert [s.negate for s in setters] == [False, True]
    (loop,) = [a for a in nodes[1].body if isinstance(a, Conditional)]
    assert loop.kind == "while" and isinstance(loop.body[-1], SetCondition)
    assert loop.body[-1].handle == loop.handle  # the body sets its own node's condition
    # The schedule does not grow with the number of iterations (none is known here).
    grown = compile_program(define("grow", [spec(f32, lane=2), spec(f32)], _grow))
    assert sum(isinstance(a, Conditional) for a in grown.schedule.actions) == 1


def test_cuda_contractions_inside_conditional_nodes_are_kernels_not_cublas():
    # A cuBLAS dot product inside an IF node's body made the graph fail to instantiate on the
    # H200 (cudaErrorInvalidValue); plain kernels are captured there. Outside, cuBLAS stays.
    compiled = compile_program(define("branches", [spec(f32, lane=3)] * 2, _branches))

    def gemms(actions):
        for a in actions:
            if isinstance(a, Conditional):
                yield from gemms(a.body)
            elif isinstance(a, Gemm):
                yield a

    assert list(gemms(compiled.schedule.actions)) == []
    outside = compile_program(
        define("dot", [spec(f32, lane=64)] * 2, lambda b, a: a[0].contract(a[1], "lane"))
    )
    assert any(isinstance(a, Gemm) for a in outside.schedule.actions)


@needs_nvcc
def test_cuda_c_of_cond_and_while_loop_compiles_with_nvcc():
    compiled = [
        compile_program(define("never", [spec(f32)], _never_ending_branch), prefix="c0_"),
        compile_program(define("grow", [spec(f32, lane=2), spec(f32)], _grow), prefix="c1_"),
    ]
    source = "".join(c.source for c in compiled)
    ptx = toolchain.ptx_with_nvcc(source, "cond and while_loop programs", arch="compute_90")
    assert ".entry c0_set_condition(" in ptx and "cudaGraphSetConditional" in ptx


def test_cuda_profile_refuses_conditional_nodes():
    from ..executors import cuda_device_or_skip

    cuda_device_or_skip()
    import cupy

    from accy.backends.cuda.runtime import load

    compiled = compile_program(define("grow", [spec(f32, lane=2), spec(f32)], _grow))
    fragment = load(compiled)
    buffers = [cupy.ones(2, np.float32), cupy.full((), 1.5, np.float32)]
    buffers.append(cupy.empty(2, np.float32))
    buffers.append(cupy.empty((), np.int32))
    with pytest.raises(accy.AccyError, match="conditional graph nodes run only inside"):
        fragment.profile([int(b.data.ptr) for b in buffers])
