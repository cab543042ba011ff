"""Matrix-vector products (a GEMM with one row or one column) run as loops on the CPU, not
through BLAS: every layout of the matrix (as is, transposed) on either side, and a view with an
offset, against NumPy in float64."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, f64, spec
from accy.trace import define


@pytest.mark.parametrize("dtype", [f32, f64])
@pytest.mark.parametrize(
    "case", ["matrix_vector", "transposed_matrix_vector", "vector_matrix", "vector_transposed"]
)
def test_matrix_vector_products_match_numpy(native_cpu, case, dtype):
    rng = np.random.default_rng(0)
    m = rng.standard_normal((37, 19)).astype(dtype.numpy)  # axes r=37, c=19
    if case in ("matrix_vector", "vector_matrix"):
        vector = rng.standard_normal(19 if case == "matrix_vector" else 37).astype(dtype.numpy)
    else:
        vector = rng.standard_normal(37 if case == "transposed_matrix_vector" else 19)
        vector = vector.astype(dtype.numpy)

    def body(b, args):
        matrix, v = args
        if case == "matrix_vector":  # result r: contract c, the matrix's rows are contiguous
            return matrix.contract(v, "c")
        if case == "transposed_matrix_vector":  # result c: contract r, across memory
            return matrix.contract(v, "r")
        if case == "vector_matrix":
            return v.contract(matrix, "r")
        return v.contract(matrix.transpose(("c", "r")), "c")

    axis = {"matrix_vector": "c", "transposed_matrix_vector": "r"}.get(
        case, "r" if case == "vector_matrix" else "c"
    )
    types = [spec(dtype, r=37, c=19), spec(dtype, **{axis: vector.shape[0]})]
    program = define(case, types, body)
    (got,) = accy.compile(program, device="cpu")(m, vector)
    m64, v64 = m.astype(np.float64), vector.astype(np.float64)
    want = m64 @ v64 if axis == "c" else v64 @ m64
    tolerance = 1e-5 if dtype == f32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)
    plan = accy.lower.build_plan(program)
    assert [step.kind for step in plan.steps] == ["dot"]


def test_a_matrix_vector_product_of_a_sliced_operand(native_cpu):
    # The vector is a row of a matrix input: a view with an offset into its buffer.
    def body(b, args):
        matrix, rows = args
        row = rows.slice("k", 2, 3).sum("k").rename("c2", "c")
        return matrix.contract(row, "c")

    program = define("sliced", [spec(f32, r=5, c=7), spec(f32, k=3, c2=7)], body)
    rng = np.random.default_rng(1)
    m, rows = rng.standard_normal((5, 7), np.float32), rng.standard_normal((3, 7), np.float32)
    (got,) = accy.compile(program, device="cpu")(m, rows)
    np.testing.assert_allclose(got, m.astype(np.float64) @ rows[2], rtol=1e-5, atol=1e-6)
