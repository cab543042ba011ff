"""Trees nested deeper than optree can flatten, given to or returned by a transform: a
TreeTooDeep error that says how deep a tree may be, never a RecursionError; a tree just within
the limit works."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.frontend.errors import TreeTooDeep
from accy.frontend.tracing import TREE_DEPTH_LIMIT

R = "reference"
X = accy.named(np.array([1.0, 2.0], np.float32), ("lane",), device=R)


def nested(depth: int, leaf=X) -> list:
    tree = leaf
    for _ in range(depth):
        tree = [tree]
    return tree


def innermost(tree):
    while isinstance(tree, list):
        tree = tree[0]
    return tree


TRANSFORMS = {
    "jit": lambda tree: accy.jit(lambda t: innermost(t) * 2.0)(tree),
    "grad": lambda tree: accy.grad(lambda t: innermost(t).sum())(tree),
    "value_and_grad": lambda tree: accy.value_and_grad(lambda t: innermost(t).sum())(tree),
    "vmap": lambda tree: accy.vmap(lambda t: innermost(t) * 2.0, "lane")(tree),
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_an_argument_tree_too_deep_is_a_tree_too_deep_error(transform):
    with pytest.raises(TreeTooDeep, match=f"at most {TREE_DEPTH_LIMIT - 2} levels deep"):
        TRANSFORMS[transform](nested(TREE_DEPTH_LIMIT + 200))


def test_a_python_scalar_leaf_deep_down_a_gradient_argument_too():
    with pytest.raises(TreeTooDeep, match="nested deeper than"):
        accy.grad(lambda t: innermost(t) * 1.0)(nested(TREE_DEPTH_LIMIT + 5, 1.0))


def test_a_result_tree_too_deep_is_a_tree_too_deep_error():
    with pytest.raises(TreeTooDeep, match="nested deeper than"):
        accy.jit(lambda x: nested(TREE_DEPTH_LIMIT + 5, x))(X)


def test_a_tree_within_the_limit_works():
    depth = TREE_DEPTH_LIMIT - 2
    np.testing.assert_array_equal(TRANSFORMS["jit"](nested(depth)).array, [2.0, 4.0])
    gradient = TRANSFORMS["grad"](nested(depth))
    np.testing.assert_array_equal(innermost(gradient).array, [1.0, 1.0])
