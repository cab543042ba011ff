"""The native CPU executable's array call (one function per executable, its arrays named, made
by `unrolled_array_call`): many inputs and outputs, arguments it converts or refuses, and both
ways of running (holding the GIL, or the executable's lock). Values checked against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, spec
from accy.backends.cpu import executable as cpu_executable

COUNT = 12


def many_in_three_out(name: str) -> accy.Program:
    """COUNT f32[n=3] inputs -> (their sum, the first times the second, the sum over n)."""

    def body(b, a):
        total = a[0]
        for x in a[1:]:
            total = total + x
        return total, a[0] * a[1], total.sum("n")

    return accy.trace.define(name, [spec(f32, n=3)] * COUNT, body)


def expected(arrays: list[np.ndarray]) -> list[np.ndarray]:
    total = np.sum(arrays, axis=0, dtype=np.float32)
    return [total, arrays[0] * arrays[1], np.float32(total.sum())]


@pytest.mark.parametrize("holding_gil", [True, False])
def test_many_arrays_in_and_out_converted_and_refused_alike(native_cpu, monkeypatch, holding_gil):
    if not holding_gil:  # every program counts as long: it runs under the executable's lock
        monkeypatch.setattr(cpu_executable, "SHORT_PROGRAM_BYTES", -1)
    program = many_in_three_out(f"array_call_{'gil' if holding_gil else 'lock'}")
    run = accy.compile(program, "cpu")
    assert run.holds_gil is holding_gil
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(3).astype(np.float32) for _ in range(COUNT)]
    for got, want in zip(run(*arrays), expected(arrays), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # A strided view and a Python list go through the argument rule, and compute the same.
    strided = np.repeat(arrays[0], 2)[::2]
    converted = [strided, arrays[1].tolist(), *arrays[2:]]
    for got, want in zip(run(*converted), expected(arrays), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(accy.InvalidInput, match="argument 5: an array of dtype float64"):
        run(*arrays[:5], arrays[5].astype(np.float64), *arrays[6:])
    with pytest.raises(accy.InvalidInput, match=f"takes {COUNT} arrays"):
        run(*arrays[:-1])
