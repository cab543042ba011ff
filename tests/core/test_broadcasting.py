"""Elementwise operations broadcast by axis name: the result has the union of the operands'
axes, the left operand's first (in its order), then the new ones in order of appearance; the IR
records every broadcast as `broadcast_in_dim` (and every reordering as `transpose`)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accy

from .core_helpers import assert_same, evaluate_one, random_array, trace

EXTENTS = {"a": 2, "b": 3, "c": 1, "d": 4}
named_shapes = st.lists(st.sampled_from(sorted(EXTENTS)), unique=True, max_size=4).map(
    lambda axes: accy.spec(accy.f64, {axis: EXTENTS[axis] for axis in axes})
)


@settings(max_examples=60, deadline=None)
@given(left=named_shapes, right=named_shapes)
def test_product_has_the_union_of_axes_left_first_and_the_einsum_values(left, right):
    program = trace([left, right], lambda b, a: a[0] * a[1])
    union = list(left.axes) + [axis for axis in right.axes if axis not in left.axes]
    assert program.output_types == (accy.spec(accy.f64, {axis: EXTENTS[axis] for axis in union}),)

    # At the IR level the mul's operands have exactly the result's type.
    (mul,) = [op for op in program.operations if op.kind == "mul"]
    assert mul.operand_types == (mul.type, mul.type)
    expected_kinds = {"parameter", "mul"}
    if set(right.axes) - set(left.axes) or set(left.axes) - set(right.axes):
        expected_kinds.add("broadcast_in_dim")
    assert (
        expected_kinds
        <= {op.kind for op in program.operations}
        <= expected_kinds
        | {
            "broadcast_in_dim",
            "transpose",
        }
    )

    rng = np.random.default_rng(len(union))
    x, y = random_array(rng, left), random_array(rng, right)
    subscripts = f"{''.join(left.axes)},{''.join(right.axes)}->{''.join(union)}"
    assert_same(evaluate_one(program, x, y), np.einsum(subscripts, x, y), rtol=1e-15)


def test_same_axes_in_another_order_are_transposed_not_broadcast():
    program = trace(
        [accy.spec(accy.f32, a=2, b=3), accy.spec(accy.f32, b=3, a=2)], lambda b, a: a[0] - a[1]
    )
    assert program.count("transpose") == 1 and program.count("broadcast_in_dim") == 0
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.ones((3, 2), np.float32)
    assert_same(evaluate_one(program, x, y), x - y.T)


def test_python_scalar_on_either_side_broadcasts_to_the_tensor():
    t = accy.spec(accy.i32, a=3)
    program = trace([t], lambda b, a: (10 - a[0], a[0] - 10, 2 * a[0], a[0] / 2))
    x = np.array([-7, 0, 9], np.int32)
    outputs = accy.reference.run(program, [x])
    expected = [10 - x, x - 10, 2 * x, np.array([-3, 0, 4], np.int32)]
    for got, want in zip(outputs, expected, strict=True):
        assert_same(got, want.astype(np.int32))
    assert program.count("broadcast_in_dim") == 4


def test_a_scalar_operand_is_broadcast_to_the_other_operands_axes():
    program = trace([accy.spec(accy.f32), accy.spec(accy.f32, lane=3)], lambda b, a: a[0] * a[1])
    assert program.output_types == (accy.spec(accy.f32, lane=3),)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    assert_same(evaluate_one(program, np.float32(2), x), 2 * x)


def test_broadcast_to_takes_a_type_an_array_or_a_mapping_of_extents():
    x = accy.named(np.array([1.0, 2.0], np.float32), "a")
    like = accy.named(np.zeros((3, 2), np.float32), ("b", "a"))
    expected = np.broadcast_to(np.array([1.0, 2.0], np.float32), (3, 2))
    for target in (like, like.ty, like.shape, {"b": 3, "a": np.int64(2)}):
        got = x.broadcast_to(target)
        assert got.axes == ("b", "a")
        np.testing.assert_array_equal(got.array, expected)
    with pytest.raises(accy.AxisError, match="mapping of axis names to integer extents"):
        x.broadcast_to({"b": 3.5, "a": 2})
    with pytest.raises(accy.AxisError, match="got list"):
        x.broadcast_to([3, 2])
