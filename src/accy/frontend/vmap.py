"""`accy.vmap`: map a function written for one example over a named axis.

The function is traced once per signature on the arguments without the mapped axis; the
Program it gives is then batched by each kind's batching rule (`accy.transforms.batch`), not
traced again per example. So `accy.vmap(accy.grad(loss), "example")` batches the gradient
program into per-example gradients.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import optree

from ..backends.devices import REFERENCE
from ..core import Program
from ..errors import AxisError
from ..trace import define
from ..transforms.batch import batch
from ..transforms.simplify import simplify
from .errors import TransformError
from .functions import _name
from .named import NamedArray, index_by_name
from .tracing import (
    NAMESPACE,
    PRINTED,
    Entry,
    Staged,
    argument_path,
    is_array,
    leaf_paths,
    trace,
    unflatten,
)


class _NotMapped:
    """Stands for None in `in_axes`/`out_axes` while they are broadcast against a tree (where
    optree treats None as an empty node, not a leaf)."""

    def __repr__(self) -> str:
        return "None"


NOT_MAPPED = _NotMapped()
BY_AXIS = object()  # mapped if it has the axis: keyword arguments, and every leaf by default


def _spec_leaves(transform_part: str, prefix: Any, tree: Any, what: str) -> list[Any]:
    """The entry of the tree prefix `prefix` that applies to each leaf of `tree` (None
    entries as NOT_MAPPED)."""
    prefix = optree.tree_map(
        lambda e: NOT_MAPPED if e is None else e, prefix, none_is_leaf=True, namespace=NAMESPACE
    )
    try:
        return optree.broadcast_prefix(prefix, tree, namespace=NAMESPACE)
    except ValueError as error:
        # optree's message ends with the whole container's repr ("; dict: {...}"): too long
        reason = re.sub(r";\s*[A-Za-z_.]+:\s.*$", "", str(error), flags=re.S)
        raise TransformError(
            f"accy.vmap: {transform_part} must be a tree prefix of {what} (the same containers "
            f"down to where one entry stands for a whole subtree), but it is not: {reason}"
        ) from None


def _source_axis(axis: str, entry: Any, leaf: Any, where: str) -> str | None:
    """The axis `leaf` is mapped along according to its `in_axes` entry (None: not mapped)."""
    if entry is NOT_MAPPED or entry is False:
        return None
    if entry is True:
        return axis
    if isinstance(entry, str) and entry.isidentifier():
        return entry
    if isinstance(entry, int):  # a layout position, as JAX's in_axes=0
        if not -leaf.ty.rank <= entry < leaf.ty.rank:
            raise AxisError(
                f"accy.vmap over {axis!r}: in_axes maps {where} along its axis at position "
                f"{entry}, but it has {leaf.ty.rank} ({', '.join(leaf.ty.axes) or 'none'})"
            )
        return leaf.ty.axes[entry]
    raise TransformError(
        f"accy.vmap over {axis!r}: the in_axes entry for {where} is {entry!r}; each entry is "
        "True or an axis name (mapped along that axis of the argument), an int (mapped along "
        "the axis at that layout position), or None or False (not mapped)"
    )


def _in_axes_entries(axis: str, in_axes: Any, leaves: list[Any], treedef: Any) -> list[Any] | None:
    """One in_axes entry per leaf of `(args, kwargs)`: BY_AXIS for keyword arguments, and for
    every leaf when in_axes is None (the default)."""
    if in_axes is None:
        return [BY_AXIS] * len(leaves)
    args, _ = unflatten(treedef, leaves)
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    if not isinstance(in_axes, tuple):
        if not isinstance(in_axes, bool | int | str):
            raise TransformError(
                f"accy.vmap: in_axes={in_axes!r}; give one entry per positional argument in a "
                "tuple (each a tree prefix of its argument: in_axes=({'w': None, 'x': True},) "
                "for one dict argument), or one entry for all of them (True, None, an axis "
                "name, a layout position)"
            )
        in_axes = (in_axes,) * len(args)
    if len(in_axes) != len(args):
        raise TransformError(
            f"accy.vmap: in_axes has {len(in_axes)} entries but the function was called with "
            f"{len(args)} positional argument{'s' if len(args) != 1 else ''}; give one entry "
            "(a tree prefix of the argument) per positional argument"
        )
    entries: list[Any] = []
    for number, (entry, arg) in enumerate(zip(in_axes, args, strict=True)):
        entries += _spec_leaves(f"in_axes[{number}]", entry, arg, f"argument {number}")
    return entries + [BY_AXIS] * (len(leaves) - len(entries))  # keyword arguments


def _mapped_leaves(axis: str, in_axes: Any, leaves: list[Any], treedef: Any) -> list[str | None]:
    """For each leaf, the axis it is mapped along (None: shared by all examples). By default
    the leaves that have `axis`; else as `in_axes` says, each mapped leaf checked to have its
    axis."""
    entries = _in_axes_entries(axis, in_axes, leaves, treedef)
    paths = None
    sources: list[str | None] = []
    for i, leaf in enumerate(leaves):
        if not is_array(leaf):
            sources.append(None)
            continue
        if entries[i] is BY_AXIS:
            sources.append(axis if leaf.ty.has(axis) else None)
            continue
        paths = paths or leaf_paths(unflatten(treedef, leaves))
        where = argument_path(paths[i])
        source = _source_axis(axis, entries[i], leaf, where)
        if source is not None and not leaf.ty.has(source):
            raise AxisError(
                f"accy.vmap over {axis!r}: in_axes maps {where} along {source!r}, but it has no "
                f"axis {source!r}; its axes are {', '.join(leaf.ty.axes) or 'none'}"
            )
        if source is not None and source != axis and leaf.ty.has(axis):
            raise AxisError(
                f"accy.vmap over {axis!r}: in_axes maps {where} along {source!r}, but it also "
                f"has an axis {axis!r}, which the mapped axis would be renamed to"
            )
        sources.append(source)
    return sources


def _extents_by_argument(leaves: list[Any], treedef: Any, sources: list[str | None]) -> str:
    """Each mapped leaf's path, mapped axis and type, for an error about their extents."""
    paths = leaf_paths(unflatten(treedef, leaves))
    return ", ".join(
        f"{argument_path(path)} along {source!r} of {leaf.ty}"
        for path, leaf, source in zip(paths, leaves, sources, strict=True)
        if source is not None
    )


def _depends_on(program: Program, flags: Sequence[bool]) -> list[bool]:
    """For each output of `program`: whether it depends on a parameter that `flags` marks.
    Through control flow, as JAX's batching tracks it: a loop's carry that the body hands back
    unchanged depends only on its initial value, and a cond's output that every branch
    forwards from one operand only on that operand (so `out_axes=None` can name them)."""
    marked: set[int] = set()
    for op in program.operations:
        if op.kind == "parameter":
            if flags[op.attrs["index"]]:
                marked.update(op.results)
            continue
        operands = [v in marked for v in op.operands]
        if any(operands):
            depends = _results_depend_on(op, operands)
            marked.update(r for r, d in zip(op.results, depends, strict=True) if d)
    return [v in marked for v in program.outputs]


def _results_depend_on(op: Any, flags: list[bool]) -> list[bool]:
    """Which results of a control-flow `op` depend on its operands that `flags` marks (every
    result, for other kinds)."""
    attrs = op.attrs
    if op.kind == "cond":
        branches = [attrs["true_body"], attrs["false_body"]]
        depends = [_depends_on(b, flags[1:]) for b in branches]
        forwarded = [_forwarded(b) for b in branches]
        return [
            depends[0][j]
            or depends[1][j]
            or (flags[0] and (forwarded[0][j] is None or forwarded[0][j] != forwarded[1][j]))
            for j in range(len(op.results))
        ]
    if op.kind in ("while_loop", "scan"):
        consts = attrs["num_consts"]
        count = attrs.get("num_carry", len(op.results)) if op.kind == "scan" else len(op.results)
        body = attrs["body"]
        carried = flags[consts : consts + count]
        while True:  # a carry depends on what the body computes it from, at any step
            depends = _depends_on(body, [*flags[:consts], *carried, *flags[consts + count :]])
            grown = [c or d for c, d in zip(carried, depends[:count], strict=True)]
            if grown == carried:
                break
            carried = grown
        if op.kind == "scan":
            return carried + depends[count:]
        if _depends_on(attrs["cond_body"], [*flags[:consts], *carried])[0]:
            # the number of steps differs per example: so does every carry the body changes
            forwarded = _forwarded(body)
            carried = [c or forwarded[j] != consts + j for j, c in enumerate(carried)]
        return carried
    return [True] * len(op.results)


def _forwarded(program: Program) -> list[int | None]:
    """For each output of `program`: the parameter it returns unchanged (through loops that
    hand a carry back unchanged and conds whose branches all forward it), or None."""
    source: dict[int, int] = {}
    for op in program.operations:
        if op.kind == "parameter":
            source[op.results[0]] = op.attrs["index"]
        elif op.kind in ("while_loop", "scan"):
            consts = op.attrs["num_consts"]
            count = op.attrs.get("num_carry", len(op.results))
            body = _forwarded(op.attrs["body"])
            for j in range(count):
                operand = op.operands[consts + j]
                if body[j] == consts + j and operand in source:
                    source[op.results[j]] = source[operand]
        elif op.kind == "cond":
            on_true, on_false = (
                _forwarded(op.attrs["true_body"]),
                _forwarded(op.attrs["false_body"]),
            )
            for j, (t, f) in enumerate(zip(on_true, on_false, strict=True)):
                if t is not None and t == f and op.operands[1 + t] in source:
                    source[op.results[j]] = source[op.operands[1 + t]]
    return [source.get(v) for v in program.outputs]


class Vmapped:
    """The function behind `accy.vmap(fn, axis)`."""

    def __init__(
        self, fn: Callable, axis: str, in_axes: Any, out_axes: Any, size: int | None = None
    ):
        self.fn = fn
        self.axis = axis
        self.size = size
        self.in_axes = in_axes
        self.out_axes = out_axes
        self.staged = Staged(self._build, static_scalars=True)
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.staged((args, kwargs))

    def _build(self, leaves: list[Any], treedef: Any) -> Entry:
        axis = self.axis
        sources = _mapped_leaves(axis, self.in_axes, leaves, treedef)
        extents = {
            leaf.ty.extent(source)
            for leaf, source in zip(leaves, sources, strict=True)
            if source is not None
        }
        if self.size is not None:
            extents.add(self.size)
        if not extents:
            raise TransformError(
                f"accy.vmap over {axis!r}: no argument has an axis {axis!r} to map over"
                + ("" if self.in_axes is None else " (in_axes maps none)")
                + "; give its extent as size= to map a function of unmapped arguments"
            )
        if len(extents) > 1:
            raise AxisError(
                f"accy.vmap over {axis!r}: the mapped arguments (and size=) disagree on its "
                f"extent ({sorted(extents)}): {_extents_by_argument(leaves, treedef, sources)}"
                + ("" if self.size is None else f"; size={self.size}")
            )
        (extent,) = extents
        # Stand-ins for one example: only their types are read while tracing.
        examples = [
            NamedArray(None, leaf.ty.without([source]), REFERENCE) if source else leaf
            for leaf, source in zip(leaves, sources, strict=True)
        ]
        traced = trace(self.fn, examples, treedef, _name(self.fn), prints=True)
        arrays = [source for leaf, source in zip(leaves, sources, strict=True) if is_array(leaf)]
        flags = [source is not None for source in arrays] + [False] * len(traced.captured)
        batched = batch(traced.program, axis, extent, flags)
        own = traced.out_treedef.num_leaves  # then the values of its debug_print calls
        depends = _depends_on(traced.program, flags)
        positions = self._output_positions(traced, depends[:own])
        # a print of values that differ per example prints once per example (JAX unrolls it
        # over the axis); one of shared values prints once
        copies = [
            extent if mapped else min(extent, 1)
            for mapped in _printed_mapped(traced.prints, depends[own:])
        ]
        specs = [leaf.ty for leaf in leaves if is_array(leaf)]
        specs += [c.ty for c in traced.captured]
        sources_all = arrays + [None] * len(traced.captured)

        def body(b, params):
            firsts = [
                p if source is None else _mapped_first(b, p, source, axis)
                for p, source in zip(params, sources_all, strict=True)
            ]
            outputs = b.call(batched, firsts)
            outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
            placed = [
                _place(b, y, axis, position)
                for y, position in zip(outputs[:own], positions, strict=True)
            ]
            return placed + _printed_per_example(b, traced.prints, outputs[own:], axis, copies)

        program = simplify(define(f"vmap_{traced.program.name}", specs, body))
        entry = Entry(program, traced.out_treedef, traced.captured, traced.foreign)
        entry.prints = [p for p, n in zip(traced.prints, copies, strict=True) for _ in range(n)]
        return entry

    def _output_positions(self, traced: Any, mapped: list[bool]) -> list[int | None]:
        """The layout position of the mapped axis in each output (None: not mapped, which only
        an output that depends on no mapped argument may be)."""
        numbered = unflatten(traced.out_treedef, list(range(len(mapped))))
        entries = _spec_leaves("out_axes", self.out_axes, numbered, "the function's output")
        paths = leaf_paths(numbered)
        positions: list[int | None] = []
        for entry, is_mapped, path in zip(entries, mapped, paths, strict=True):
            if entry is NOT_MAPPED:
                if is_mapped:
                    raise TransformError(
                        f"accy.vmap over {self.axis!r}: out_axes is None for the output{path}, "
                        "but it depends on the mapped arguments, so it differs per example; "
                        "give it a position (an int) instead"
                    )
                positions.append(None)
            elif isinstance(entry, int) and not isinstance(entry, bool):
                positions.append(entry)
            else:
                raise TransformError(
                    f"accy.vmap: the out_axes entry for the output{path} is {entry!r}; each "
                    "entry is an int (where the mapped axis goes in the output's layout) or "
                    "None (the output is not mapped)"
                )
        return positions

    def __repr__(self) -> str:
        return f"<accy.vmap of {self.fn!r} over {self.axis!r}>"


def _printed_mapped(prints: list[Any], depends: list[bool]) -> list[bool]:
    """For each debug_print call: whether a value it prints depends on the mapped arguments
    (`depends`: for each printed value, in order)."""
    mapped, start = [], 0
    for _, _, template in prints:
        count = sum(leaf is PRINTED for leaf in template)
        mapped.append(any(depends[start : start + count]))
        start += count
    return mapped


def _printed_per_example(
    b: Any, prints: list[Any], values: list[Any], axis: str, copies: list[int]
) -> list[Any]:
    """The batched values of debug_print calls (`values`, each print's in turn), as one
    example's values after another for each print: the outputs its `copies` read."""
    per_example: list[Any] = []
    start = 0
    for (_, _, template), count_of_copies in zip(prints, copies, strict=True):
        count = sum(leaf is PRINTED for leaf in template)
        mine = values[start : start + count]
        start += count
        for i in range(count_of_copies):
            per_example += [index_by_name(b, y, (axis, i)) for y in mine]
    return per_example


def _mapped_first(b: Any, p: Any, source: str, axis: str) -> Any:
    """Parameter `p` with its mapped axis `source` first, and named `axis`."""
    p = b.transpose(p, (source, *(a for a in p.ty.axes if a != source)))
    return p if source == axis else p.rename(source, axis)


def _place(b: Any, y: Any, axis: str, position: int | None) -> Any:
    if position is None:  # not mapped: every example computed the same value
        return index_by_name(b, y, (axis, 0))
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
    in_axes: Any = None,
    out_axes: Any = 0,
    size: int | None = None,
) -> Any:
    """`fn` mapped over the named axis `axis`: written for one example, it then runs on
    arguments that carry `axis`, and its outputs carry it (at layout position `out_axes`).

    By default every array leaf that has `axis` is mapped and the others are shared by all
    examples. `in_axes` chooses explicitly, as JAX's: a tuple with one entry per positional
    argument (or one entry for all), each a tree prefix of its argument whose leaves are True
    (mapped along `axis`), another axis name or an int layout position (mapped along that
    axis, which becomes `axis` in the outputs) or None/False (not mapped); keyword arguments
    are mapped where they have `axis`. `out_axes` is a tree prefix of the output with an int
    (the layout position of `axis`) or None (an output that depends on no mapped argument,
    returned without the axis) per leaf. `size` is the extent of `axis` (JAX's `axis_size`),
    needed only when no argument carries it: the outputs are then repeated along it. Given a
    Program, `accy.vmap(program, axis, in_axes,
    size=n)` returns the batched Program, whose mapped parameters (all, unless `in_axes`, one
    flag per parameter, says) and outputs take `axis` first. Given a tuple of axis names,
    `fn` is mapped over each (the first outermost), and the outputs carry them first in that
    order.

    >>> import accy, numpy as np
    >>> def loss(w, x):  # one example: x has only a "feature" axis
    ...     return (w * x).sum() ** 2.0
    >>> w = accy.named(np.array([1.0, 2.0], np.float32), ("feature",))
    >>> xs = accy.named(np.array([[1.0, 0.0], [0.0, 1.0]], np.float32), ("example", "feature"))
    >>> per_example = accy.vmap(accy.grad(loss), "example")(w, xs)
    >>> per_example.axes, per_example.array.tolist()  # 2 (w.x) x, for each example
    (('example', 'feature'), [[2.0, 0.0], [0.0, 4.0]])
    >>> data = {"x": xs, "scale": accy.named(np.float32(2.0), ())}
    >>> scaled = lambda w, d: (w * d["x"]).sum() * d["scale"]  # noqa: E731
    >>> in_axes = (None, {"x": True, "scale": None})  # a tree prefix per argument, as JAX's
    >>> accy.vmap(scaled, "example", in_axes=in_axes)(w, data).array.tolist()
    [2.0, 4.0]
    >>> grid = accy.named(np.arange(6.0, dtype=np.float32).reshape(2, 3), ("row", "col"))
    >>> accy.vmap(lambda v: v * 10.0 + 1.0, ("col", "row"))(grid).axes
    ('col', 'row')
    """
    if isinstance(axis, tuple | list) and not isinstance(fn, Program):
        return _vmap_several(fn, tuple(axis), in_axes, out_axes)
    if not isinstance(axis, str) or not axis.isidentifier():
        raise TransformError(
            f"accy.vmap: axis must be an axis name, got {axis!r} (or a tuple of axis names)"
        )
    if isinstance(fn, Program):
        if size is None:
            raise TransformError("accy.vmap of a Program needs the extent of the axis: size=")
        flags = [True] * len(fn.parameters) if in_axes is None else [bool(f) for f in in_axes]
        return simplify(batch(fn, axis, size, flags))
    if not callable(fn):
        raise TransformError(f"accy.vmap needs a function or a Program, got {fn!r}")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise TransformError(f"accy.vmap: size must be an int >= 0, got {size!r}")
    return Vmapped(fn, axis, in_axes, out_axes, size)


def _vmap_several(fn: Callable, axes: tuple, in_axes: Any, out_axes: Any) -> Any:
    """`fn` mapped over each of `axes`, the first outermost: the outputs carry them first, in
    that order (with the default out_axes)."""
    if not axes or len(set(axes)) != len(axes):
        raise TransformError(
            f"accy.vmap: the axes to map over must be distinct names, at least one: {axes!r}"
        )
    position_like = [
        e
        for e in optree.tree_leaves(in_axes, none_is_leaf=True, namespace=NAMESPACE)
        if not (e is None or isinstance(e, bool))
    ]
    if position_like:
        raise TransformError(
            f"accy.vmap over several axes {axes}: in_axes entries can be True (mapped along "
            f"each axis it has) or None/False (shared), not {position_like[0]!r}, whose axis "
            "would differ per level; map over one axis at a time for that"
        )
    for axis in reversed(axes):
        fn = vmap(fn, axis, in_axes, out_axes)
    return fn


__all__ = ["vmap"]
