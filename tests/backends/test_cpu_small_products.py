"""Batches of small products as generated loops (`steps/dot.py`'s `_small_products`): every
layout of the operands (transposed, strided by batch axes that sit between the matrix axes, as
attention's scores do), row counts that cut the blocks of 8 rows (blocks of 4, 2 and 1), odd
column counts, f64 and bf16 operands (a bf16 result rounded once), against NumPy's float64
product within a float GEMM's rounding bound; and the loops run instead of GEMM calls."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import accy
from accy.backends.cpu.compile import compile_program
from accy.backends.cpu.steps.dot import PARALLEL_SMALL_PRODUCTS_MNK, SMALL_PRODUCT_MNK


def batched_program(a_axes: dict, b_axes: dict, dtype, accumulate=None):
    """out[head, batch, m, n] = sum_k a b, the operands stored with their axes in the order
    given (the head and batch axes anywhere in them)."""
    types = [accy.spec(dtype, **a_axes), accy.spec(dtype, **b_axes)]

    def body(builder, args):
        out = args[0].contract(args[1], "k", accumulate=accumulate)
        return out.transpose("head", "batch", "m", "n")

    return accy.trace.define("batched", types, body)


def einsum_letters(axes: dict) -> str:
    return "".join({"head": "h", "batch": "b"}.get(name, name) for name in axes)


def check(a_axes: dict, b_axes: dict, dtype=accy.f32, accumulate=None, rounded=False, seed=0):
    rng = np.random.default_rng(seed)
    storage = {accy.f32: np.float32, accy.f64: np.float64, accy.bf16: ml_dtypes.bfloat16}[dtype]
    a = rng.standard_normal(tuple(a_axes.values())).astype(storage)
    b = rng.standard_normal(tuple(b_axes.values())).astype(storage)
    program = batched_program(a_axes, b_axes, dtype, accumulate)
    source = compile_program(program).source
    assert "accy_sgemm(" not in source and "accy_gemm_mixed(" not in source
    (out,) = accy.compile(program, device="cpu")(a, b)
    spec = f"{einsum_letters(a_axes)},{einsum_letters(b_axes)}->hbmn"
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = np.einsum(spec, a64, b64)
    unit = 2.0**-53 if dtype == accy.f64 else 2.0**-24
    bound = a_axes["k"] * unit * np.einsum(spec, np.abs(a64), np.abs(b64))
    if rounded:  # then one rounding to bf16: half a unit in the last of its 8 bits
        bound = bound * 1.01 + np.abs(exact) * 2.0**-8
    assert out.shape == exact.shape
    assert np.all(np.abs(np.asarray(out, np.float64) - exact) <= bound + 1e-300)


# (m, n, k): blocks of 8 rows; of 4 (12 rows), 2 (6), 1 (7); 16 columns; 5 columns; one row.
SHAPES = [(32, 32, 16), (12, 16, 32), (6, 5, 9), (7, 33, 20), (1, 24, 8)]


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_products_of_contiguous_matrices_match_numpy(native_cpu, m, n, k):
    check({"head": 3, "batch": 2, "m": m, "k": k}, {"head": 3, "batch": 2, "k": k, "n": n})


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_transposed_operands_match_numpy(native_cpu, m, n, k):
    # A stored [k, m] (a column stride), B stored [n, k] (copied to a k x n tile first)
    check({"head": 2, "batch": 3, "k": k, "m": m}, {"head": 2, "batch": 3, "n": n, "k": k})


def test_operands_strided_by_batch_axes_inside_the_matrix_match_numpy(native_cpu):
    # The batch axes innermost: every matrix entry of one product is a batch stride apart from
    # the next, the layout of a softmax computed over [token, key, batch, head]
    check({"m": 32, "k": 32, "batch": 4, "head": 4}, {"k": 32, "batch": 4, "n": 16, "head": 4})


def test_f64_products_match_numpy(native_cpu):
    check(
        {"head": 2, "batch": 2, "m": 12, "k": 16},
        {"head": 2, "batch": 2, "n": 20, "k": 16},
        accy.f64,
    )


def test_bf16_products_summed_in_f32_match_numpy(native_cpu):
    check(
        {"head": 2, "batch": 2, "m": 32, "k": 16},
        {"head": 2, "batch": 2, "n": 32, "k": 16},
        accy.bf16,
        accumulate=accy.f32,
    )


def test_bf16_products_rounded_once_match_numpy(native_cpu):
    check(
        {"head": 2, "batch": 2, "k": 32, "m": 32},
        {"head": 2, "batch": 2, "k": 32, "n": 16},
        accy.bf16,
        rounded=True,
    )


def test_larger_products_are_gemm_calls(native_cpu):
    m, n, k = 64, 64, 32
    assert m * n * k > SMALL_PRODUCT_MNK
    a_axes, b_axes = (
        {"head": 2, "batch": 1, "m": m, "k": k},
        {"head": 2, "batch": 1, "k": k, "n": n},
    )
    program = batched_program(a_axes, b_axes, accy.f32)
    assert "accy_sgemm(" in compile_program(program).source


def test_a_large_batch_shared_among_threads_matches_numpy(native_cpu):
    a_axes = {"head": 8, "batch": 8, "m": 32, "k": 16}
    b_axes = {"head": 8, "batch": 8, "n": 32, "k": 16}
    assert PARALLEL_SMALL_PRODUCTS_MNK <= 64 * 32 * 32 * 16
    assert "omp parallel for" in compile_program(batched_program(a_axes, b_axes, accy.f32)).source
    check(a_axes, b_axes)
