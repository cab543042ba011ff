"""`accy.vmap`: map a function written for one example over a named axis.

The function is traced once per signature on the arguments without the mapped axis; the
Program it gives is then batched by each kind's batching rule (`accy.transforms.batch`), not
traced again per example. So `accy.vmap(accy.grad(loss), "example")` batches the gradient
program into per-example gradients.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from ..core import Program
from ..core.builder import define
from ..errors import AxisError
from ..transforms.batch import batch
from ..transforms.simplify import simplify
from .errors import TransformError
from .functions import _name
from .named import NamedArray
from .tracing import Entry, Staged, argument_path, is_array, leaf_paths, trace, unflatten


def _mapped_leaves(
    axis: str, in_axes: Sequence[Any] | None, leaves: list[Any], treedef: Any
) -> list[bool]:
    """Which leaves are mapped: those with the axis, among the arguments `in_axes` allows."""
    ranges = treedef.children()[0].children()
    allowed = [True] * len(leaves)
    if in_axes is not None:
        if len(in_axes) != len(ranges):
            raise TransformError(
                f"accy.vmap: in_axes has {len(in_axes)} entries but the function was called "
                f"with {len(ranges)} positional arguments; give one True/False per argument"
            )
        start = 0
        for flag, child in zip(in_axes, ranges, strict=True):
            for i in range(start, start + child.num_leaves):
                allowed[i] = bool(flag)
            start += child.num_leaves
    mapped = []
    paths = None
    for i, leaf in enumerate(leaves):
        has = is_array(leaf) and leaf.ty.has(axis)
        if in_axes is not None and allowed[i] and is_array(leaf) and not has:
            paths = paths or leaf_paths(unflatten(treedef, leaves))
            raise AxisError(
                f"accy.vmap over {axis!r}: in_axes maps {argument_path(paths[i])}, but it has "
                f"no axis {axis!r}; its axes are {', '.join(leaf.ty.axes) or 'none'}"
            )
        mapped.append(bool(has and allowed[i]))
    return mapped


class Vmapped:
    """The function behind `accy.vmap(fn, axis)`."""

    def __init__(self, fn: Callable, axis: str, in_axes, out_axes: int):
        self.fn = fn
        self.axis = axis
        self.in_axes = None if in_axes is None else tuple(in_axes)
        self.out_axes = out_axes
        self.staged = Staged(self._build, static_scalars=True)
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.staged((args, kwargs))

    def _build(self, leaves: list[Any], treedef: Any) -> Entry:
        axis = self.axis
        mapped = _mapped_leaves(axis, self.in_axes, leaves, treedef)
        extents = {leaf.ty.extent(axis) for leaf, m in zip(leaves, mapped, strict=True) if m}
        if not extents:
            raise TransformError(
                f"accy.vmap over {axis!r}: no argument has an axis {axis!r} to map over"
            )
        if len(extents) > 1:
            raise AxisError(
                f"accy.vmap over {axis!r}: the mapped arguments disagree on its extent "
                f"({sorted(extents)})"
            )
        (extent,) = extents
        # Stand-ins for one example: only their types are read while tracing.
        examples = [
            NamedArray(None, leaf.ty.without([axis]), "reference") if m else leaf
            for leaf, m in zip(leaves, mapped, strict=True)
        ]
        traced = trace(self.fn, examples, treedef, _name(self.fn))
        arrays = [m for leaf, m in zip(leaves, mapped, strict=True) if is_array(leaf)]
        flags = arrays + [False] * len(traced.captured)
        batched = batch(traced.program, axis, extent, flags)
        specs = [leaf.ty for leaf in leaves if is_array(leaf)]
        specs += [c.ty for c in traced.captured]
        out_axes = self.out_axes

        def body(b, params):
            firsts = [
                b.transpose(p, (axis, *(a for a in p.ty.axes if a != axis))) if m else p
                for p, m in zip(params, flags, strict=True)
            ]
            outputs = b.call(batched, firsts)
            outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
            return [_place(b, y, axis, out_axes) for y in outputs]

        program = simplify(define(f"vmap_{traced.program.name}", specs, body))
        return Entry(program, traced.out_treedef, traced.captured, traced.foreign)

    def __repr__(self) -> str:
        return f"<accy.vmap of {self.fn!r} over {self.axis!r}>"


def _place(b: Any, y: Any, axis: str, position: int) -> Any:
    rest = [a for a in y.ty.axes if a != axis]
    if not -len(rest) - 1 <= position <= len(rest):
        raise TransformError(
            f"accy.vmap: out_axes={position} is out of range for an output with axes "
            f"{tuple(y.ty.axes)}"
        )
    position = position % (len(rest) + 1)
    return b.transpose(y, (*rest[:position], axis, *rest[position:]))


def vmap(
    fn: Callable | Program,
    axis: str,
    in_axes: Sequence[Any] | None = None,
    out_axes: int = 0,
    size: int | None = None,
) -> Any:
    """`fn` mapped over the named axis `axis`: written for one example, it then runs on
    arguments that carry `axis`, and its outputs carry it (at layout position `out_axes`).

    By default every array argument that has `axis` is mapped and the others are shared by all
    examples; `in_axes` (one True/False per positional argument) chooses explicitly. Given a
    Program, `accy.vmap(program, axis, in_axes, size=n)` returns the batched Program, whose
    mapped parameters (all, unless `in_axes` says) and outputs take `axis` first.

    >>> import accy, numpy as np
    >>> def loss(w, x):  # one example: x has only a "feature" axis
    ...     return (w * x).sum() ** 2.0
    >>> w = accy.named(np.array([1.0, 2.0], np.float32), ("feature",))
    >>> xs = accy.named(np.array([[1.0, 0.0], [0.0, 1.0]], np.float32), ("example", "feature"))
    >>> per_example = accy.vmap(accy.grad(loss), "example")(w, xs)
    >>> per_example.axes, per_example.array.tolist()  # 2 (w.x) x, for each example
    (('example', 'feature'), [[2.0, 0.0], [0.0, 4.0]])
    """
    if not isinstance(axis, str) or not axis.isidentifier():
        raise TransformError(f"accy.vmap: axis must be an axis name, got {axis!r}")
    if isinstance(fn, Program):
        if size is None:
            raise TransformError("accy.vmap of a Program needs the extent of the axis: size=")
        flags = [True] * len(fn.parameters) if in_axes is None else [bool(f) for f in in_axes]
        return simplify(batch(fn, axis, size, flags))
    if not callable(fn):
        raise TransformError(f"accy.vmap needs a function or a Program, got {fn!r}")
    return Vmapped(fn, axis, in_axes, out_axes)


__all__ = ["vmap"]
