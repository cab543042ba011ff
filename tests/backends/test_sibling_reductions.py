"""Row reductions over the same rows in one pass (`accy.lower.grouping.sibling_reductions`): the
plan's `reductions` steps, and their values on the CPU and on CUDA against NumPy and the
reference evaluator."""

from __future__ import annotations

import re

import numpy as np
import pytest

import accy
from accy import bf16, f32, f64, i32, spec
from accy.backends.cuda import compile_program
from accy.kernel import toolchain
from accy.lower import build_plan, explain
from accy.lower.grouping import MAX_GROUP_OPERATIONS
from accy.lower.target import CPU, GPU

from ..executors import native_cpu, native_cuda, needs_nvcc
from ..halves import comparable
from .row_losses import (
    check_against_reference,
    cross_entropy_loss,
    layer_norm_loss,
    random_inputs,
)

TARGETS = [pytest.param(CPU, id="cpu"), pytest.param(GPU, id="gpu")]
EXECUTORS = [pytest.param(native_cpu, id="cpu"), pytest.param(native_cuda, id="cuda")]


def kinds(plan):
    return [step.kind for step in plan.steps]


def reductions_steps(plan):
    return [step for step in plan.steps if step.kind == "reductions"]


def member_ops(step):
    return [member.op.attrs["op"] for member in step.members]


# Programs ---------------------------------------------------------------------------------------


def sum_and_max(dtype=f32, rows=24, cols=40):
    return accy.trace.define(
        "sum_and_max",
        [spec(dtype, row=rows, v=cols)],
        lambda b, a: ((a[0] * a[0]).sum("v"), a[0].max("v")),
    )


def four_reducers(rows=6, cols=9):
    # Different ops side by side: sum, prod, max, min of the same rows.
    def body(b, a):
        x = a[0]
        return x.sum("v"), (x * 0.25 + 1.0).prod("v"), x.max("v"), x.min("v")

    return accy.trace.define("four", [spec(f32, row=rows, v=cols)], body)


def mixed_dtypes(rows=16, cols=520):
    # A bf16 max, an f32 sum of the same bf16 rows widened, and an f32 sum of another buffer.
    def body(b, a):
        x, y = a
        return x.max("v"), x.convert(f32).sum("v"), (y * x.convert(f32)).sum("v")

    return accy.trace.define(
        "mixed", [spec(bf16, row=rows, v=cols), spec(f32, row=rows, v=cols)], body
    )


def integer_sums(rows=12, cols=33):
    def body(b, a):
        x = a[0]
        return x.sum("v"), (x * x).sum("v"), x.min("v"), x.max("v")

    return accy.trace.define("ints", [spec(i32, row=rows, v=cols)], body)


def pick_and_max(dtype=f32, rows=16, classes=1000):
    # What cross_entropy reads the logits for: their max and the logit at each label.
    def body(b, a):
        return a[0].max("v"), accy.nn.pick(a[0], a[1], "v")

    return accy.trace.define(
        "pick_and_max", [spec(dtype, row=rows, v=classes), spec(i32, row=rows)], body
    )


def two_axes(rows=5, heads=3, cols=64):
    # Kept axes outside, two reduced axes inside.
    def body(b, a):
        x = a[0]
        return x.sum(("h", "v")), x.exp().max(("h", "v"))

    return accy.trace.define("two_axes", [spec(f32, row=rows, h=heads, v=cols)], body)


def softmax_denominator(rows=8, cols=64):
    # The second sum reads the first's result (the max): they must not share a pass.
    def body(b, a):
        x = a[0]
        peak = x.max("v")
        return (x - peak).exp().sum("v")

    return accy.trace.define("chain", [spec(f32, row=rows, v=cols)], body)


# The plan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_two_reductions_of_the_same_rows_are_one_step(target):
    plan = build_plan(sum_and_max(), target)
    assert kinds(plan) == ["reductions"]
    (step,) = plan.steps
    assert member_ops(step) == ["sum", "max"] and step.reads == (0,)
    text = explain(plan)
    assert "one pass over the rows for 2 reductions (rows)" in text
    assert "- sum over v" in text and "- max over v" in text


@pytest.mark.parametrize("target", TARGETS)
def test_a_reduction_of_another_ones_result_is_not_merged(target):
    # They run as a chain instead: two passes over each row (test_reduction_chains.py).
    plan = build_plan(softmax_denominator(), target)
    assert "reductions" not in kinds(plan)
    (chain,) = plan.steps
    assert chain.kind == "chain" and [phase.kind for phase in chain.members] == ["reduce"] * 2


def test_reductions_of_other_rows_or_columns_are_not_merged():
    def body(b, a):
        x, y = a
        # Different extents; and two column sums (the innermost axis kept).
        return x.sum("v"), y.sum("v"), x.sum("row"), (x * 2.0).sum("row")

    program = accy.trace.define("apart", [spec(f32, row=8, v=16), spec(f32, row=8, v=32)], body)
    plan = build_plan(program)
    assert "reductions" not in kinds(plan)
    strategies = sorted(step.detail.strategy for step in plan.steps)
    assert strategies == ["columns", "columns", "rows", "rows"]


@pytest.mark.parametrize("target", TARGETS)
def test_cross_entropy_reads_the_logits_once_for_the_max_and_the_pick(target):
    gradient = accy.value_and_grad(cross_entropy_loss(bf16), wrt=[0])
    plan = build_plan(gradient, target)
    logits = gradient.parameters[0]
    (step,) = reductions_steps(plan) or [s.members[0] for s in plan.steps if s.kind == "chain"]
    assert sorted(member_ops(step)) == ["max", "sum"]
    assert logits in step.reads
    picked = next(m for m in step.members if m.op.attrs["op"] == "sum")
    assert {"compare", "select"} <= {op.kind for op in picked.fused}
    # Then the softmax's sum reads them again where exp is computed inside it (the GPU: a
    # chain's second pass over each row); the CPU stores logits - max, which its sum reads.
    readers = [s for s in plan.steps if logits in s.reads and s.kind in ("reductions", "chain")]
    assert [s.kind for s in readers] == ["chain" if target is GPU else "reductions"]


@pytest.mark.parametrize("target", TARGETS)
def test_layer_norm_backward_row_sums_are_a_chain(target):
    # The second sum (of g * (x - mean)) reads the first through the variance's derivative
    # (its term through the mean), so they cannot share a pass: they run as a chain of two
    # passes over each row (test_reduction_chains.py). Rewriting the variance so that
    # they could (mean((x - s)^2) - (mean - s)^2 with s = stop_gradient(mean)) made GPT-2's
    # rematerialization store x - mean instead of recomputing the LayerNorm's output: 276 MiB
    # more at the bf16 step's peak for 0.2 ms, so layer_norm keeps the plain formula.
    gradient = accy.value_and_grad(layer_norm_loss(bf16), wrt=[0, 1])
    plan = build_plan(gradient, target)
    last_dot = max(i for i, step in enumerate(plan.steps) if step.kind == "dot")
    backward_gradient = plan.steps[last_dot].writes[0]  # of the LayerNorm's output
    row_sums = [
        step
        for step in plan.steps[last_dot + 1 :]
        if step.kind in ("reduce", "reductions", "chain")
        and step.detail.strategy == "rows"
        and step.detail.kept
    ]
    (chain,) = row_sums
    # The GPU's chain then writes the input's gradient too (`Target.chains_end_in_place`).
    last = ["loop"] if target.chains_end_in_place else []
    assert chain.kind == "chain"
    assert [phase.kind for phase in chain.members] == ["reduce"] * 2 + last
    assert backward_gradient in chain.members[0].reads


def test_a_set_of_siblings_holds_a_bounded_number_of_operations():
    def body(b, a):
        x = a[0]
        return tuple((x * float(k + 2)).tanh().sum("v") for k in range(400))

    plan = build_plan(accy.trace.define("many", [spec(f32, row=4, v=8)], body))
    sets = reductions_steps(plan)
    assert len(sets) >= 2 and sum(len(s.members) for s in sets) == 400
    for step in sets:
        assert sum(len(m.fused) + 1 for m in step.members) <= MAX_GROUP_OPERATIONS


# Values -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("executor", EXECUTORS)
def test_sum_and_max_of_the_same_rows(executor):
    check_against_reference(executor, sum_and_max(), lambda x: ((x * x).sum(1), x.max(1)))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_sum_prod_max_and_min_side_by_side(executor):
    expected = lambda x: (x.sum(1), (x * 0.25 + 1.0).prod(1), x.max(1), x.min(1))  # noqa: E731
    check_against_reference(executor, four_reducers(), expected, rtol=1e-4)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_bf16_and_f32_accumulators_in_one_pass(executor):
    def expected(x, y):
        wide = comparable(x).astype(np.float64)
        return x.max(1), wide.sum(1), (y * wide).sum(1)

    assert kinds(build_plan(mixed_dtypes())) == ["reductions"]
    check_against_reference(executor, mixed_dtypes(), expected, rtol=2e-5)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_integer_sums_and_extremes(executor):
    assert kinds(build_plan(integer_sums())) == ["reductions"]
    expected = lambda x: (x.sum(1), (x * x).sum(1), x.min(1), x.max(1))  # noqa: E731
    check_against_reference(executor, integer_sums(), expected)


@pytest.mark.parametrize("dtype", [f32, bf16], ids=str)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_pick_and_max_as_cross_entropy_reads_them(executor, dtype):
    def expected(x, labels):
        wide = comparable(x).astype(np.float64)
        return wide.max(1), wide[np.arange(len(labels)), labels]

    rtol = 1e-6 if dtype == f32 else 2.0**-8
    check_against_reference(executor, pick_and_max(dtype), expected, rtol=rtol)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_two_reduced_axes(executor):
    assert kinds(build_plan(two_axes())) == ["reductions"]
    expected = lambda x: (x.sum((1, 2)), np.exp(x).max((1, 2)))  # noqa: E731
    check_against_reference(executor, two_axes(), expected, rtol=1e-5)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_long_rows_with_vector_loads(executor):
    # 8 rows of 8200: a block per row and 16-byte loads on CUDA.
    program = sum_and_max(bf16, rows=8, cols=8200)
    check_against_reference(executor, program, rtol=2.0**-7)


# Gradients against finite differences (float64, so that differences are exact enough) ---------


def _finite_difference_gradient(program, inputs, position, eps=1e-6):
    """d output 0 / d input `position`, by central differences on the reference evaluator."""
    x = inputs[position]
    gradient = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        values = []
        for step in (eps, -eps):
            shifted = [a.copy() for a in inputs]
            shifted[position][index] += step
            values.append(float(accy.reference.run(program, shifted)[0]))
        gradient[index] = (values[0] - values[1]) / (2 * eps)
    return gradient


@pytest.mark.parametrize(
    "build, wrt, merged, chained",
    [
        pytest.param(
            lambda: cross_entropy_loss(f64, rows=3, classes=7),
            [0],
            True,
            False,
            id="cross_entropy",
        ),
        pytest.param(
            lambda: layer_norm_loss(f64, rows=3, cols=6, out=2),
            [0, 1],
            False,
            True,
            id="layer_norm",
        ),
    ],
)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_gradients_match_finite_differences(executor, build, wrt, merged, chained):
    program = build()
    gradient = accy.value_and_grad(program, wrt=wrt)
    plan = build_plan(gradient)
    assert bool(reductions_steps(plan)) == merged  # what runs
    assert ("chain" in kinds(plan)) == chained
    inputs = random_inputs(program, np.random.default_rng(3))
    got = executor(gradient, inputs)
    for k, position in enumerate(wrt):
        want = _finite_difference_gradient(program, inputs, position)
        np.testing.assert_allclose(got[1 + k], want, rtol=1e-6, atol=1e-8)


# The CUDA source (no GPU needed) ----------------------------------------------------------------


def _reductions_kernel(source: str) -> str:
    start = source.index(": reductions */")
    return source[start : source.index("\n}\n", start)]


def test_the_cuda_kernel_has_an_accumulator_per_reduction_and_vector_loads():
    kernel = _reductions_kernel(compile_program(pick_and_max(bf16, rows=64, classes=4104)).source)
    assert "float acc0 = (-INFINITY);" in kernel and "float acc1 = 0;" in kernel
    # One 16-byte load of the logits serves both accumulators.
    assert len(re.findall(r"accy_vector<uint16_t, 8> t\d+ = \*", kernel)) == 1
    assert "acc0_shared" in kernel and "acc1_shared" in kernel


def test_the_cuda_kernel_keeps_each_accumulators_dtype():
    kernel = _reductions_kernel(compile_program(integer_sums()).source)
    assert "int32_t acc0 = 0;" in kernel and "int32_t acc2 = " in kernel


@pytest.mark.slow
@needs_nvcc
def test_the_merged_kernels_compile():
    programs = [
        sum_and_max(bf16, rows=8, cols=8200),
        four_reducers(),
        mixed_dtypes(),
        integer_sums(),
        pick_and_max(bf16, rows=64, classes=4104),
        two_axes(),
        accy.value_and_grad(cross_entropy_loss(bf16), wrt=[0]),
    ]
    source = "".join(
        compile_program(program, prefix=f"s{n}_").source for n, program in enumerate(programs)
    )
    # The cross-entropy gradient's siblings are a chain's first phase (test_reduction_chains.py).
    assert source.count(": reductions */") + source.count(": chain (chain) */") >= len(programs)
    toolchain.ptx_with_nvcc(source, "sibling reductions", arch="compute_90")
