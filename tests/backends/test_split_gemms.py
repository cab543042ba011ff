"""f32 contractions of bf16 values rewritten as bf16 contractions (`accy.lower.split_gemms`):
the rewritten program computes the same values as the original on the reference evaluator,
within an f32 GEMM's rounding, and the CUDA plan of the mixed-precision `block` gradient has no
f32 GEMM left."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import accy
from accy.lower.split_gemms import split_widened_gemms


@pytest.fixture(autouse=True)
def _every_size(configure):
    configure(lower_smallest_split=0)


def contractions(program):
    return [op for op in program.operations if op.kind == "dot_general"]


def f32_gemm_bound(x, w):
    """What an f32 GEMM may be off by: K * 2^-24 * sum |x| |w| (sums of any order)."""
    k = x.shape[-1]
    return k * 2.0**-24 * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)))


def widened_product(x_axes, w_axes, contract, left=True):
    types = [accy.spec(accy.f32, **x_axes), accy.spec(accy.bf16, **w_axes)]

    def body(b, a):
        x, w = a[0], a[1].convert(accy.f32)
        return x.contract(w, contract) if left else w.contract(x, contract)

    return accy.trace.define("widened", types, body)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize(
    "rows, w_extent, tiled",
    # w smaller than the result is repeated; otherwise three f32 products are summed
    [(64, 8, True), (8, 64, False)],
)
def test_one_widened_operand_matches_f32(left, rows, w_extent, tiled):
    rng = np.random.default_rng(0)
    program = widened_product({"row": rows, "k": 96}, {"k": 96, "col": w_extent}, "k", left)
    split = split_widened_gemms(program)
    dots = contractions(split)
    assert all(op.operand_types[0].dtype == accy.bf16 for op in dots)
    assert len(dots) == (1 if tiled else 3)
    assert split.count("concatenate") == (2 if tiled else 0)
    # Values spread over many binades, so that all three parts matter.
    x = (rng.standard_normal((rows, 96)) * np.exp2(rng.integers(-20, 20, (rows, 96)))).astype(
        np.float32
    )
    w = rng.standard_normal((96, w_extent)).astype(ml_dtypes.bfloat16)
    (got,) = accy.reference.run(split, [x, w])
    exact = x.astype(np.float64) @ w.astype(np.float64)
    expected = exact if left else exact.T
    bound = f32_gemm_bound(x, w) if left else f32_gemm_bound(x, w).T
    assert np.all(np.abs(np.asarray(got, np.float64) - expected) <= bound + 1e-45)


def test_the_three_parts_sum_to_the_value_exactly():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-100, 100, 4096))).astype(np.float32)
    parts = []
    rest = x
    for _ in range(3):  # as the rewrite does, with NumPy's round-to-nearest-even bf16
        part = rest.astype(ml_dtypes.bfloat16)
        parts.append(part)
        rest = rest - part.astype(np.float32)
    assert np.all(rest == 0)
    total = parts[0].astype(np.float64) + parts[1].astype(np.float64) + parts[2].astype(np.float64)
    assert np.array_equal(total, x.astype(np.float64))


def test_two_widened_operands_become_one_bf16_contraction():
    types = [accy.spec(accy.bf16, row=8, k=32), accy.spec(accy.bf16, k=32, col=4)]
    program = accy.trace.define(
        "both", types, lambda b, a: a[0].convert(accy.f32).contract(a[1].convert(accy.f32), "k")
    )
    split = split_widened_gemms(program)
    (dot,) = contractions(split)
    assert dot.attrs["accumulate"] == "f32" and split.count("convert") == 0
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 32)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((32, 4)).astype(ml_dtypes.bfloat16)
    (got,) = accy.reference.run(split, [x, w])
    exact = x.astype(np.float64) @ w.astype(np.float64)
    assert np.all(np.abs(np.asarray(got, np.float64) - exact) <= f32_gemm_bound(x, w))


def test_batched_contraction_keeps_its_batch_axis():
    types = [accy.spec(accy.f32, head=3, row=8, k=16), accy.spec(accy.bf16, head=3, k=16, col=5)]
    program = accy.trace.define(
        "batched", types, lambda b, a: a[0].contract(a[1].convert(accy.f32), "k")
    )
    split = split_widened_gemms(program)
    assert split.output_types == program.output_types
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 8, 16)).astype(np.float32)
    w = rng.standard_normal((3, 16, 5)).astype(ml_dtypes.bfloat16)
    (got,) = accy.reference.run(split, [x, w])
    (want,) = accy.reference.run(program, [x, w])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_what_is_left_alone():
    f16 = [accy.spec(accy.f32, row=8, k=16), accy.spec(accy.f16, k=16, col=4)]
    program = accy.trace.define("f16", f16, lambda b, a: a[0].contract(a[1].convert(accy.f32), "k"))
    assert split_widened_gemms(program) is program  # f16 parts would overflow
    plain = [accy.spec(accy.f32, row=8, k=16), accy.spec(accy.f32, k=16, col=4)]
    program = accy.trace.define("f32", plain, lambda b, a: a[0].contract(a[1], "k"))
    assert split_widened_gemms(program) is program


def test_small_contractions_are_left_alone(configure):
    configure(lower_smallest_split=1 << 22)
    program = widened_product({"row": 16, "k": 96}, {"k": 96, "col": 8}, "k")
    assert split_widened_gemms(program) is program


def test_block_gradient_planned_for_a_gpu_has_no_f32_gemm(configure):
    configure(lower_smallest_split=1 << 22)
    from accy.lower import build_plan
    from accy.lower.target import CPU, GPU
    from bench.workloads import WORKLOADS

    program = WORKLOADS["block"].value_and_grad("cuda", "bf16")
    f32_dots = [op for op in contractions(program) if op.operand_types[0].dtype == accy.f32]
    assert len(f32_dots) == 2  # the transposes of the f32-accumulated second contraction

    def planned_f32_dots(target):
        plan = build_plan(program, target)
        return [
            op
            for op in contractions(plan.program)
            if op.operand_types[0].dtype == accy.f32 or op.operand_types[1].dtype == accy.f32
        ]

    assert planned_f32_dots(GPU) == []
    assert len(planned_f32_dots(CPU)) == 2
