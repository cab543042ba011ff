"""The record every optimizer is made of, and the tree arithmetic the transformations share.

A `GradientTransformation` is a pair of pure functions, as optax's: `init(params) -> state`
and `update(updates, state, params=None) -> (updates, state)`. The state is a tree (named
tuples) of NamedArrays (traced values inside `accy.jit`) whose step counts are i32 scalars, so
a whole training step, optimizer included, is one jitted program.

>>> import accy, numpy as np
>>> params = {"w": accy.named(np.array([1.0, 2.0], np.float32), ("lane",), device="reference")}
>>> opt = accy.optim.chain(accy.optim.scale(-0.5))
>>> state = opt.init(params)
>>> updates, state = opt.update({"w": params["w"] * 1.0}, state, params)
>>> accy.optim.apply_updates(params, updates)["w"].array.tolist()
[0.5, 1.0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import optree

from ..core.types import DTYPES, DType, dtype_of_numpy, f32, i32
from ..errors import AccyError
from ..frontend.named import NamedArray, named
from ..frontend.tracing import NAMESPACE, flatten, unflatten

I32_MAX = 2**31 - 1


class GradientTransformation(NamedTuple):
    """An optimizer or one step of one: `init(params) -> state` and
    `update(updates, state, params=None, **extra) -> (updates, state)` over trees."""

    init: Callable[[Any], Any]
    update: Callable[..., tuple[Any, Any]]


class EmptyState(NamedTuple):
    """The state of a transformation that keeps none."""


def init_empty_state(params: Any) -> EmptyState:
    """`EmptyState()`, whatever `params` is.

    >>> init_empty_state({"w": 1.0})
    EmptyState()
    """
    del params
    return EmptyState()


def identity() -> GradientTransformation:
    """The transformation that passes updates through unchanged (optax.identity).

    >>> identity().update([1.0], EmptyState())
    ([1.0], EmptyState())
    """

    def update(updates, state, params=None, **extra):
        return updates, state

    return GradientTransformation(init_empty_state, update)


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """The transformations applied one after the other; the state is the tuple of theirs.

    >>> opt = chain(identity(), identity())
    >>> opt.init([1.0])
    (EmptyState(), EmptyState())
    """
    for i, t in enumerate(transforms):
        if not isinstance(t, GradientTransformation):
            raise AccyError(
                f"chain: argument {i} is {type(t).__name__}, not a GradientTransformation "
                "(an accy.optim transformation such as accy.optim.scale(0.1))"
            )

    def init(params):
        return tuple(t.init(params) for t in transforms)

    def update(updates, state, params=None, **extra):
        if not isinstance(state, tuple) or len(state) != len(transforms):
            raise AccyError(
                f"chain.update: the state is not the tuple of {len(transforms)} states that "
                "this chain's init returns"
            )
        new_state = []
        for t, s in zip(transforms, state, strict=True):
            updates, s = t.update(updates, s, params, **extra)
            new_state.append(s)
        return updates, tuple(new_state)

    return GradientTransformation(init, update)


def apply_updates(params: Any, updates: Any) -> Any:
    """`params + updates` leaf by leaf, each result in its parameter's dtype (optax's
    apply_updates); None updates leave their parameter unchanged.

    >>> import accy, numpy as np
    >>> p = [accy.named(np.array([1.0]), ("a",), device="reference")]
    >>> apply_updates(p, [p[0] * 0.5])[0].array.tolist()
    [1.5]
    """
    return tree_map(
        lambda p, u: p if u is None else p + u.convert(p.dtype),
        params,
        updates,
        where="apply_updates",
        none_is_leaf=True,
    )


# -- trees -------------------------------------------------------------------------------------


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of `tree` (the front end's tree rules: None is an empty node)."""
    return flatten(tree)[0]


def tree_map(
    fn: Callable,
    tree: Any,
    *rest: Any,
    where: str = "accy.optim",
    none_is_leaf: bool = False,
) -> Any:
    """`fn` over the leaves of `tree` and of `rest` (trees of the same structure)."""
    if none_is_leaf:
        leaves, treedef = optree.tree_flatten(tree, none_is_leaf=True, namespace=NAMESPACE)
        others = [_leaves_like(treedef, r, where, True) for r in rest]
    else:
        leaves, treedef = flatten(tree)
        others = [_leaves_like(treedef, r, where, False) for r in rest]
    return optree.tree_unflatten(treedef, [fn(*xs) for xs in zip(leaves, *others, strict=True)])


def _leaves_like(treedef: Any, tree: Any, where: str, none_is_leaf: bool) -> list[Any]:
    if none_is_leaf:
        leaves, other = optree.tree_flatten(tree, none_is_leaf=True, namespace=NAMESPACE)
    else:
        leaves, other = flatten(tree)
    if other != treedef:
        raise AccyError(
            f"{where}: a tree has structure {other}, but the updates have {treedef}; "
            "updates, parameters and state must be trees of the same structure"
        )
    return leaves


def prefix_leaves(prefix: Any, tree: Any, where: str) -> list[Any]:
    """One entry of `prefix` (a tree prefix of `tree`, e.g. a mask) per leaf of `tree`."""
    treedef = flatten(tree)[1]
    try:
        full = optree.tree_broadcast_prefix(prefix, tree, namespace=NAMESPACE)
        return treedef.flatten_up_to(full)
    except (ValueError, TypeError) as error:
        raise AccyError(
            f"{where}: {prefix!r} is not a tree prefix of the parameters ({treedef}): {error}"
        ) from None


def first_leaf(tree: Any) -> Any:
    leaves = tree_leaves(tree)
    return leaves[0] if leaves else None


# -- arrays ------------------------------------------------------------------------------------


def is_traced(x: Any) -> bool:
    """An accy array: a NamedArray or a traced value (anything with a tensor type)."""
    return hasattr(x, "ty")


def scalar_like(like: Any, dtype: DType, value: Any) -> Any:
    """A rank-0 array of `dtype` holding `value` where `like` lives: its device, or its trace
    (a NamedArray on "cpu" when `like` is None or a Python value)."""
    if is_traced(like) and not isinstance(like, NamedArray):
        return like.builder.scalar(dtype, value)
    device = like.device if isinstance(like, NamedArray) else "cpu"
    return named(np.asarray(value, dtype.numpy), (), device=device)


def zeros_count(params: Any) -> Any:
    """A step count: an i32 zero where the parameters live."""
    return scalar_like(first_leaf(params), i32, 0)


def full_like(leaf: Any, value: float, dtype: DType | None = None) -> Any:
    """An array of `leaf`'s axes and extents (and dtype, unless given) filled with `value`."""
    dtype = leaf.dtype if dtype is None else dtype
    if is_traced(value) and not isinstance(value, NamedArray):  # a traced hyperparameter
        return leaf.builder.zeros(leaf.ty.with_dtype(dtype)) + value.convert(dtype)
    value = float(np.asarray(value.array if isinstance(value, NamedArray) else value))
    if isinstance(leaf, NamedArray):
        return named(np.full(leaf.ty.extents, value, dtype.numpy), leaf.axes, device=leaf.device)
    return leaf.builder.full(leaf.ty.with_dtype(dtype), value)


def tree_full_like(tree: Any, value: float, dtype: DType | None = None) -> Any:
    """A fresh array per leaf (never one shared, so that a step may donate the state)."""
    return tree_map(lambda leaf: full_like(leaf, value, dtype), tree)


def tree_zeros_like(tree: Any, dtype: DType | None = None) -> Any:
    return tree_full_like(tree, 0.0, dtype)


def safe_increment(count: Any) -> Any:
    """`count + 1`, saturating at the largest i32 instead of wrapping."""
    return count.builder.select(count < I32_MAX, count + 1, count)


def as_float(x: Any, dtype: DType) -> Any:
    """A hyperparameter (Python number, or a scalar array as `inject_hyperparams` passes) in
    `dtype`: Python numbers stay numbers (each operation makes them constants of its
    operand's dtype)."""
    if is_traced(x):
        return x.convert(dtype)
    if isinstance(x, np.generic | np.ndarray):
        return float(x)
    return x


def power(base: Any, exponent: Any) -> Any:
    """`base ** exponent` for a Python or array `base` and an f32 array `exponent`."""
    if is_traced(base):
        return base.convert(exponent.dtype) ** exponent
    return exponent.builder.scalar(exponent.dtype, float(base)) ** exponent


def bias_correction(moment: Any, decay: Any, count: Any) -> Any:
    """`moment / (1 - decay ** count)`, the correction computed in f32 (as optax)."""
    correction = 1.0 - power(decay, count.convert(f32))
    return moment / correction.convert(moment.dtype)


def resolve_dtype(dtype: Any, where: str) -> DType | None:
    """An accy dtype from an accy dtype, its name ("bf16"), a NumPy dtype or NumPy's name
    ("bfloat16"); None stays None."""
    if dtype is None or isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    try:
        found = dtype_of_numpy(np.dtype(dtype))
    except (TypeError, AccyError):
        found = None
    if found is None or not found.is_float:
        raise AccyError(
            f"{where}: {dtype!r} is not a floating-point dtype; give accy.f32, accy.bf16, "
            "accy.f16, accy.f64 (or their NumPy names)"
        )
    return found


def compute_in(dtype: DType) -> DType:
    """The dtype an update is computed in: f32 for the 16-bit floats (whose eps of 1e-8
    underflows to 0, so that 0 / (0 + eps) would be NaN), else `dtype` itself."""
    return f32 if dtype.name in ("f16", "bf16") else dtype


def cast(x: Any, dtype: DType | None) -> Any:
    return x if dtype is None or x is None else x.convert(dtype)


def squared_norm(x: Any) -> Any:
    """The sum of squares of all of `x`'s elements, accumulated in f32 at least."""
    wide = x.convert(compute_in(x.dtype))
    return (wide * wide).sum()


def global_norm(tree: Any) -> Any:
    """The L2 norm of all the leaves of `tree` together (optax.global_norm), in f32 at least.

    >>> import accy, numpy as np
    >>> t = [accy.named(np.array([3.0, 4.0], np.float32), ("a",), device="reference")]
    >>> float(global_norm(t))
    5.0
    """
    leaves = tree_leaves(tree)
    if not leaves:
        raise AccyError("global_norm: the tree has no arrays")
    widest = f32
    for leaf in leaves:
        if leaf.dtype.name == "f64":
            widest = leaf.dtype
    total = None
    for leaf in leaves:
        part = squared_norm(leaf).convert(widest)
        total = part if total is None else total + part
    return total.sqrt()


def needs_params(params: Any, where: str) -> None:
    if params is None:
        raise AccyError(
            f"{where}: this transformation needs the parameters: update(updates, state, params)"
        )


def leafwise(fn: Callable, outputs: int, tree: Any, *rest: Any, where: str = "accy.optim"):
    """`fn` over the leaves of `tree` and `rest` (same structure), returning `outputs` values
    per leaf; the result is `outputs` trees shaped like `tree`."""
    leaves, treedef = flatten(tree)
    others = [_leaves_like(treedef, r, where, False) for r in rest]
    results = [fn(*xs) for xs in zip(leaves, *others, strict=True)]
    return tuple(unflatten(treedef, [r[i] for r in results]) for i in range(outputs))


def zeros_shaped(like: Any, extents: dict[str, int], dtype: DType | None = None) -> Any:
    """Zeros of `like`'s dtype (or `dtype`) with the axes and extents `extents`, where `like`
    lives."""
    ty = like.ty.with_axes(tuple(extents.items()))
    dtype = like.dtype if dtype is None else dtype
    if isinstance(like, NamedArray):
        return named(np.zeros(ty.extents, dtype.numpy), ty.axes, device=like.device)
    return like.builder.zeros(ty.with_dtype(dtype))
