"""Regions of a traced function that differentiation treats specially: `checkpoint` (its
intermediates are recomputed in the backward pass rather than stored) and `stop_gradient` (a
constant to differentiation).

`accy.checkpoint(fn)` takes a front-end function of trees (`jax.checkpoint`'s form) and still
the builder-style `fn(builder, args)` of `accy.gradient.checkpoint`: called as
`checkpointed(builder, [values])` it is that. A front-end region is traced like any function
(closures over arrays and over enclosing traces work) and emitted as the one-step `remat` scan
of `OpsApi.checkpoint`; outside any trace it just runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import optree

from ..core.operations import OpsApi
from ..errors import AccyError
from .functions import _check_callable, _name
from .tracing import NAMESPACE, flatten, innermost, is_array, trace, unflatten


class checkpoint_policies:  # noqa: N801 (JAX's spelling: jax.checkpoint_policies)
    """What a checkpointed region keeps for the backward pass (`jax.checkpoint_policies`).

    - `nothing_saveable` (the default): keep only the region's arguments; recompute the rest.
    - `everything_saveable`: keep every intermediate, as without `checkpoint`.
    """

    nothing_saveable = "nothing_saveable"
    everything_saveable = "everything_saveable"


POLICIES = (checkpoint_policies.nothing_saveable, checkpoint_policies.everything_saveable)


class Checkpointed:
    """The function behind `accy.checkpoint(fn)`."""

    def __init__(self, fn: Callable, policy: Any):
        self.fn = fn
        self.policy = policy
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 2 and not kwargs and isinstance(args[0], OpsApi):
            return args[0].checkpoint(self.fn, list(args[1]))  # the builder-style form
        if self.policy == checkpoint_policies.everything_saveable:
            return self.fn(*args, **kwargs)
        leaves, treedef = flatten((args, kwargs))
        outer = innermost([leaf for leaf in leaves if is_array(leaf)])
        traced = trace(self.fn, leaves, treedef, f"checkpoint_{_name(self.fn)}")
        if outer is None and traced.foreign:
            outer = innermost(traced.captured)
        if outer is None:  # nothing is traced: no differentiation to save memory for
            return self.fn(*args, **kwargs)
        values = [outer.lift(leaf) for leaf in leaves if is_array(leaf)]
        values += [outer.lift(c) for c in traced.captured]
        program = traced.program
        outputs = outer.checkpoint(lambda b, inputs: b.call(program, inputs), values)
        if not program.outputs:
            outputs = []
        elif len(program.outputs) == 1:
            outputs = [outputs]
        return unflatten(traced.out_treedef, list(outputs))

    def __repr__(self) -> str:
        return f"<accy.checkpoint of {self.fn!r}>"


def checkpoint(fn: Callable | None = None, *, policy: Any = None) -> Any:
    """`fn` as a region whose intermediates reverse mode does not store: the backward pass
    recomputes them from the region's arguments, trading compute for memory
    (`jax.checkpoint`, also spelled `jax.remat`). `fn` takes and returns trees of arrays;
    `policy` is `checkpoint_policies.nothing_saveable` (None, the default) or
    `everything_saveable` (no recomputation). A builder-style `fn(builder, args)` works too:
    `accy.checkpoint(layer)(builder, args)` is `builder.checkpoint(layer, args)`.

    >>> import accy, numpy as np
    >>> layer = accy.checkpoint(lambda x, w: {"y": (x * w).tanh()})
    >>> x = accy.named(np.array([0.5, 1.0], np.float32), "lane")
    >>> g = accy.grad(lambda x: layer(x, 2.0)["y"].sum())(x)
    >>> np.allclose(g.array, 2.0 / np.cosh(2.0 * x.array) ** 2)
    True
    >>> accy.make_program(lambda x: layer(x, 2.0)["y"])(x).count("scan")
    1
    """
    if fn is None:
        return functools.partial(checkpoint, policy=policy)
    _check_callable(fn, "checkpoint")
    policy = checkpoint_policies.nothing_saveable if policy is None else policy
    if policy not in POLICIES:
        raise AccyError(
            f"accy.checkpoint: policy={policy!r} is not one accy has; the policies are "
            "accy.checkpoint_policies.nothing_saveable (the default: recompute everything) and "
            "accy.checkpoint_policies.everything_saveable (keep everything)"
        )
    return Checkpointed(fn, policy)


remat = checkpoint


def stop_gradient(tree: Any) -> Any:
    """`tree` unchanged, but a constant to differentiation: its derivative is zero
    (`jax.lax.stop_gradient`). Leaves that are not arrays pass through.

    >>> import accy, numpy as np
    >>> x = accy.named(np.float32(3.0), ())
    >>> accy.grad(lambda x: x * accy.stop_gradient(x))(x).item()  # d/dx (x * c) = c
    3.0
    """

    def stopped(leaf: Any) -> Any:
        return leaf.builder.unary("stop_gradient", leaf) if is_array(leaf) else leaf

    return optree.tree_map(stopped, tree, namespace=NAMESPACE)


__all__ = ["Checkpointed", "checkpoint", "checkpoint_policies", "remat", "stop_gradient"]
