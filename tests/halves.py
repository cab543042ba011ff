"""Test helpers for the 16-bit floats."""

from __future__ import annotations

import numpy as np

from accy import bf16


def comparable(array) -> np.ndarray:
    """`array` as NumPy's testing helpers compare it: bf16 (ml_dtypes, which they do not take
    for a float, so NaN != NaN) widened to float32, exactly; anything else as it is."""
    array = np.asarray(array)
    return array.astype(np.float32) if array.dtype == bf16.numpy else array
