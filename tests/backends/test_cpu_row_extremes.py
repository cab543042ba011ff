"""Row max and min in vector lanes (`steps/reduce.py`'s `_row_simd`): OpenMP's max and min
reductions with a NaN flag per accumulator. Rows with a NaN at the first, a middle and the last
element, rows of -inf and +inf, a max sharing its pass with a sum over the same rows (the
cross-entropy's `reductions` step), in f32, f64 and bf16, against NumPy (whose max and min
propagate NaN); and the generated loop carries the simd clauses."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import accy
from accy.backends.cpu.compile import compile_program

STORAGE = {accy.f32: np.float32, accy.f64: np.float64, accy.bf16: ml_dtypes.bfloat16}


def rows(dtype) -> np.ndarray:
    """12 rows of 37 (the lanes cut with a remainder): NaN first, in the middle and last;
    all -inf; all +inf; the rest random."""
    x = np.random.default_rng(3).standard_normal((12, 37))
    x[0, 0] = x[1, 18] = x[2, 36] = np.nan
    x[3, :] = -np.inf
    x[4, :] = np.inf
    x[5, 5] = -np.inf
    return x.astype(STORAGE[dtype])


@pytest.mark.parametrize("dtype", [accy.f32, accy.f64, accy.bf16])
@pytest.mark.parametrize("reducer", ["max", "min"])
def test_row_extremes_keep_nan_and_infinities(native_cpu, dtype, reducer):
    program = accy.trace.define(
        "extreme",
        [accy.spec(dtype, row=12, col=37)],
        lambda b, a: (getattr(a[0], reducer)("col"),),
    )
    source = compile_program(program).source
    assert f"reduction({reducer}:" in source and "_nan)" in source
    x = rows(dtype)
    (out,) = accy.compile(program, device="cpu")(x)
    expected = getattr(np, reducer)(x.astype(np.float64), axis=1)
    np.testing.assert_array_equal(np.asarray(out, np.float64), expected)


def test_a_max_sharing_its_pass_with_a_sum_matches_numpy(native_cpu):
    def body(b, a):
        x = a[0]
        return x.max("col"), (x * 2.0).sum("col")

    program = accy.trace.define("both", [accy.spec(accy.f32, row=12, col=37)], body)
    source = compile_program(program).source
    assert "reduction(max:acc0) reduction(|:acc0_nan) reduction(+:acc1)" in source
    x = rows(accy.f32)
    top, total = accy.compile(program, device="cpu")(x)
    np.testing.assert_array_equal(top, np.max(x, axis=1))
    exact = (x.astype(np.float64) * 2).sum(axis=1)
    finite = np.isfinite(exact)
    np.testing.assert_allclose(total[finite], exact[finite], rtol=1e-5)
    assert np.array_equal(np.isnan(total), np.isnan(exact))
