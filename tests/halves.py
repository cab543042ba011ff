"""Test helpers for the 16-bit floats."""

from __future__ import annotations

import numpy as np

from accy import bf16


def comparable(array) -> np.ndarray:
    """`array` as NumPy's testing helpers compare it: bf16 (ml_dtypes, which they do not take
    for a float, so NaN != NaN) widened to float32, exactly; anything else as it is."""
    array = np.asarray(array)
    return array.astype(np.float32) if array.dtype == bf16.numpy else array


def assert_close_scaled(got, want, rtol: float, what: str) -> None:
    """`got` equals `want` within `rtol` of each element or of the largest magnitude (sums whose
    terms cancel keep the error of the large terms); integers and bools exactly."""
    got, want = comparable(got), comparable(want)
    assert got.shape == want.shape, what
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    scale = float(np.max(np.abs(want.astype(np.float64)), initial=1e-30))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


def composed_gelu_tanh(x):
    """GELU's tanh approximation as a dozen elementwise operations (`accy.nn.gelu_tanh` is one
    op, `gelu_tanh`): what tests of fused expressions and of rematerialization build on."""
    inner = (x + x * x * x * 0.044715) * float(np.sqrt(2 / np.pi))
    return x * 0.5 * (inner.tanh() + 1.0)
