"""The prelude's hand-written f16 and bf16 conversions, bit for bit against NumPy.

Both backends share this code, so checking it on the CPU checks the CUDA kernels' conversions.
"""

from __future__ import annotations

import numpy as np

from accy.core.types import bf16, f16, f32, round_to_bf16
from accy.kernel import Limits

from .catalog import HARD_FLOAT_COUNT, conversion_program

ALL_HALVES = np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def _conversion(source, target, extent=1 << 16):
    program = conversion_program(source, target, extent)
    return program.create_kernel_call_artifact(
        Limits.default, None, target="test.convert", version=1
    ).call


def _same_bits_or_both_nan(got: np.ndarray, expected: np.ndarray) -> None:
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    unsigned = {2: np.uint16, 4: np.uint32}[got.itemsize]
    np.testing.assert_array_equal(got[~nan].view(unsigned), expected[~nan].view(unsigned))


def test_every_f16_widens_exactly():
    got = _conversion(f16, f32).run_on_cpu([ALL_HALVES])
    _same_bits_or_both_nan(got, ALL_HALVES.astype(np.float32))


def _hard_floats(rng: np.random.Generator) -> np.ndarray:
    """Floats where f16 rounding is hard: every half, the midpoints (ties) between neighbours,
    the subnormal range, the overflow threshold, and random magnitudes."""
    finite = np.sort(ALL_HALVES[np.isfinite(ALL_HALVES)].astype(np.float32))
    midpoints = (finite[:-1].astype(np.float64) + finite[1:]) / 2
    pieces = [
        finite,
        midpoints.astype(np.float32),
        np.float32(2.0**-24) * rng.uniform(0, 1024, 4000).astype(np.float32),
        np.array([65504, 65519.99, 65520, 65536, 1e30, np.inf, np.nan], np.float32),
        np.float32(2.0) ** rng.uniform(-30, 17, 6000).astype(np.float32),
    ]
    values = np.concatenate(pieces)
    values = np.concatenate([values, -values])
    assert values.size <= HARD_FLOAT_COUNT
    return np.resize(values, HARD_FLOAT_COUNT)


def test_f32_narrows_to_f16_half_to_even():
    values = _hard_floats(np.random.default_rng(16))
    got = _conversion(f32, f16, HARD_FLOAT_COUNT).run_on_cpu([values])
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    _same_bits_or_both_nan(got, expected)


def test_f32_narrows_to_bf16_as_the_reference_evaluator_rounds():
    call = _conversion(f32, bf16)
    rng = np.random.default_rng(17)
    values = np.float32(2.0) ** rng.uniform(-130, 127, 1 << 16).astype(np.float32)
    values[:6] = [np.inf, -np.inf, np.nan, 3.3895314e38, 0.0, -0.0]  # the largest rounds to inf
    values[6:] *= np.where(rng.uniform(size=values.size - 6) < 0.5, -1, 1).astype(np.float32)
    got = call.run_on_cpu([values])
    expected = values.astype(bf16.numpy)  # ml_dtypes: to nearest, ties to even
    _same_bits_or_both_nan(got, expected)
    # round_to_bf16 (for code that keeps float32 arrays) rounds the same way.
    _same_bits_or_both_nan(got, round_to_bf16(values).astype(bf16.numpy))
