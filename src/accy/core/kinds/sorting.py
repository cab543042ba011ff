"""`sort`: a stable sort along one named axis, by the first operand, carrying the others.

`sort(keys, x, y...) {axis=n, descending=false}` has one result per operand, each permuted
along `n` as the keys' stable sort permutes them: equal keys keep their order, NaN sorts after
every number (before every number when `descending`, as the largest), -0.0 equals 0.0. Every
operand has the keys' axes and extents (dtypes may differ). A kind rather than a composition:
by ranks it is O(n^2) work per row; the backends run a merge sort (CPU) or a bitonic sort of
(key, position) pairs in shared memory (CUDA, rows up to `CUDA_MAX_ROW`).

Derivative: each result's tangent is its operand's tangent gathered by the permutation, which
the JVP rule gets from a second sort carrying positions (an iota); its transpose is the
scatter_add of gather. Keys' own derivative follows the same permutation.
"""

from __future__ import annotations

import numpy as np

from ...errors import AxisError, TypeRuleError
from ..types import i32, i64
from .registry import Rule, Zero, attr, batched_operand, check_has_axes, register

CUDA_MAX_ROW = 4096
"""The longest row the CUDA backend sorts (a bitonic sort in one block's shared memory)."""


def _infer(types, attrs):
    if not types:
        raise TypeRuleError("sort takes at least one operand (the keys), got none")
    keys = types[0]
    axis = attr("sort", attrs, "axis")
    check_has_axes("sort", keys, [axis], role="keys")
    if not isinstance(attr("sort", attrs, "descending"), bool):
        raise TypeRuleError(f"sort: descending must be true or false, got {attrs['descending']!r}")
    for position, t in enumerate(types[1:], 1):
        if t.named_extents != keys.named_extents:
            raise AxisError(
                f"sort: operand {position} {t} must have the keys' axes and extents in their "
                f"order ({keys}); transpose or broadcast it first"
            )
    return tuple(types)


def stable_order(keys: np.ndarray, position: int, descending: bool) -> np.ndarray:
    """The stable sorting permutation of `keys` along axis `position` (NaN last, or first when
    descending).

    >>> stable_order(np.array([2.0, np.nan, 1.0, 2.0]), 0, True).tolist()
    [1, 0, 3, 2]
    """
    keys = np.moveaxis(keys, position, -1)
    if not descending:
        order = np.argsort(keys, axis=-1, kind="stable")
    else:
        # lexsort is stable; its last key is the primary one: NaN first, then larger first.
        nan = np.isnan(keys) if keys.dtype.kind == "f" else np.zeros(keys.shape, bool)
        with np.errstate(invalid="ignore"):
            reverse = -keys if keys.dtype.kind == "f" else ~keys
        order = np.lexsort((reverse, ~nan), axis=-1)
    return np.moveaxis(order, -1, position)


def _evaluate(attrs, args, ev):
    position = ev.operand_types[0].position(attrs["axis"])
    order = stable_order(args[0], position, attrs["descending"])
    return tuple(np.take_along_axis(np.asarray(a), order, axis=position) for a in args)


def permutation(e, op, primals):
    """The i32 (i64 for long rows) positions that the sort `op` moves to each place."""
    keys = primals[0]
    axis = op.attrs["axis"]
    dtype = i32 if keys.ty.extent(axis) < 2**31 else i64
    positions = e.iota(keys.ty.with_dtype(dtype), axis)
    return e.emit("sort", [keys, positions], op.attrs)[1]


def _jvp(e, op, primals, tangents, outputs):
    order = permutation(e, op, primals)
    return tuple(
        Zero(t) if isinstance(tangent, Zero) else e.gather(tangent, order, op.attrs["axis"])
        for tangent, t in zip(tangents, op.result_types, strict=True)
    )


def _batch(e, op, operands, batched, ctx):
    """Every operand batched (the batch axis first on each, so their axes still agree)."""
    aligned = [batched_operand(e, x, b, ctx) for x, b in zip(operands, batched, strict=True)]
    return tuple(e.emit("sort", aligned, op.attrs))


register(Rule("sort", _infer, _evaluate, _jvp, multiple_results=True, batch=_batch))
