"""The kind `sort` on the reference evaluator: against np.sort(kind="stable") and np.argsort,
for every dtype, both directions, NaN, several operands, long rows; gradients against finite
differences; batching; errors."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.core.kinds.sorting import stable_order
from accy.testing import check_grads

from .core_helpers import assert_same, evaluate, trace

f32, f64, f16, i32, i64, u8, bool_ = (
    accy.f32,
    accy.f64,
    accy.f16,
    accy.i32,
    accy.i64,
    accy.u8,
    accy.bool_,
)
spec = accy.spec


def numpy_descending(keys: np.ndarray) -> np.ndarray:
    """Stable descending order, NaN first, worked out with Python's stable sort per row."""
    rows = []
    for row in keys.reshape(-1, keys.shape[-1]):

        def rank(i, row=row):
            value = row[i]
            nan = isinstance(value, float | np.floating) and np.isnan(value)
            return (0 if nan else 1, 0 if nan else -float(value))

        rows.append(sorted(range(len(row)), key=rank))
    return np.array(rows).reshape(keys.shape)


@pytest.mark.parametrize("dtype", [f32, f64, f16, i32, i64, u8, bool_])
def test_sort_and_argsort_match_numpy_stable(rng, dtype):
    def body(b, a):
        return (a[0].sort("n"), a[0].argsort("n"), a[0].argsort("n", descending=True))

    program = trace([spec(dtype, r=4, n=300)], body)
    assert program.count("sort") == 3
    if dtype.is_float:
        keys = rng.integers(-20, 20, (4, 300)).astype(dtype.numpy)  # many ties
        keys[0, ::7] = np.nan
        keys[1, ::5] = -0.0
    elif dtype == bool_:
        keys = rng.random((4, 300)) < 0.5
    else:
        keys = rng.integers(0, 30, (4, 300)).astype(dtype.numpy)
    values, ascending, descending = evaluate(program, keys)
    assert_same(values, np.sort(keys, axis=1, kind="stable"))
    assert_same(ascending, np.argsort(keys, axis=1, kind="stable").astype(np.int32))
    expected = numpy_descending(keys.astype(np.float64) if dtype != bool_ else keys.astype(int))
    assert_same(descending, expected.astype(np.int32))


def test_sort_carries_operands_along_a_middle_axis(rng):
    program = trace(
        [spec(f64, a=3, n=50, c=2), spec(i32, a=3, n=50, c=2), spec(f32, c=2, n=50, a=3)],
        lambda b, x: b.sort(list(x), "n", descending=True),
    )
    keys = rng.integers(0, 5, (3, 50, 2)).astype(np.float64)
    ints = rng.integers(0, 99, (3, 50, 2)).astype(np.int32)
    other = rng.standard_normal((2, 50, 3)).astype(np.float32)
    order = np.moveaxis(numpy_descending(np.moveaxis(keys, 1, -1)), -1, 1)
    got = evaluate(program, keys, ints, other)
    assert_same(got[0], np.take_along_axis(keys, order, 1))
    assert_same(got[1], np.take_along_axis(ints, order, 1))
    expected = np.take_along_axis(other, np.transpose(order, (2, 1, 0)), 1)
    assert_same(got[2], expected)


def test_a_wider_operand_is_gathered_by_the_permutation(rng):
    program = trace([spec(f32, n=6), spec(f32, n=6, c=3)], lambda b, x: b.sort(list(x), "n"))
    keys = rng.permutation(6).astype(np.float32)
    wide = rng.standard_normal((6, 3)).astype(np.float32)
    got = evaluate(program, keys, wide)
    assert_same(got[1], wide[np.argsort(keys)])


def test_stable_order_helper_puts_nan_first_when_descending():
    keys = np.array([[1.0, np.nan, 3.0, 1.0, np.nan]])
    assert stable_order(keys, 1, True).tolist() == [[1, 4, 2, 0, 3]]
    assert stable_order(keys, 1, False).tolist() == [[0, 3, 2, 1, 4]]


def test_sort_gradient_matches_finite_differences(rng):
    def body(b, a):
        values, carried = b.sort([a[0], a[1]], "n")
        top, _ = a[0].top_k(3, "n")
        weights = b.iota(spec(f32, n=40), "n").convert(f32) * 0.1
        return (values * weights).sum() + (carried * carried * weights).sum() + top.sum()

    program = trace([spec(f32, r=2, n=40), spec(f32, r=2, n=40)], body)
    keys = rng.permutation(80).reshape(2, 40) * 0.25  # distinct: the permutation is fixed
    check_grads(program, [keys, rng.standard_normal((2, 40))], wrt=(0, 1), order=2)


def test_sort_batches_under_vmap(rng):
    program = trace([spec(f32, n=7), spec(i32, n=7)], lambda b, a: b.sort(list(a), "n"))
    batched = accy.vmap(program, "example", in_axes=(True, False), size=3)
    keys = rng.standard_normal((3, 7)).astype(np.float32)
    ids = np.arange(7, dtype=np.int32)
    values, order = evaluate(batched, keys, ids)
    assert_same(values, np.sort(keys, 1))
    assert_same(order, np.argsort(keys, 1, kind="stable").astype(np.int32))


def test_sort_errors():
    with pytest.raises(accy.AxisError, match="sort: axis 'm' is not on the keys"):
        trace([spec(f32, n=3)], lambda b, a: a[0].sort("m"))
    with pytest.raises(accy.AxisError, match="operand 1 f32\\[n=4\\] must have the keys' axes"):
        trace(
            [spec(f32, n=3), spec(f32, n=4)],
            lambda b, a: b.emit("sort", list(a), {"axis": "n", "descending": False}),
        )
    with pytest.raises(accy.TypeRuleError, match="descending must be true or false"):
        trace(
            [spec(f32, n=3)],
            lambda b, a: b.emit("sort", list(a), {"axis": "n", "descending": 1}),
        )
    with pytest.raises(accy.TypeRuleError, match="at least one operand"):
        trace([], lambda b, a: b.emit("sort", [], {"axis": "n", "descending": False}))
    with pytest.raises(accy.AxisError, match="sort: axis 'd' is not on the operand f32"):
        trace([spec(f32, n=3), spec(f32, n=3, d=2)], lambda b, a: b.sort([a[1], a[0]], "n"))
