"""Jacobians and Hessians of functions over trees: `jacfwd`, `jacrev`, `hessian`.

A Jacobian leaf has the axes of its output leaf, then those of its input leaf (in their layout
orders): `J[o..., i...] = d out[o...] / d in[i...]`, as JAX's `jacrev(f)(x)` has the shape
`out.shape + x.shape`. An output and an input axis that share a name would collide, so that is
an error that asks for a rename. `hessian` gives each input axis two axes: its name derived by
`second_axis` (a suffix, `"_"` by default, or a function of the name) for the first
differentiation, then its own name.

Both build on the front end's `vjp`/`jvp` and `vmap`: `jacrev` pulls back one basis cotangent
per output element (the basis mapped along one axis `JACOBIAN_AXIS`, then split into the output's
axes), `jacfwd` pushes forward one basis tangent per input element. The whole computation is
traced once per signature and compiled, as `accy.grad` is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import optree

from ..errors import AxisError
from ..transforms.simplify import simplify
from .errors import TransformError
from .functions import (
    _argnums_tuple,
    _aux_pair,
    _check_callable,
    _hashable_argnums,
    _memoized,
    _name,
    _scalar_to_array,
    jvp,
    vjp,
)
from .named import NamedArray, named
from .tracing import _ACTIVE, NAMESPACE, Entry, Staged, flatten, structure, trace, unflatten
from .vmap import vmap

JACOBIAN_AXIS = "jacobian_"
"""The prefix of the axis along which the basis of a Jacobian's rows (or columns) is mapped
while it is computed (`jacobian_0`, then `jacobian_1` for one nested inside it, ...); it never
reaches the result, but a function's own axes must not use these names."""


def _basis_axis() -> str:
    """The basis axis of a Jacobian computed at this depth of tracing."""
    return f"{JACOBIAN_AXIS}{len(_ACTIVE)}"


class TracedTransform:
    """A Python function `compute(*args, **kwargs)` of trees, traced once per signature and
    run compiled (or inlined into an enclosing trace): the way `jacrev`, `jacfwd`, `hessian`
    and the other transforms built from front-end pieces get `accy.grad`'s caching. Python
    scalars and hashable values outside `argnums` stay Python values; floats in `argnums` are
    differentiated as f32 and ints there refused, as `accy.grad` does."""

    def __init__(
        self,
        compute: Callable,
        fn: Callable,
        bound: tuple,
        name: str,
        transform: str,
        numbers: tuple[int, ...],
    ):
        # `compute(fn, *bound, *args, **kwargs)`; `fn` apart, so that the memo holds it weakly
        self.compute = compute
        self.fn = fn
        self.bound = bound
        self.name = name
        self.transform = transform
        self.numbers = numbers
        self.staged = Staged(self._build, static_scalars=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        count = len(args)
        to_array = functools.partial(_scalar_to_array, transform=self.transform)
        args = tuple(
            _map_leaves(to_array, a) if (i in self.numbers or i - count in self.numbers) else a
            for i, a in enumerate(args)
        )
        return self.staged((args, kwargs))

    def _build(self, leaves: list[Any], treedef: Any) -> Entry:
        # the transforms `compute` is built from decide what its debug_print calls print
        compute = functools.partial(self.compute, self.fn, *self.bound)
        traced = trace(compute, leaves, treedef, self.name, prints=True)
        entry = Entry(simplify(traced.program), traced.out_treedef, traced.captured, traced.foreign)
        entry.prints = traced.prints
        return entry


def _map_leaves(fn: Callable, tree: Any) -> Any:
    return optree.tree_map(fn, tree, namespace=NAMESPACE)


def _restricted(fn: Callable, args: tuple, kwargs: dict, numbers: tuple[int, ...]) -> Callable:
    """`fn` as a function of the arguments at `numbers` alone, the others fixed."""

    def of_chosen(*chosen: Any) -> Any:
        full = list(args)
        for n, value in zip(numbers, chosen, strict=True):
            full[n] = value
        return fn(*full, **kwargs)

    return of_chosen


def _check_arguments(transform: str, args: tuple, numbers: tuple[int, ...]) -> None:
    for n in numbers:
        if not -len(args) <= n < len(args):
            raise TransformError(
                f"accy.{transform}: argnums names argument {n}, but the function was called "
                f"with {len(args)} positional argument{'s' if len(args) != 1 else ''}"
            )


def _basis(ty: Any, axis: str) -> NamedArray:
    """The one-hot basis of `ty`'s elements: f32-like, axes (axis, ty's axes...)."""
    size = ty.size
    eye = np.eye(size, dtype=ty.dtype.numpy).reshape((size, *ty.extents))
    return named(eye, (axis, *ty.axes))


def _zeros_like(leaf: Any) -> NamedArray:
    return named(np.zeros(leaf.ty.extents, leaf.ty.dtype.numpy), leaf.ty.axes)


def _check_disjoint(transform: str, out_ty: Any, in_ty: Any, where: str, axis: str) -> None:
    shared = [a for a in out_ty.axes if in_ty.has(a)]
    if shared:
        raise AxisError(
            f"accy.{transform}: {where}: the output {out_ty} and the input {in_ty} share the "
            f"axis name{'s' if len(shared) > 1 else ''} {', '.join(map(repr, shared))}; a "
            "Jacobian has the output's axes and then the input's, so rename one (inside the "
            f"function: y.rename({shared[0]!r}, {shared[0] + '_out'!r}))"
        )
    for ty in (out_ty, in_ty):
        if ty.has(axis):
            raise AxisError(
                f"accy.{transform}: {where}: {ty} has the axis {axis!r}, which Jacobians "
                "use internally; rename it"
            )


def _check_float(transform: str, leaf: Any, what: str) -> None:
    if not leaf.ty.dtype.is_float:
        raise TransformError(
            f"accy.{transform}: {what} is {leaf.ty}; Jacobians exist for floating-point "
            "inputs and outputs only: convert it, or move it out of argnums"
        )


def _split_basis(x: Any, ty: Any, axis: str) -> Any:
    """`x` with the basis axis `axis` (at the front) split back into `ty`'s axes."""
    if ty.rank == 0:
        return x.builder.reshape(x, [(a, e) for a, e in x.ty.named_extents if a != axis])
    return x.builder.split(x, axis, dict(ty.named_extents))


def _chosen_trees(argnums: Any, trees: list[Any]) -> Any:
    return trees[0] if isinstance(argnums, int) else tuple(trees)


def _jacrev_compute(fn, argnums, has_aux, transform, *args, **kwargs):
    axis = _basis_axis()
    numbers = _argnums_tuple(transform, argnums)
    _check_arguments(transform, args, numbers)
    chosen = [args[n] for n in numbers]
    restricted = _restricted(fn, args, kwargs, numbers)
    result = vjp(restricted, *chosen, has_aux=has_aux)
    output, pull, aux = result if has_aux else (*result, None)
    out_leaves, out_def = flatten(output)
    in_leaves, in_def = flatten(tuple(chosen))
    for leaf in in_leaves:
        _check_float(transform, leaf, "an input in argnums")
    rows = []
    for j, out_leaf in enumerate(out_leaves):
        _check_float(transform, out_leaf, f"output leaf {j}")
        for leaf in in_leaves:
            _check_disjoint(transform, out_leaf.ty, leaf.ty, f"output leaf {j}", axis)

        def pull_one(cotangent, j=j):
            cotangents = [_zeros_like(o) if k != j else cotangent for k, o in enumerate(out_leaves)]
            return pull(unflatten(out_def, cotangents))

        pulled = flatten(vmap(pull_one, axis)(_basis(out_leaf.ty, axis)))[0]
        rows.append(
            unflatten(in_def, [_split_basis(x, out_leaf.ty, axis) for x in pulled])
            if pulled
            else ()
        )
    jac = unflatten(out_def, [_chosen_trees(argnums, list(row)) for row in rows])
    return (jac, aux) if has_aux else jac


def _jacfwd_compute(fn, argnums, has_aux, transform, *args, **kwargs):
    axis = _basis_axis()
    numbers = _argnums_tuple(transform, argnums)
    _check_arguments(transform, args, numbers)
    chosen = tuple(args[n] for n in numbers)
    restricted = _restricted(fn, args, kwargs, numbers)
    in_leaves, in_def = flatten(chosen)
    columns = []  # per input leaf: the output tree of Jacobian blocks
    out_def = aux = None
    for i, in_leaf in enumerate(in_leaves):
        _check_float(transform, in_leaf, "an input in argnums")

        def push_one(tangent, i=i):
            tangents = [_zeros_like(x) if k != i else tangent for k, x in enumerate(in_leaves)]
            return jvp(restricted, chosen, unflatten(in_def, tangents), has_aux=has_aux)[1]

        pushed, out_def = flatten(vmap(push_one, axis)(_basis(in_leaf.ty, axis)))
        blocks = []
        for j, block in enumerate(pushed):
            out_ty = block.ty.without([axis])
            _check_float(transform, block, f"output leaf {j}")
            _check_disjoint(transform, out_ty, in_leaf.ty, f"output leaf {j}", axis)
            split = _split_basis(block, in_leaf.ty, axis)
            blocks.append(split.builder.transpose(split, (*out_ty.axes, *in_leaf.ty.axes)))
        columns.append(blocks)
    if has_aux:
        aux = _aux_pair(transform, restricted(*chosen))[1]
    if out_def is None:  # no inputs: the outputs' structure, with empty Jacobians
        output = restricted(*chosen)
        out_def = structure(_aux_pair(transform, output)[0] if has_aux else output)
    rows = [
        _chosen_trees(argnums, list(unflatten(in_def, [col[j] for col in columns])))
        for j in range(out_def.num_leaves)
    ]
    jac = unflatten(out_def, rows)
    return (jac, aux) if has_aux else jac


def _transform(kind: str, compute: Callable, fn: Callable, argnums: Any, has_aux: bool, *extra):
    _check_callable(fn, kind)
    key = (kind, _hashable_argnums(kind, argnums), has_aux, *extra)
    numbers = _argnums_tuple(kind, argnums)
    return _memoized(
        fn,
        key,
        lambda: TracedTransform(
            compute,
            fn,
            (argnums, has_aux, kind, *extra),
            f"{kind}_{_name(fn)}",
            kind,
            numbers,
        ),
    )


def jacrev(fn: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of `fn` with respect to argument(s) `argnums`, by reverse mode (one
    pullback per output element: best for few outputs, `jax.jacrev`).

    The result has `fn`'s output tree; each of its leaves is the tree of argument `argnums` (a
    tuple of such trees for a tuple `argnums`) whose leaves are the Jacobian blocks, with the
    output leaf's axes and then the input leaf's. With `has_aux=True`, `fn` returns
    `(output, aux)` and the result is `(jacobian, aux)`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), "i")
    >>> J = accy.jacrev(lambda x: (x * x).rename("i", "o"))(x)
    >>> J.axes, J.array.tolist()
    (('o', 'i'), [[2.0, 0.0], [0.0, 4.0]])
    """
    return _transform("jacrev", _jacrev_compute, fn, argnums, has_aux)


def jacfwd(fn: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of `fn` by forward mode (one pushforward per input element: best for few
    inputs, `jax.jacfwd`); the same result as `jacrev`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), "i")
    >>> J = accy.jacfwd(lambda x: {"sum": (x * x).sum()})(x)
    >>> J["sum"].axes, J["sum"].array.tolist()
    (('i',), [2.0, 4.0])
    """
    return _transform("jacfwd", _jacfwd_compute, fn, argnums, has_aux)


def second_name(axis: str, second_axis: str | Callable[[str], str]) -> str:
    """The name of the Hessian's first axis for input axis `axis`: `axis + second_axis` for a
    suffix, or `second_axis(axis)`.

    >>> second_name("i", "_"), second_name("i", lambda a: a.upper())
    ('i_', 'I')
    """
    name = axis + second_axis if isinstance(second_axis, str) else second_axis(axis)
    if not isinstance(name, str) or not name or name == axis:
        raise AxisError(
            f"accy.hessian: second_axis gives {name!r} for the axis {axis!r}; it must give a "
            "name of its own (a suffix such as '_', or a function returning another name)"
        )
    return name


def _renamed_gradient(fn, argnums, has_aux, second_axis):
    """`jacrev(fn)` with the input's axes renamed by `second_axis` (the Hessian's first
    differentiation; for a scalar `fn`, its gradient)."""

    def gradient(*args: Any, **kwargs: Any) -> Any:
        numbers = _argnums_tuple("hessian", argnums)
        _check_arguments("hessian", args, numbers)
        inputs = {
            a
            for n in numbers
            for leaf in flatten(args[n])[0]
            if hasattr(leaf, "ty")
            for a in leaf.ty.axes
        }
        result = jacrev(fn, argnums=argnums, has_aux=has_aux)(*args, **kwargs)
        jac, aux = result if has_aux else (result, None)

        def rename(x: Any) -> Any:
            names = [second_name(a, second_axis) if a in inputs else a for a in x.ty.axes]
            return x.builder.rename_axes(x, names)

        renamed = _map_leaves(rename, jac)
        return (renamed, aux) if has_aux else renamed

    return gradient


def _hessian_compute(fn, argnums, has_aux, transform, second_axis, *args, **kwargs):
    gradient = _memoized(
        fn,
        ("hessian_gradient", _hashable_argnums(transform, argnums), has_aux, second_axis),
        lambda: _renamed_gradient(fn, argnums, has_aux, second_axis),
    )
    return _jacfwd_compute(gradient, argnums, has_aux, transform, *args, **kwargs)


def hessian(
    fn: Callable,
    argnums: int | tuple[int, ...] = 0,
    has_aux: bool = False,
    second_axis: str | Callable[[str], str] = "_",
) -> Callable:
    """The Hessian of `fn` (`jax.hessian`: `jacfwd` of `jacrev`).

    Its leaf for an output leaf and inputs `a` and `b` (leaves of the arguments `argnums`)
    holds `d^2 out / da db`, with the output's axes, then `a`'s axes renamed by `second_axis`
    (`"_"` appends an underscore: `i` becomes `i_`; a function maps each name), then `b`'s own
    axes: a scalar function of an input with axis `i` has a Hessian with the axes `(i_, i)`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), "i")
    >>> H = accy.hessian(lambda x: (x * x * x).sum())(x)  # diag(6 x)
    >>> H.axes, H.array.tolist()
    (('i_', 'i'), [[6.0, 0.0], [0.0, 12.0]])
    """
    if not isinstance(second_axis, str) and not callable(second_axis):
        raise AxisError(
            f"accy.hessian: second_axis must be a suffix (a string) or a function of an axis "
            f"name, got {second_axis!r}"
        )
    return _transform("hessian", _hessian_compute, fn, argnums, has_aux, second_axis)


__all__ = ["JACOBIAN_AXIS", "TracedTransform", "hessian", "jacfwd", "jacrev", "second_name"]
