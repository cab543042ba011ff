"""`linear_transpose`: the transpose of a linear function of trees (`jax.linear_transpose`).

The function is traced on the primals' types (their values are not read), its closed-over
arrays become the primal part of a `Linearized` program whose tangent inputs are the
arguments, and `accy.transforms.pullback` transposes it. An operation that is not linear in the
arguments has no transpose rule: that is an error naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import optree

from ..core.ir import permute_parameters
from ..trace import define
from ..transforms.linearize import Linearized
from ..transforms.pullback import pullback
from ..transforms.simplify import simplify
from .errors import TransformError
from .functions import _as_list, _check_callable, _memoized, _name
from .named import named_scalar
from .tracing import NAMESPACE, Entry, Staged, argument_path, flatten, leaf_paths, structure, trace


class _Transposed:
    """cotangent -> one cotangent tree per primal, for one signature of the primals."""

    def __init__(self, fn: Callable, primals: tuple):
        self.fn = fn
        self.primals = primals
        leaves, self.primal_def = flatten(primals)
        for leaf, path in zip(leaves, leaf_paths(primals), strict=True):
            if not hasattr(leaf, "ty") or not leaf.ty.dtype.is_float:
                got = leaf.ty if hasattr(leaf, "ty") else f"{type(leaf).__name__} {leaf!r}"
                raise TransformError(
                    f"accy.linear_transpose: the primal {argument_path('[0]' + path)} is {got}; "
                    "a linear function's arguments are floating-point arrays"
                )
        self.leaves = leaves
        self.staged = Staged(self._build)

    def __call__(self, cotangent: Any) -> tuple:
        return tuple(self.staged((cotangent,)))

    def _build(self, ct_leaves: list[Any], ct_treedef: Any) -> Entry:
        traced = trace(self.fn, self.leaves, structure((self.primals, {})), _name(self.fn))
        source = traced.program
        if ct_treedef.children()[0] != traced.out_treedef:
            raise TransformError(
                "accy.linear_transpose: the cotangent must have the structure of the "
                f"function's output: expected {traced.out_treedef}, got {ct_treedef}"
            )
        for i, (leaf, expected) in enumerate(zip(ct_leaves, source.output_types, strict=True)):
            if leaf.ty != expected:
                raise TransformError(
                    f"accy.linear_transpose: cotangent leaf {i} has type {leaf.ty}, but the "
                    f"function's output has {expected} there"
                )
        count, extra = len(self.leaves), len(traced.captured)
        # The closed-over arrays first, as the primal part; the arguments are the tangents.
        order = [*range(count, count + extra), *range(count)]
        linearized = Linearized(permute_parameters(source, order), extra, 0, tuple(range(count)))
        transposed = simplify(pullback(linearized).program)
        specs = [leaf.ty for leaf in ct_leaves] + [c.ty for c in traced.captured]

        def body(b, params):
            cts, captured = params[: len(ct_leaves)], params[len(ct_leaves) :]
            return _as_list(b.call(transposed, [*captured, *cts]))

        program = simplify(define(f"transpose_{source.name}", specs, body))
        return Entry(program, self.primal_def, traced.captured, traced.foreign)


def linear_transpose(fn: Callable | Any, *primals: Any) -> Any:
    """The transpose of `fn`, a function linear in its arguments: `linear_transpose(fn,
    *primals)` returns `fn_t`, where `fn_t(cotangent)` (a tree shaped like fn's output) gives a
    tuple with one cotangent tree per argument, as JAX's. `primals` only give the arguments'
    trees and types. Given a Program, it is `accy.gradient.linear_transpose`.

    >>> import accy, numpy as np
    >>> w = accy.named(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), ("i", "o"))
    >>> x = accy.named(np.zeros(2, np.float32), "i")
    >>> f_t = accy.linear_transpose(lambda x: x.contract(w, "i"), x)
    >>> (ct,) = f_t(accy.named(np.array([1.0, 0.0], np.float32), "o"))
    >>> ct.array.tolist()  # w @ [1, 0]
    [1.0, 3.0]
    """
    from ..core import Program
    from ..gradient import linear_transpose as program_transpose

    if isinstance(fn, Program):
        return program_transpose(fn)
    _check_callable(fn, "linear_transpose")
    as_arrays = optree.tree_map(
        lambda leaf: named_scalar(leaf) if type(leaf) is float else leaf,
        tuple(primals),
        namespace=NAMESPACE,
    )
    _Transposed(fn, as_arrays)  # checks the primals now, as JAX does
    return TransposedFunction(as_arrays, fn)


@dataclasses.dataclass(eq=False)
class TransposedFunction:
    """What `accy.linear_transpose` returns: `f_t(cotangent)` is one cotangent tree per primal.
    A tree whose leaves are the primals (only their types are read) and whose function is
    static, so that, like JAX's, it can be returned from and passed to jitted functions."""

    primals: tuple
    fn: Callable = dataclasses.field(metadata={"static": True})

    def __call__(self, cotangent: Any) -> tuple:
        leaves, treedef = flatten(self.primals)
        signature = (treedef, tuple(getattr(leaf, "ty", None) for leaf in leaves))
        transposed = _memoized(
            self.fn, ("linear_transpose", signature), lambda: _Transposed(self.fn, self.primals)
        )
        return transposed(cotangent)


__all__ = ["linear_transpose"]
