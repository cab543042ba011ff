"""Gather with batch axes and fill mode; scatter with every combining mode, clip and drop; their
gradients (finite differences) and errors. Expected values come from NumPy (np.add.at,
np.maximum.at, np.take_along_axis, plain assignment), written out here."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.testing import check_grads

from .core_helpers import assert_same, evaluate_one, trace

f32, f64, i32, i64, u8, bool_ = accy.f32, accy.f64, accy.i32, accy.i64, accy.u8, accy.bool_
spec = accy.spec
NUMPY_AT = {"add": np.add, "multiply": np.multiply, "max": np.maximum, "min": np.minimum}


def numpy_scatter(operand, indices, updates, combine, mode):
    """Along axis 0 of `operand`; `updates[t]` goes to row indices[t]."""
    result = operand.copy()
    n = operand.shape[0]
    for t, index in enumerate(indices):
        if mode == "drop" and not 0 <= index < n:
            continue
        row = min(max(int(index), 0), n - 1)
        if combine == "set":
            result[row] = updates[t]
        else:
            result[row] = NUMPY_AT[combine](result[row], updates[t])
    return result


# gather ----------------------------------------------------------------------------------------


def test_gather_with_a_batch_axis_picks_from_each_row(rng):
    program = trace(
        [spec(f32, batch=3, vocab=5, channel=2), spec(i32, batch=3, token=4)],
        lambda b, a: a[0].gather(a[1], "vocab"),
    )
    assert program.output_types == (spec(f32, batch=3, token=4, channel=2),)
    table = rng.standard_normal((3, 5, 2)).astype(np.float32)
    ids = rng.integers(0, 5, (3, 4)).astype(np.int32)
    expected = np.take_along_axis(table, ids[:, :, None], axis=1)
    assert_same(evaluate_one(program, table, ids), expected)


def test_gather_with_two_batch_axes_in_another_order_on_the_indices(rng):
    program = trace(
        [spec(f64, a=2, vocab=4, b=3), spec(i64, b=3, k=5, a=2)],
        lambda b, a: a[0].gather(a[1], "vocab"),
    )
    assert program.output_types == (spec(f64, a=2, k=5, b=3),)
    table = rng.standard_normal((2, 4, 3))
    ids = rng.integers(-2, 6, (3, 5, 2))  # out of range on purpose: clamped per row
    clamped = np.clip(ids, 0, 3)
    expected = np.empty((2, 5, 3))
    for ia in range(2):
        for k in range(5):
            for ib in range(3):
                expected[ia, k, ib] = table[ia, clamped[ib, k, ia], ib]
    assert_same(evaluate_one(program, table, ids), expected)


@pytest.mark.parametrize(
    "dtype, fill", [(f32, np.nan), (i32, np.iinfo(np.int32).min), (u8, 255), (bool_, True)]
)
def test_gather_fill_mode_gives_jax_default_fill_outside(dtype, fill):
    program = trace(
        [spec(dtype, vocab=3), spec(i32, t=5)],
        lambda b, a: a[0].gather(a[1], "vocab", mode="fill"),
    )
    table = np.array([1, 0, 1]).astype(dtype.numpy)
    got = evaluate_one(program, table, np.array([-1, 0, 2, 3, 1], np.int32))
    expected = np.array([fill, 1, 1, fill, 0]).astype(dtype.numpy)
    assert_same(got, expected)


def test_gather_fill_value_and_batch_axes_together():
    program = trace(
        [spec(f32, r=2, vocab=3), spec(i32, r=2, t=2)],
        lambda b, a: a[0].gather(a[1], "vocab", mode="fill", fill_value=-7.0),
    )
    table = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = evaluate_one(program, table, np.array([[2, 3], [-1, 0]], np.int32))
    assert_same(got, np.array([[2.0, -7.0], [-7.0, 3.0]], np.float32))


def test_batched_gather_gradient_matches_finite_differences(rng):
    def body(b, a):
        g = a[0].gather(a[1], "vocab", mode="fill", fill_value=0.0)
        return (g * g * g).sum()

    program = trace([spec(f32, batch=2, vocab=4, c=3), spec(i32, batch=2, t=5)], body)
    ids = np.array([[0, 3, 3, 1, 9], [2, 2, -1, 0, 1]], np.int32)
    check_grads(program, [rng.standard_normal((2, 4, 3)), ids], wrt=(0,))


# scatter ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["clip", "drop"])
@pytest.mark.parametrize("combine", ["add", "multiply", "max", "min", "set"])
@pytest.mark.parametrize("dtype", [f32, i32])
def test_scatter_matches_numpy(rng, dtype, combine, mode):
    program = trace(
        [spec(dtype, vocab=4, c=3), spec(i32, t=7), spec(dtype, t=7, c=3)],
        lambda b, a: a[0].scatter(a[1], a[2], "vocab", combine=combine, mode=mode),
    )
    operand = rng.integers(-4, 5, (4, 3)).astype(dtype.numpy)
    updates = rng.integers(-4, 5, (7, 3)).astype(dtype.numpy)
    ids = np.array([1, 3, 1, -2, 7, 0, 1], np.int32)
    expected = numpy_scatter(operand, ids, updates, combine, mode)
    assert_same(evaluate_one(program, operand, ids, updates), expected)


def test_scatter_max_propagates_nan_and_min_of_bool():
    program = trace(
        [spec(f32, n=2), spec(i32, t=2), spec(f32, t=2)],
        lambda b, a: a[0].scatter(a[1], a[2], "n", combine="max"),
    )
    got = evaluate_one(
        program,
        np.zeros(2, np.float32),
        np.array([0, 0], np.int32),
        np.array([np.nan, 1.0], np.float32),
    )
    assert_same(got, np.array([np.nan, 0.0], np.float32))
    program = trace(
        [spec(bool_, n=2), spec(i32, t=3), spec(bool_, t=3)],
        lambda b, a: a[0].scatter(a[1], a[2], "n", combine="min"),
    )
    got = evaluate_one(
        program,
        np.array([True, True]),
        np.array([0, 0, 1], np.int32),
        np.array([True, False, True]),
    )
    assert_same(got, np.array([False, True]))


@pytest.mark.parametrize("combine", ["add", "multiply", "max", "min", "set"])
def test_scatter_with_a_batch_axis_and_drop(rng, combine):
    program = trace(
        [spec(f64, batch=2, vocab=3, c=2), spec(i32, batch=2, t=4), spec(f64, t=4, c=2, batch=2)],
        lambda b, a: a[0].scatter(a[1], a[2], "vocab", combine=combine, mode="drop"),
    )
    operand = rng.standard_normal((2, 3, 2))
    ids = np.array([[0, 2, 5, 2], [-1, 1, 1, 0]], np.int32)
    updates = rng.standard_normal((4, 2, 2))
    expected = np.stack(
        [numpy_scatter(operand[r], ids[r], updates[:, :, r], combine, "drop") for r in range(2)]
    )
    assert_same(evaluate_one(program, operand, ids, updates), expected, rtol=1e-12)


def test_scatter_set_last_update_wins_over_two_index_axes():
    program = trace(
        [spec(f32, n=3), spec(i32, p=2, q=2), spec(f32, p=2, q=2)],
        lambda b, a: a[0].scatter(a[1], a[2], "n", combine="set"),
    )
    got = evaluate_one(
        program,
        np.full(3, -1, np.float32),
        np.array([[2, 0], [2, 0]], np.int32),
        np.array([[1, 2], [3, 4]], np.float32),
    )
    assert_same(got, np.array([4, -1, 3], np.float32))  # as NumPy: a[[2, 0, 2, 0]] = [1, 2, 3, 4]


@pytest.mark.parametrize("combine", ["add", "multiply", "max", "min", "set"])
def test_scatter_gradients_match_finite_differences(rng, combine):
    def body(b, a):
        s = a[0].scatter(a[1], a[2], "vocab", combine=combine, mode="drop")
        return (s * s.sin()).sum()

    program = trace([spec(f32, vocab=4, c=2), spec(i32, t=5), spec(f32, t=5, c=2)], body)
    ids = np.array([1, 3, 1, 0, 6], np.int32)
    # distinct values, away from ties (max/min) and from zero (multiply)
    values = rng.permutation(np.linspace(0.3, 2.0, 18)) * rng.choice([-1, 1], 18)
    operand, updates = values[:8].reshape(4, 2), values[8:].reshape(5, 2)
    check_grads(program, [operand, ids, updates], wrt=(0, 2), order=1, atol=1e-4, rtol=1e-4)


def test_scatter_multiply_gradient_with_zero_updates(rng):
    program = trace(
        [spec(f64, n=2), spec(i32, t=4), spec(f64, t=4)],
        lambda b, a: a[0].scatter(a[1], a[2], "n", combine="multiply").sum(),
    )
    ids = np.array([0, 0, 1, 1], np.int32)
    updates = np.array([0.0, 3.0, 0.0, 0.0])  # one zero in row 0, two in row 1
    operand = np.array([2.0, 5.0])
    grads = accy.reference.run(accy.grad(program, wrt=(0, 2)), [operand, ids, updates])
    assert_same(grads[0], np.array([0.0, 0.0]))
    assert_same(grads[1], np.array([6.0, 0.0, 0.0, 0.0]))  # d/du0 = 2 * 3; the others 0


def test_scatter_max_ties_share_the_gradient_as_jax():
    program = trace(
        [spec(f64, n=2), spec(i32, t=3), spec(f64, t=3)],
        lambda b, a: a[0].scatter(a[1], a[2], "n", combine="max").sum(),
    )
    operand, ids, updates = np.array([1.0, 0.0]), np.array([0, 0, 1], np.int32), np.ones(3)
    grads = accy.reference.run(accy.grad(program, wrt=(0, 2)), [operand, ids, updates])
    # row 0: the operand and two updates tie at 1 (a third each); row 1: the update wins
    assert_same(grads[0], np.array([1 / 3, 0.0]), atol=1e-15)
    assert_same(grads[1], np.array([1 / 3, 1 / 3, 1.0]), atol=1e-15)


def test_scatter_kind_batches_under_vmap(rng):
    def per_example(b, a):
        return a[0].scatter(a[1], a[2], "vocab", combine="max")

    program = trace([spec(f32, vocab=3), spec(i32, t=4), spec(f32, t=4)], per_example)
    batched = accy.vmap(program, "example", size=2)
    operand = rng.standard_normal((2, 3)).astype(np.float32)
    ids = np.array([[0, 2, 2, 1], [1, 1, 0, 0]], np.int32)
    updates = rng.standard_normal((2, 4)).astype(np.float32)
    expected = np.stack(
        [numpy_scatter(operand[r], ids[r], updates[r], "max", "clip") for r in range(2)]
    )
    assert_same(evaluate_one(batched, operand, ids, updates), expected)


# errors ----------------------------------------------------------------------------------------


def test_gather_and_scatter_errors():
    table, ids = spec(f32, v=3, c=2), spec(i32, t=2)
    with pytest.raises(accy.TypeRuleError, match="gather: mode 'wrap' is not one of clip, fill"):
        trace([table, ids], lambda b, a: a[0].gather(a[1], "v", mode="wrap"))
    with pytest.raises(accy.AxisError, match="batch axis 'c' has extent 3 on the indices"):
        trace([table, spec(i32, c=3)], lambda b, a: a[0].gather(a[1], "v"))
    updates = spec(f32, t=2, c=2)
    with pytest.raises(accy.TypeRuleError, match="combine 'sub' is not one of add, multiply"):
        trace([table, ids, updates], lambda b, a: a[0].scatter(a[1], a[2], "v", combine="sub"))
    with pytest.raises(accy.TypeRuleError, match="scatter: mode 'fill' is not one of clip, drop"):
        trace([table, ids, updates], lambda b, a: a[0].scatter(a[1], a[2], "v", mode="fill"))
    with pytest.raises(accy.AxisError, match=r"updates must have the axes \['t', 'c'\]"):
        trace([table, ids, spec(f32, t=2)], lambda b, a: a[0].scatter(a[1], a[2], "v"))
    with pytest.raises(accy.DTypeError, match="indices must be i32 or i64, got f32"):
        trace([table, spec(f32, t=2), updates], lambda b, a: a[0].scatter(a[1], a[2], "v"))
    with pytest.raises(accy.DTypeError, match="combine 'mul' needs a numeric operand"):
        trace(
            [spec(bool_, v=3), spec(i32, t=2), spec(bool_, t=2)],
            lambda b, a: a[0].scatter(a[1], a[2], "v", combine="multiply"),
        )


def test_the_scatter_kind_rejects_an_unknown_combine():
    def body(b, a):
        return b.emit("scatter", list(a), {"axis": "v", "combine": "add"})

    with pytest.raises(accy.TypeRuleError, match="adding is the kind scatter_add"):
        trace([spec(f32, v=3), spec(i32, t=2), spec(f32, t=2)], body)
