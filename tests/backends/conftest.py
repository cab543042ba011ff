"""Fixtures of the backend tests: the native-CPU gate (the private compile cache every test
uses is in tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

import accy

from ..executors import cuda_gate
from ..halves import comparable


@pytest.fixture
def native_cpu():
    """Skip unless native CPU artifacts can be built (grad.zig's requireNativeCpuArtifacts)."""
    try:
        accy.backends.cpu.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")


@pytest.fixture(params=["reference", "cpu", "cuda"])
def device(request):
    """Each device name in turn, or a skip saying why it cannot run here."""
    if request.param == "cpu":
        try:
            accy.backends.cpu.find_compiler()
        except accy.RuntimeUnavailable:
            pytest.skip("native CPU backend: no C compiler")
    if request.param == "cuda" and (reason := cuda_gate()) is not None:
        pytest.skip(reason)
    return request.param


def assert_matches_reference(program, inputs, rtol=1e-5, atol=1e-6):
    """Run `program` natively and on the reference evaluator; compare every output."""
    native = accy.compile(program, device="cpu")(*inputs)
    expected = accy.reference.run(program, inputs)
    assert len(native) == len(expected)
    for position, (got, want) in enumerate(zip(native, expected, strict=True)):
        assert got.dtype == want.dtype, f"output {position}: {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"output {position}: {got.shape} != {want.shape}"
        got, want = comparable(got), comparable(want)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(
                got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"output {position}"
            )
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"output {position}")
    return native
