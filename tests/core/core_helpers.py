"""Small helpers shared by the core tests: trace, evaluate, make random inputs, compare."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import accy
from accy.core.types import TensorType


def trace(specs: Sequence[TensorType], body: Callable, name: str = "test") -> accy.Program:
    """`accy.trace.define` with a default name."""
    return accy.trace.define(name, list(specs), body)


def evaluate(program: accy.Program, *inputs, custom_calls=None) -> list[np.ndarray]:
    return accy.reference.run(program, list(inputs), custom_calls=custom_calls)


def evaluate_one(program: accy.Program, *inputs, custom_calls=None) -> np.ndarray:
    (only,) = evaluate(program, *inputs, custom_calls=custom_calls)
    return only


def random_array(rng: np.random.Generator, t: TensorType, low=None, high=None) -> np.ndarray:
    """Random values of `t`'s dtype and extents; floats in [low, high) when given."""
    dtype = t.dtype
    shape = t.extents
    if dtype.is_float:
        if low is not None:
            values = rng.uniform(low, high, size=shape)
        else:
            values = rng.standard_normal(size=shape)
        return values.astype(dtype.numpy)
    if dtype == accy.bool_:
        return rng.random(size=shape) < 0.5
    if dtype == accy.u8:
        return rng.integers(0, 256, size=shape).astype(np.uint8)
    low = -50 if low is None else low
    high = 50 if high is None else high
    return rng.integers(low, high, size=shape).astype(dtype.numpy)


def in_axis_order(array: np.ndarray, axes: Sequence[str], order: Sequence[str]) -> np.ndarray:
    """`array`, whose axes are named `axes` in layout order, laid out in `order` instead."""
    return np.transpose(array, [list(axes).index(a) for a in order])


def assert_same(actual: np.ndarray, expected: np.ndarray, rtol: float = 0.0, atol: float = 0.0):
    """Same dtype, same shape, and equal (NaN equal to NaN) or within tolerance."""
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape}, expected {expected.shape}"
    if rtol == 0.0 and atol == 0.0:
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
