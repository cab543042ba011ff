"""Every catalog kernel, compiled from its C and run on random inputs, against NumPy."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from ..halves import comparable
from .catalog import CASES, Case


def _rng(case: Case) -> np.random.Generator:
    # Seeded by name: each kernel sees the same inputs on every run, and different kernels differ.
    return np.random.default_rng(zlib.crc32(case.name.encode()))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_kernel_matches_numpy(case: Case, catalog_calls, catalog_library):
    inputs = case.inputs(_rng(case))
    got = catalog_library.run(catalog_calls[case.name], inputs)
    with np.errstate(all="ignore"):
        expected = np.asarray(case.expected(*inputs)).reshape(-1)
    assert got.dtype == expected.dtype
    got, expected = comparable(got), comparable(expected)
    if case.tolerance:
        np.testing.assert_allclose(got, expected, rtol=case.tolerance, atol=case.tolerance)
    else:
        np.testing.assert_array_equal(got, expected)


def test_run_on_cpu_reshapes_to_the_result_type(catalog_calls):
    import accy

    call = catalog_calls["transpose_i64"]
    x = np.arange(60, dtype=np.int64)
    result_type = accy.spec(accy.i64, col=10, row=6)
    got = call.run_on_cpu([x], result_type)
    np.testing.assert_array_equal(got, x.reshape(6, 10).T)
