"""The native CPU executable's array call (one function per executable, made from the source
`array_call_source` writes): many inputs and outputs, arguments it converts or refuses, in each
way of running (holding the GIL, under the executable's lock, through the arrays' addresses)
and with its arrays named or looped over. Values checked against NumPy."""

from __future__ import annotations

import sys
import threading

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


WAYS = {  # way -> (settings of the executable module, whether the call holds the GIL)
    "holding_gil": ({}, True),
    "locked": ({"SHORT_PROGRAM_BYTES": -1}, False),  # every program counts as long
    "addresses": ({"numpy_data_offset": lambda: None}, True),  # NumPy's layout not recognized
    "looping": ({"UNROLLED_ARRAYS": 4}, True),
}


@pytest.mark.parametrize("way", list(WAYS))
def test_many_arrays_in_and_out_converted_and_refused_alike(native_cpu, monkeypatch, way):
    settings, holds_gil = WAYS[way]
    for name, value in settings.items():
        monkeypatch.setattr(cpu_executable, name, value)
    run = accy.compile(many_in_three_out(f"array_call_{way}"), "cpu")
    assert run.holds_gil is holds_gil and run.takes_arrays is (way != "addresses")
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


def test_threads_calling_one_executable_each_get_their_own_results(native_cpu):
    # A short program's call keeps the GIL; Python hands the GIL from thread to thread as often
    # as it can here, and no call may see another's arrays.
    run = accy.compile(
        accy.trace.define("threads_scale", [spec(f32, n=3)], lambda b, a: a[0] * 3.0)
    )
    assert run.holds_gil
    failures: list[int] = []

    def repeat(k: int) -> None:
        x = np.full(3, float(k), np.float32)
        for _ in range(2000):
            if run(x)[0].tolist() != [3.0 * k] * 3:
                failures.append(k)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=repeat, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures
