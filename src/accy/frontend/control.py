"""Control flow over trees of named arrays: `scan`, `cond`, `switch`, `while_loop`,
`fori_loop` and `map`, shaped after `jax.lax`'s, with named axes in place of positions.

Inside a traced function (`accy.jit`, `accy.grad`, `accy.vmap`, another loop's body) each one
records one control-flow operation (the kinds `scan`, `cond`, `while_loop`) through the Program
API (`builder.scan`, `builder.cond`, `builder.while_loop`): the bodies are traced once, and
whatever they read from outside (the function's arguments, an enclosing body's values,
module-level arrays) becomes an operand of the operation, as JAX's closure conversion does.
Outside any trace they run eagerly, as Python loops over eager operations (as JAX does under
`jax.disable_jit()`), so a body can be debugged with `print`; the carries' structure and types
are checked at every step in both modes.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..backends.devices import CPU, Device, current_default
from ..core import Value
from ..core.indexing import index_by_name
from ..core.types import TensorType, bool_, i32
from ..errors import AxisError
from .errors import TransformError
from .functions import jit
from .named import NamedArray, named
from .tracing import (
    PRINTED,
    as_array_leaf,
    flatten,
    innermost_trace,
    is_python_value,
    leaf_paths,
    record_print,
    unflatten,
)

# -- trees of operands ---------------------------------------------------------------------------


def _array_leaves(
    transform: str, what: str, tree: Any, device: Device = CPU
) -> tuple[list[Any], Any]:
    """The leaves of `tree` as arrays (scalars become rank-0 arrays on `device`) and its
    structure."""
    leaves, treedef = flatten(tree)
    if not leaves:
        return [], treedef
    paths = leaf_paths(tree)
    return [
        as_array_leaf(leaf, f"accy.{transform}: {what}{path}", device)
        for leaf, path in zip(leaves, paths, strict=True)
    ], treedef


def _tree_device(*trees: Any) -> Device:
    """The device of the NamedArrays in `trees` (the default device when there are none;
    several devices meet in the first eager operation, which reports them)."""
    for tree in trees:
        for leaf in flatten(tree)[0]:
            if isinstance(leaf, NamedArray):
                return leaf.device
    return current_default()


def _traced_target(leaves: Sequence[Any]) -> Any:
    """The builder a control-flow operation on `leaves` is recorded into: that of the innermost
    trace under way or of the operands' (None outside any trace: the operation runs eagerly)."""
    candidates = [leaf.builder for leaf in leaves if isinstance(leaf, Value)]
    if innermost_trace() is not None:
        candidates.append(innermost_trace())
    return builtins.max(candidates, key=lambda b: getattr(b, "depth", 0), default=None)


def _check_like(
    transform: str,
    what: str,
    expected_def: Any,
    expected: Sequence[TensorType],
    got: Any,
    device: Device = CPU,
    like: str = "its initial value's",
) -> list[Any]:
    """The leaves of `got` (arrays), checked to have the structure `expected_def` and the types
    `expected` (a loop's carry keeps its structure and types from step to step; the false
    branch returns what the true one does: `like` names the reference)."""
    leaves, treedef = _array_leaves(transform, what, got, device)
    if treedef != expected_def:
        raise TransformError(
            f"accy.{transform}: {what} must have {like} structure: expected {expected_def}, "
            f"got {treedef}"
        )
    paths = leaf_paths(got)
    for leaf, ty, path in zip(leaves, expected, paths, strict=True):
        if leaf.ty != ty:
            raise TransformError(
                f"accy.{transform}: {what}{path} has type {leaf.ty}, but {like} is {ty}; both "
                "must have one dtype and axes (convert or transpose it)"
            )
    return leaves


def _check_callable(transform: str, **functions: Any) -> None:
    for name, fn in functions.items():
        if not callable(fn):
            raise TransformError(
                f"accy.{transform}: {name} must be a function, got {type(fn).__name__} {fn!r}"
            )


# -- scan ------------------------------------------------------------------------------------------


class _Xs:
    """The xs of a scan: its array leaves (scanned along the axis), and its Python values
    (hashable non-arrays: a module's static fields), which reach every step unchanged, as
    `accy.vmap` passes them through."""

    def __init__(self, xs: Any, device: str):
        leaves, self.treedef = flatten(xs)
        paths = leaf_paths(xs) if leaves else []
        self.leaves = leaves
        self.static = [is_python_value(leaf) for leaf in leaves]
        self.paths = [p for p, s in zip(paths, self.static, strict=True) if not s]
        self.arrays = [
            as_array_leaf(leaf, f"accy.scan: xs{path}", device)
            for leaf, path, s in zip(leaves, paths, self.static, strict=True)
            if not s
        ]

    def rebuild(self, slices: Sequence[Any]) -> Any:
        """The xs tree of one step: `slices` (one per array leaf) and the static values."""
        given = iter(slices)
        return unflatten(
            self.treedef,
            [leaf if s else next(given) for leaf, s in zip(self.leaves, self.static, strict=True)],
        )

    def length(self, axis: str, length: int | None) -> int:
        """The extent of `axis` on every array x (checked to agree, and with `length`)."""
        extents = []
        for leaf, path in zip(self.arrays, self.paths, strict=True):
            if not leaf.ty.has(axis):
                raise AxisError(
                    f"accy.scan over {axis!r}: xs{path} ({leaf.ty}) has no axis {axis!r} to "
                    f"scan along; its axes are {', '.join(leaf.ty.axes) or 'none (a scalar)'}"
                )
            extents.append(leaf.ty.extent(axis))
        given = set(extents) | ({length} if length is not None else set())
        if len(given) > 1:
            raise AxisError(
                f"accy.scan over {axis!r}: the extents of {axis!r} disagree: "
                + ", ".join(f"xs{p}: {e}" for p, e in zip(self.paths, extents, strict=True))
                + (f", length={length}" if length is not None else "")
            )
        if not given:
            what = "xs holds no array" if self.leaves else "without xs"
            raise TransformError(
                f"accy.scan over {axis!r}: {what} to scan along (Python values in xs reach "
                "every step unchanged); give the number of steps as length="
            )
        (steps,) = given
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise TransformError(f"accy.scan: length must be an int >= 0, got {steps!r}")
        return steps


def scan(
    f: Callable,
    init: Any,
    xs: Any = None,
    *,
    axis: str,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    remat: bool = False,
) -> tuple[Any, Any]:
    """Loop `f(carry, x) -> (carry, y)` along the named `axis` of `xs`: `jax.lax.scan` with an
    axis name in place of position 0.

    `init` and `xs` are trees of arrays (dicts, tuples, dataclass modules, ...). Each step gets
    one slice of every x (the x without `axis`) and the carry, whose structure and types stay
    those of `init`. Returns `(final carry, ys)`: the ys tree with every leaf stacked along
    `axis`, placed first. The extent comes from xs, or from `length` when xs is None (then `f`
    gets None); Python values in xs (a module's static fields) reach every step unchanged.
    `reverse=True` walks the axis from its end (ys stay in axis order).
    `unroll=k` traces k steps into each iteration of the loop (the largest divisor of the
    length up to k; True, or k >= the length: all of them, and no loop remains); the results
    do not change. `remat=True` makes reverse mode store only each step's carry and recompute
    the body's intermediates (`jax.checkpoint` of the body; Haliax's scan `remat`). `f` may
    read any array in scope; gradients flow through the loop.

    >>> import accy, numpy as np
    >>> xs = accy.named(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32),
    ...                 ("time", "lane"))
    >>> def step(total, x):
    ...     total = total + x
    ...     return total, total.sum()
    >>> total, sums = accy.scan(step, accy.named(np.zeros(2, np.float32), "lane"), xs,
    ...                         axis="time")
    >>> total.array.tolist(), sums.axes, sums.array.tolist()
    ([9.0, 12.0], ('time',), [3.0, 10.0, 21.0])
    """
    _check_callable("scan", f=f)
    if not isinstance(axis, str) or not axis.isidentifier():
        raise TransformError(f"accy.scan: axis must be an axis name, got {axis!r}")
    _check_known("scan", length=length, unroll=unroll)
    if isinstance(unroll, bool):
        unroll = 0 if unroll else 1  # 0: every step
    if not isinstance(unroll, int) or unroll < 0:
        raise TransformError(f"accy.scan: unroll must be an int >= 1 or a bool, got {unroll!r}")
    device = _tree_device(init, xs)
    init_leaves, init_def = _array_leaves("scan", "init", init, device)
    scanned = _Xs(xs, device)
    steps = scanned.length(axis, length)
    target = _traced_target(init_leaves + scanned.arrays)
    if target is None and steps > 0:
        return _scan_eagerly(f, init_leaves, init_def, scanned, axis, steps, reverse, device)
    if target is None:  # no step to run: the ys' types come from tracing the body once

        def run(init, xs):
            return scan(f, init, xs, axis=axis, length=length, reverse=reverse, remat=remat)

        return jit(run, device=device)(init, xs)
    per_step = _steps_per_iteration(unroll, steps)
    return _scan_traced(
        target, f, init_leaves, init_def, scanned, axis, steps, reverse, per_step, remat
    )


def _check_known(transform: str, **options: Any) -> None:
    """Options that shape the loop (its length, its unrolling) are Python values: a traced one
    (an argument of a jitted function) is refused, saying how to pass it."""
    for name, option in options.items():
        if isinstance(option, Value | NamedArray):
            raise TransformError(
                f"accy.{transform}: {name} must be a Python int known when the loop is traced, "
                f"got an array {option.ty}; pass it as a static argument of accy.jit "
                "(static_argnames=...) or as a constant"
            )


def _steps_per_iteration(unroll: int, steps: int) -> int:
    """How many steps one iteration runs: `unroll` (0: all of them), lowered to a divisor of
    the length so that every iteration runs the same steps.

    >>> _steps_per_iteration(4, 6), _steps_per_iteration(0, 6), _steps_per_iteration(1, 6)
    (3, 6, 1)
    """
    wanted = steps if unroll == 0 else builtins.min(unroll, steps)
    return next((k for k in range(wanted, 1, -1) if steps % k == 0), 1)


def _call_step(
    f: Callable, carry_def: Any, carry_types: list, carry: Any, x: Any, device: Device = CPU
) -> tuple:
    """`f(carry, x)`, checked to return a pair whose carry keeps its structure and types:
    (carry leaves, the y tree)."""
    result = f(carry, x)
    if not isinstance(result, tuple | list) or len(result) != 2:
        got = type(result).__name__
        raise TransformError(
            f"accy.scan: the body must return a pair (carry, y), got a {got}"
            + (f" of length {len(result)}" if isinstance(result, tuple | list) else "")
        )
    new_carry, y = result
    return _check_like("scan", "the carry", carry_def, carry_types, new_carry, device), y


def _scan_traced(
    target: Any,
    f: Callable,
    init_leaves: list,
    init_def: Any,
    xs: _Xs,
    axis: str,
    steps: int,
    reverse: bool,
    per_step: int,
    remat: bool,
) -> tuple[Any, Any]:
    carry_types = [leaf.ty for leaf in init_leaves]
    count = len(init_leaves)
    # Without xs the loop still scans something of its length: the step numbers.
    scanned = xs.arrays or [target.iota(TensorType(i32, ((axis, steps),)), axis)]
    inner = f"{axis}_unrolled"
    if per_step > 1:  # k steps per iteration: split the axis into (iterations, k)
        scanned = [
            target.split(x, axis, {axis: steps // per_step, inner: per_step}) for x in scanned
        ]
    y_def: list[Any] = []
    printed: list[Any] = []  # one iteration's debug_print calls: (format, structure, template)

    def body(b, args):
        if b is not target:  # a loop body of its own: its prints become extra ys
            b.allows_prints = True
        carry = list(args[:count])
        ys_per_step = []
        order = range(per_step - 1, -1, -1) if reverse else range(per_step)
        for k in order:
            slices = args[count:]
            if per_step > 1:
                slices = [index_by_name(b, s, (inner, k)) for s in slices]
            x = xs.rebuild(slices if xs.arrays else [])
            carry, y = _call_step(f, init_def, carry_types, unflatten(init_def, carry), x)
            y_leaves, treedef = _array_leaves("scan", "y", y)
            if y_def and treedef != y_def[0]:
                raise TransformError(
                    f"accy.scan: the body returned ys of structure {treedef}, and {y_def[0]} "
                    "at another step"
                )
            y_def[:] = [treedef]
            ys_per_step.append(y_leaves)
        if reverse:
            ys_per_step.reverse()
        if per_step > 1:
            ys = [
                b.concatenate(
                    [b.broadcast_to(y[i], _with_first(y[i].ty, inner, 1)) for y in ys_per_step],
                    inner,
                )
                for i in range(len(ys_per_step[0]))
            ]
        else:
            ys = ys_per_step[0]
        printed[:] = [] if b is target else getattr(b, "prints", [])
        return [*carry, *ys, *(v for *_, arrays in printed for v in arrays)]

    if per_step == steps:  # unrolled entirely: every step traced in place, no loop
        outputs = body(
            target, [*init_leaves, *(index_by_name(target, x, (axis, 0)) for x in scanned)]
        )
        carries, ys = outputs[:count], outputs[count:]
        if per_step > 1:
            ys = [
                target.transpose(target.rename(y, inner, axis), (axis, *y.ty.without([inner]).axes))
                for y in ys
            ]
        else:
            ys = [target.broadcast_to(y, _with_first(y.ty, axis, 1)) for y in ys]
        return unflatten(init_def, list(carries)), unflatten(y_def[0], list(ys))
    carries, ys = target.scan(
        body, carries=init_leaves, xs=scanned, axis=axis, reverse=reverse, remat=remat
    )
    ys, printed_ys = ys[: y_def[0].num_leaves], ys[y_def[0].num_leaves :]
    if printed:
        _print_each_step(target, printed, printed_ys, axis, steps // per_step, reverse)
    if per_step > 1:
        ys = tuple(target.merge(y, (axis, inner), axis) for y in ys)
    return unflatten(init_def, list(carries)), unflatten(y_def[0], list(ys))


def _print_each_step(
    target: Any, printed: list, values: Sequence[Any], axis: str, iterations: int, reverse: bool
) -> None:
    """Record the debug_print calls of a scan's body in the enclosing trace, once per
    iteration in the order the loop runs (JAX prints inside a scan at every step): `values`
    are the printed arrays, stacked along `axis`."""
    for step in reversed(range(iterations)) if reverse else range(iterations):
        position = 0
        for text, structure_of, template, _ in printed:
            leaves = []
            for leaf in template:
                if leaf is PRINTED:
                    leaf = index_by_name(target, values[position], (axis, step))
                    position += 1
                leaves.append(leaf)
            record_print(target, text, structure_of, leaves)


def _with_first(ty: TensorType, axis: str, extent: int) -> TensorType:
    return ty.with_axes(((axis, extent), *ty.named_extents))


def _scan_eagerly(
    f: Callable,
    init_leaves: list,
    init_def: Any,
    xs: _Xs,
    axis: str,
    steps: int,
    reverse: bool,
    device: str,
) -> tuple[Any, Any]:
    carry_types = [leaf.ty for leaf in init_leaves]
    carry = init_leaves
    ys: list[list[Any]] = []
    y_def = None
    for step in reversed(range(steps)) if reverse else range(steps):
        x = xs.rebuild([leaf[axis, step] for leaf in xs.arrays])
        carry, y = _call_step(f, init_def, carry_types, unflatten(init_def, carry), x, device)
        y_leaves, treedef = _array_leaves("scan", "y", y, device)
        if y_def is not None and treedef != y_def:
            raise TransformError(
                f"accy.scan: the body returned ys of structure {treedef}, and {y_def} at "
                "another step"
            )
        y_def = treedef
        ys.append(y_leaves)
    if reverse:
        ys.reverse()
    stacked = [_stack([y[i] for y in ys], axis) for i in range(len(ys[0]))]
    return unflatten(init_def, carry), unflatten(y_def, stacked)


def _stack(arrays: list[NamedArray], axis: str) -> NamedArray:
    """NamedArrays of one type stacked along an added first axis `axis`."""
    first = arrays[0]
    for other in arrays[1:]:
        if other.ty != first.ty:
            raise TransformError(
                f"accy.scan: the body returned a y of type {other.ty} at one step and "
                f"{first.ty} at another; each y keeps one type"
            )
    if first.ty.has(axis):
        raise AxisError(f"accy.scan: a y slice {first.ty} already has the scanned axis {axis!r}")
    module = np
    if first.device.is_cuda:
        import cupy as module  # the arrays are CuPy's
    return named(module.stack([a.array for a in arrays]), (axis, *first.axes), first.device)


# -- map -------------------------------------------------------------------------------------------


def map(f: Callable, xs: Any, *, axis: str) -> Any:  # noqa: A001 (jax.lax.map's name)
    """`f` applied to each slice of `xs` along the named `axis`, the results stacked along it:
    `jax.lax.map` with an axis name (a loop, unlike `accy.vmap`, which batches).

    >>> import accy, numpy as np
    >>> xs = accy.named(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), ("row", "col"))
    >>> accy.map(lambda x: (x * x).sum(), xs, axis="row").array.tolist()
    [5.0, 25.0]
    """
    _check_callable("map", f=f)
    return scan(lambda carry, x: (carry, f(x)), (), xs, axis=axis)[1]


# -- cond and switch -------------------------------------------------------------------------------


def _predicate(transform: str, pred: Any) -> Any:
    """`pred` as a bool scalar (a number is compared with 0, as JAX does), or a Python bool."""
    if isinstance(pred, bool | np.bool_):
        return bool(pred)
    pred = as_array_leaf(pred, f"accy.{transform}: the predicate")
    if pred.ty.rank != 0:
        raise AxisError(
            f"accy.{transform}: the predicate must be a scalar, got {pred.ty}; reduce it first "
            "(of bools, .min() is 'all' and .max() is 'any'), or choose elementwise with select"
        )
    return pred if pred.ty.dtype == bool_ else pred.ne(0)


def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """`true_fn(*operands)` if the scalar `pred` holds, else `false_fn(*operands)`, as
    `jax.lax.cond`. Both functions return trees of one structure and types; only the selected
    one runs. They may read any array in scope. Under `accy.vmap` with a mapped predicate both
    run and the results are selected per example.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1.0, -2.0], np.float32), "lane")
    >>> accy.cond(x.sum() > 0.0, lambda v: v * 2.0, lambda v: -v, x).array.tolist()
    [-1.0, 2.0]
    """
    _check_callable("cond", true_fn=true_fn, false_fn=false_fn)
    return _branch("cond", _predicate("cond", pred), [true_fn, false_fn], operands)


def switch(index: Any, branches: Sequence[Callable], *operands: Any) -> Any:
    """`branches[index](*operands)`, with `index` (an integer scalar) clamped into range, as
    `jax.lax.switch`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.float32(3.0), ())
    >>> fns = [lambda v: v, lambda v: v * 10.0, lambda v: -v]
    >>> [accy.switch(i, fns, x).item() for i in (0, 1, 2, 7)]
    [3.0, 30.0, -3.0, -3.0]
    """
    branches = list(branches) if isinstance(branches, Sequence) else branches
    if not isinstance(branches, list) or not branches:
        raise TransformError(
            f"accy.switch: branches must be a non-empty sequence of functions, got {branches!r}"
        )
    _check_callable("switch", **{f"branches[{i}]": fn for i, fn in enumerate(branches)})
    if isinstance(index, int | np.integer) and not isinstance(index, bool):
        return branches[builtins.min(builtins.max(int(index), 0), len(branches) - 1)](*operands)
    index = as_array_leaf(index, "accy.switch: the index")
    if index.ty.rank != 0 or index.ty.dtype.is_float or index.ty.dtype == bool_:
        raise TransformError(f"accy.switch: the index must be an integer scalar, got {index.ty}")
    if len(branches) == 1:
        return branches[0](*operands)
    index = index.max(0).min(len(branches) - 1)
    return _switch_from(index, 0, branches, operands)


def _switch_from(index: Any, start: int, branches: list, operands: tuple) -> Any:
    """The branch `index` among branches[start:], as a chain of two-way conds."""
    if start == len(branches) - 1:
        return branches[start](*operands)
    rest = lambda *ops: _switch_from(index, start + 1, branches, ops)  # noqa: E731
    return _branch("switch", index.eq(start), [branches[start], rest], operands)


def _branch(transform: str, pred: Any, branches: list[Callable], operands: tuple) -> Any:
    """(true branch, false branch) on `operands` by the bool scalar (or Python bool) `pred`."""
    if isinstance(pred, bool):
        return branches[0 if pred else 1](*operands)
    leaves, operands_def = _array_leaves(transform, "operands", operands)
    target = _traced_target([pred, *leaves])
    if target is None:
        return branches[0 if bool(pred) else 1](*operands)
    true_shape: list[Any] = []  # the true branch's output structure and types

    def traced(which: int) -> Callable:
        def body(b, args):
            out = branches[which](*unflatten(operands_def, list(args)))
            if which == 0:
                out_leaves, treedef = _array_leaves(transform, "a branch's output", out)
                true_shape[:] = [treedef, [leaf.ty for leaf in out_leaves]]
                return out_leaves
            return _check_like(
                transform, "the false branch's output", *true_shape, out, like="the true branch's"
            )

        return body

    results = target.cond(pred, traced(0), traced(1), leaves)
    results = list(results) if isinstance(results, tuple) else [results]
    return unflatten(true_shape[0], results)


# -- while_loop and fori_loop ----------------------------------------------------------------------


def _check_predicate_result(transform: str, value: Any) -> Any:
    leaves, treedef = flatten(value)
    if not treedef.is_leaf():
        raise TransformError(
            f"accy.{transform}: cond_fn must return a bool scalar, got a tree {treedef}"
        )
    value = as_array_leaf(value, f"accy.{transform}: what cond_fn returned")
    if value.ty.rank != 0 or value.ty.dtype != bool_:
        raise TransformError(f"accy.{transform}: cond_fn must return a bool scalar, got {value.ty}")
    return value


def while_loop(cond_fn: Callable, body_fn: Callable, init: Any) -> Any:
    """Run `carry = body_fn(carry)` while `cond_fn(carry)` (a bool scalar) holds, starting from
    `init`; returns the final carry, as `jax.lax.while_loop`. The carry keeps `init`'s structure
    and types. Forward mode differentiates it; reverse mode does not (the number of steps is
    not known ahead: use `scan` or `fori_loop` with fixed bounds). Under `accy.vmap`, examples
    whose predicate no longer holds keep their carry while the others run.

    >>> import accy, numpy as np
    >>> x = accy.named(np.float32(1.0), ())
    >>> accy.while_loop(lambda c: c < 100.0, lambda c: c * 3.0, x).item()
    243.0
    """
    _check_callable("while_loop", cond_fn=cond_fn, body_fn=body_fn)
    device = _tree_device(init)
    leaves, init_def = _array_leaves("while_loop", "init", init, device)
    types = [leaf.ty for leaf in leaves]
    target = _traced_target(leaves)
    if target is None:
        carry = leaves
        while bool(_check_predicate_result("while_loop", cond_fn(unflatten(init_def, carry)))):
            out = body_fn(unflatten(init_def, carry))
            carry = _check_like("while_loop", "the carry", init_def, types, out, device)
        return unflatten(init_def, carry)

    def condition(b, args):
        return _check_predicate_result("while_loop", cond_fn(unflatten(init_def, list(args))))

    def body(b, args):
        out = body_fn(unflatten(init_def, list(args)))
        return _check_like("while_loop", "the carry", init_def, types, out)

    return unflatten(init_def, list(target.while_loop(condition, body, leaves)))


def fori_loop(
    lower: Any, upper: Any, body_fn: Callable, init: Any, *, unroll: int | bool | None = None
) -> Any:
    """`carry = body_fn(i, carry)` for i in range(lower, upper), as `jax.lax.fori_loop`; `i` is
    an i32 scalar. With Python int bounds the loop is a `scan` (reverse mode differentiates
    it), which `unroll` unrolls as `scan`'s does; with traced bounds, a `while_loop`, which
    cannot be unrolled.

    >>> import accy, numpy as np
    >>> x = accy.named(np.float32(0.0), ())
    >>> accy.fori_loop(0, 5, lambda i, c: c + i.convert(accy.f32), x).item()
    10.0
    >>> accy.fori_loop(0, 5, lambda i, c: c + i.convert(accy.f32), x, unroll=2).item()
    10.0
    """
    _check_callable("fori_loop", body_fn=body_fn)
    _check_known("fori_loop", unroll=unroll)
    static = all(
        isinstance(b, int | np.integer) and not isinstance(b, bool) for b in (lower, upper)
    )
    if static:
        lower, upper = int(lower), int(upper)
        if upper <= lower:
            return init
        device = _tree_device(init)
        init_leaves, init_def = _array_leaves("fori_loop", "init", init, device)
        types = [leaf.ty for leaf in init_leaves]

        def step(carry: Any, i: Any) -> tuple[Any, None]:
            out = body_fn(i, carry)
            leaves = _check_like("fori_loop", "body_fn's carry", init_def, types, out, device)
            return unflatten(init_def, leaves), None

        steps = named(np.arange(lower, upper, dtype=np.int32), ("fori_step",), device)
        options = {} if unroll is None else {"unroll": unroll}
        return scan(step, init, steps, axis="fori_step", **options)[0]
    if unroll is not None:
        raise TransformError(
            f"accy.fori_loop: unroll={unroll!r} needs Python int bounds (the number of steps "
            f"known when tracing); the bounds here are traced ({_bound_text(lower, upper)}), so "
            "the loop is a while_loop: pass them as static arguments, or drop unroll"
        )
    bounds, device = [], _tree_device(lower, upper, init)
    for name, bound in (("lower", lower), ("upper", upper)):
        bound = as_array_leaf(bound, f"accy.fori_loop: {name}", device)
        if bound.ty.rank != 0 or bound.ty.dtype.is_float or bound.ty.dtype == bool_:
            raise TransformError(
                f"accy.fori_loop: {name} must be an integer scalar, got {bound.ty}"
            )
        bounds.append(bound)
    lower, upper = bounds
    if lower.ty.dtype != upper.ty.dtype:
        raise TransformError(
            f"accy.fori_loop: lower ({lower.ty}) and upper ({upper.ty}) must have one dtype"
        )
    state = (lower, upper, init)
    _, _, out = while_loop(
        lambda s: s[0] < s[1], lambda s: (s[0] + 1, s[1], body_fn(s[0], s[2])), state
    )
    return out


def _bound_text(*bounds: Any) -> str:
    return ", ".join(str(b.ty) if hasattr(b, "ty") else repr(b) for b in bounds)


# -- associative_scan ------------------------------------------------------------------------------


def associative_scan(fn: Callable, elems: Any, *, axis: str, reverse: bool = False) -> Any:
    """The inclusive prefix combination of `elems` along the named `axis` with the associative
    `fn`: element i of the result is `fn(... fn(fn(e0, e1), e2) ..., ei)`, as
    `jax.lax.associative_scan` (an axis name in place of `axis=0`). `elems` is a tree of
    arrays that all carry `axis` with one extent; `fn(a, b)` combines two such trees
    elementwise (a holds the earlier elements, and both carry `axis`). The combination runs in
    log2(extent) parallel rounds. `reverse=True` combines from the end.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1, 2, 3, 4], np.int32), "t")
    >>> accy.associative_scan(lambda a, b: a + b, x, axis="t").array.tolist()
    [1, 3, 6, 10]
    >>> accy.associative_scan(lambda a, b: a + b, x, axis="t", reverse=True).array.tolist()
    [10, 9, 7, 4]
    """
    _check_callable("associative_scan", fn=fn)
    if not isinstance(axis, str) or not axis.isidentifier():
        raise TransformError(f"accy.associative_scan: axis must be an axis name, got {axis!r}")
    leaves, treedef = _array_leaves("associative_scan", "elems", elems, _tree_device(elems))
    if not leaves:
        raise TransformError("accy.associative_scan: elems holds no array to scan along")
    paths = leaf_paths(elems)
    extents = set()
    for leaf, path in zip(leaves, paths, strict=True):
        if not leaf.ty.has(axis):
            raise AxisError(
                f"accy.associative_scan over {axis!r}: elems{path} ({leaf.ty}) has no axis "
                f"{axis!r}; its axes are {', '.join(leaf.ty.axes) or 'none (a scalar)'}"
            )
        extents.add(leaf.ty.extent(axis))
    if len(extents) > 1:
        raise AxisError(
            f"accy.associative_scan over {axis!r}: the elems disagree on its extent "
            f"({sorted(extents)})"
        )
    (extent,) = extents
    if reverse:
        leaves = [leaf.flip(axis) for leaf in leaves]
    types = [leaf.ty for leaf in leaves]
    shift = 1
    while shift < extent:  # Hillis and Steele: each round combines elements `shift` apart
        earlier = unflatten(treedef, [leaf[axis, : extent - shift] for leaf in leaves])
        later = unflatten(treedef, [leaf[axis, shift:] for leaf in leaves])
        combined = _combined(fn, treedef, types, earlier, later, axis, extent - shift)
        leaves = [
            _concatenate([leaf[axis, :shift], c], axis)
            for leaf, c in zip(leaves, combined, strict=True)
        ]
        shift *= 2
    if reverse:
        leaves = [leaf.flip(axis) for leaf in leaves]
    return unflatten(treedef, leaves)


def _combined(
    fn: Callable, treedef: Any, types: list, a: Any, b: Any, axis: str, extent: int
) -> list[Any]:
    """`fn(a, b)`'s leaves, checked to keep the elems' structure and types (with `extent`
    elements along `axis`)."""
    expected = [
        ty.with_axes([(n, extent if n == axis else e) for n, e in ty.named_extents]) for ty in types
    ]
    out = fn(a, b)
    leaves, out_def = _array_leaves("associative_scan", "what fn returned", out)
    if out_def != treedef:
        raise TransformError(
            f"accy.associative_scan: fn must return a tree of the elems' structure: expected "
            f"{treedef}, got {out_def}"
        )
    for leaf, ty, path in zip(leaves, expected, leaf_paths(out), strict=True):
        if sorted(leaf.ty.named_extents) != sorted(ty.named_extents) or leaf.ty.dtype != ty.dtype:
            raise TransformError(
                f"accy.associative_scan: what fn returned{path} has type {leaf.ty}, but the "
                f"elems there are {ty}; fn combines its arguments elementwise"
            )
    return leaves


def _concatenate(values: list[Any], axis: str) -> Any:
    builder = builtins.max((v.builder for v in values), key=lambda b: getattr(b, "depth", -1))
    return builder.concatenate(values, axis)


__all__ = ["associative_scan", "cond", "fori_loop", "map", "scan", "switch", "while_loop"]
