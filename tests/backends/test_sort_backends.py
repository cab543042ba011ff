"""The kind sort on the native backends: long rows on the CPU (merge sort, rows shared among
threads) against np.sort/np.argsort(kind="stable"); CUDA's row limit; every device on rows
CUDA can sort."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import f32, i32, spec
from accy.backends.cuda import compile_program
from accy.core.kinds.sorting import CUDA_MAX_ROW


def _sort_program(rows: int, n: int, descending: bool = False):
    def body(b, args):
        keys = args[0]
        return (*b.sort([keys, b.iota(keys.ty.with_dtype(i32), "n")], "n", descending),)

    return accy.trace.define("long_sort", [spec(f32, r=rows, n=n)], body)


@pytest.mark.parametrize("rows, n", [(1, 200_003), (64, 20_000)])
def test_long_rows_sort_stably_on_the_cpu(native_cpu, rows, n):
    rng = np.random.default_rng(3)
    keys = rng.integers(-1000, 1000, (rows, n)).astype(np.float32)  # ties everywhere
    keys[:, ::101] = np.nan
    values, order = accy.compile(_sort_program(rows, n), "cpu")(keys)
    np.testing.assert_array_equal(order, np.argsort(keys, axis=1, kind="stable"))
    np.testing.assert_array_equal(values, np.sort(keys, axis=1, kind="stable"))


def test_descending_long_rows_on_the_cpu(native_cpu):
    rng = np.random.default_rng(4)
    keys = rng.integers(0, 50, (3, 30_000)).astype(np.float32)
    values, order = accy.compile(_sort_program(3, 30_000, True), "cpu")(keys)
    # stable descending of integers-as-floats: ascending stable order of -keys
    np.testing.assert_array_equal(order, np.argsort(-keys, axis=1, kind="stable"))
    np.testing.assert_array_equal(values, -np.sort(-keys, axis=1, kind="stable"))


def test_cuda_refuses_rows_longer_than_its_limit_at_compile_time():
    with pytest.raises(accy.AccyError, match=f"sort on cuda sorts rows of up to {CUDA_MAX_ROW}"):
        compile_program(_sort_program(2, CUDA_MAX_ROW + 1))


def test_sort_and_its_gradient_agree_on_every_device(device):
    def loss(b, args):
        values, carried = b.sort([args[0], args[1]], "n")
        weights = b.iota(spec(f32, n=CUDA_MAX_ROW), "n").convert(f32) * 1e-3
        return (values * weights).sum() + (carried * weights).sum()

    types = [spec(f32, r=2, n=CUDA_MAX_ROW)] * 2
    program = accy.value_and_grad(accy.trace.define("sort_loss", types, loss), wrt=(0, 1))
    rng = np.random.default_rng(5)
    keys = rng.permutation(2 * CUDA_MAX_ROW).reshape(2, CUDA_MAX_ROW).astype(np.float32)
    other = rng.standard_normal((2, CUDA_MAX_ROW)).astype(np.float32)
    results = accy.compile(program, device)(keys, other)
    value, d_keys, d_other = (a.get() if hasattr(a, "get") else np.asarray(a) for a in results)
    weights = np.arange(CUDA_MAX_ROW) * 1e-3
    order = np.argsort(keys, axis=1)
    expected_d = np.zeros_like(keys)
    np.put_along_axis(expected_d, order, np.broadcast_to(weights, keys.shape), axis=1)
    np.testing.assert_allclose(d_keys, expected_d, rtol=1e-6)
    np.testing.assert_allclose(d_other, expected_d, rtol=1e-6)
    expected_value = (np.sort(keys, 1) * weights).sum() + (
        np.take_along_axis(other, order, 1) * weights
    ).sum()
    np.testing.assert_allclose(value, expected_value, rtol=1e-5)
