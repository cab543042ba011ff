"""Regions of a traced function that differentiation treats specially: `checkpoint` (its
intermediates are recomputed in the backward pass rather than stored) and `stop_gradient` (a
constant to differentiation).

`accy.checkpoint(fn)` takes a front-end function of trees (`jax.checkpoint`'s form) and still
the builder-style `fn(builder, args)` of `accy.gradient.checkpoint`: called as
`checkpointed(builder, [values])` it is that. A front-end region is traced like any function
(closures over arrays and over enclosing traces work) and emitted as the one-step `remat` scan
of `OpsApi.checkpoint`; outside any trace it just runs. Its policy (`checkpoint_policies`, JAX's)
marks the operations of the region's program whose results reverse mode stores anyway (the
attribute `transforms.scan_split.SAVED`); `checkpoint_name` tags values for the names policies.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optree

from ..core.ir import Operation, Program
from ..core.operations import CHECKPOINT_AXIS, OpsApi
from ..core.value import Value
from ..errors import AccyError
from ..transforms.scan_split import SAVED
from .functions import _check_callable, _name
from .tracing import NAMESPACE, flatten, innermost, innermost_trace, is_array, trace, unflatten

Policy = Callable[[Operation, "str | None"], bool]
"""A checkpoint policy: given one operation of the region's traced program and the
`checkpoint_name` of its result (None when it has none), whether reverse mode stores that result
(True) or recomputes it in the backward pass (False). The region's arguments are always stored."""


def _everything(op: Operation, name: str | None) -> bool:
    return True


def _nothing(op: Operation, name: str | None) -> bool:
    return False


@dataclass(frozen=True)
class _Dots:
    """Saves contractions (`dot_general`, and `conv` unless `no_batch_axes`); with
    `no_batch_axes`, only contractions without batch axes (a matmul, not an attention score)."""

    no_batch_axes: bool

    def __call__(self, op: Operation, name: str | None) -> bool:
        if self.no_batch_axes:
            return op.kind == "dot_general" and not op.attrs.get("lhs_batch")
        return op.kind in ("dot_general", "conv")


@dataclass(frozen=True)
class _Names:
    """Saves the values named `names` by `checkpoint_name` (`only`), or everything except them."""

    names: frozenset[str]
    only: bool

    def __call__(self, op: Operation, name: str | None) -> bool:
        if self.only:
            return name in self.names
        return name not in self.names


@dataclass(frozen=True)
class _AnyNamesBut:
    names: frozenset[str]

    def __call__(self, op: Operation, name: str | None) -> bool:
        return name is not None and name not in self.names


@dataclass(frozen=True)
class _Both:
    first: Policy
    second: Policy

    def __call__(self, op: Operation, name: str | None) -> bool:
        return bool(self.first(op, name)) or bool(self.second(op, name))


def _names(names: tuple, where: str) -> frozenset[str]:
    for name in names:
        if not isinstance(name, str):
            raise AccyError(
                f"accy.checkpoint_policies.{where}: names are strings (the names given to "
                f"accy.checkpoint_name), got {name!r}"
            )
    return frozenset(names)


class checkpoint_policies:  # noqa: N801 (JAX's spelling: jax.checkpoint_policies)
    """What a checkpointed region stores for the backward pass (`jax.checkpoint_policies`);
    everything else in the region is recomputed there from what is stored.

    - `nothing_saveable` (the default): store only the region's arguments.
    - `everything_saveable`: store every intermediate, as without `checkpoint`.
    - `dots_saveable` (also `checkpoint_dots`): store the results of contractions
      (`dot_general`, `conv`): the elementwise work between them is recomputed.
    - `dots_with_no_batch_dims_saveable` (`checkpoint_dots_with_no_batch_dims`): only
      contractions without batch axes (a transformer's projections, not its attention scores).
    - `save_only_these_names(*names)`: only the values named so by `accy.checkpoint_name`.
    - `save_any_names_but_these(*names)`: the named values, except those names.
    - `save_anything_except_these_names(*names)`: every intermediate but the values of those
      names.
    - `save_from_both_policies(a, b)`: what either policy stores.

    A policy of one's own is a function `policy(operation, name) -> bool` (see `Policy`). It
    is asked about the region's own operations and those of its conds' branches, not about a
    nested scan's body (recomputed whole) or the operations JVP rules add.

    >>> import accy
    >>> sorted(n for n in vars(accy.checkpoint_policies) if n.endswith("saveable"))
    ['dots_saveable', 'dots_with_no_batch_dims_saveable', 'everything_saveable', 'nothing_saveable']
    """

    nothing_saveable = staticmethod(_nothing)
    everything_saveable = staticmethod(_everything)
    dots_saveable = checkpoint_dots = _Dots(no_batch_axes=False)
    dots_with_no_batch_dims_saveable = checkpoint_dots_with_no_batch_dims = _Dots(True)

    @staticmethod
    def save_only_these_names(*names: str) -> Policy:
        """Store only the values named one of `names` by `accy.checkpoint_name`.

        >>> import accy, numpy as np
        >>> def f(x):
        ...     return accy.checkpoint_name(x.sin(), "h").cos().sum()
        >>> policy = accy.checkpoint_policies.save_only_these_names("h")
        >>> g = accy.grad(accy.checkpoint(f, policy=policy))
        >>> round(g(accy.named(np.float32(1.0), ())).item(), 4)  # -sin(sin 1) cos 1
        -0.4029
        """
        return _Names(_names(names, "save_only_these_names"), only=True)

    @staticmethod
    def save_anything_except_these_names(*names: str) -> Policy:
        """Store every intermediate except the values named one of `names`.

        >>> import accy, numpy as np
        >>> def f(x):
        ...     return accy.checkpoint_name(x.sin(), "h").cos().sum()
        >>> policy = accy.checkpoint_policies.save_anything_except_these_names("h")
        >>> g = accy.grad(accy.checkpoint(f, policy=policy))
        >>> round(g(accy.named(np.float32(1.0), ())).item(), 4)  # -sin(sin 1) cos 1
        -0.4029
        """
        return _Names(_names(names, "save_anything_except_these_names"), only=False)

    @staticmethod
    def save_any_names_but_these(*names: str) -> Policy:
        """Store the values named by `accy.checkpoint_name`, except those named one of `names`.

        >>> import accy, numpy as np
        >>> def f(x):
        ...     return accy.checkpoint_name(x.sin(), "h").cos().sum()
        >>> policy = accy.checkpoint_policies.save_any_names_but_these("g")
        >>> g = accy.grad(accy.checkpoint(f, policy=policy))
        >>> round(g(accy.named(np.float32(1.0), ())).item(), 4)  # -sin(sin 1) cos 1
        -0.4029
        """
        return _AnyNamesBut(_names(names, "save_any_names_but_these"))

    @staticmethod
    def save_from_both_policies(first: Policy, second: Policy) -> Policy:
        """Store what either policy stores.

        >>> import accy, numpy as np
        >>> def f(x):
        ...     return accy.checkpoint_name(x.sin(), "h").cos().sum()
        >>> policy = accy.checkpoint_policies.save_from_both_policies(
        ...     accy.checkpoint_policies.dots_saveable,
        ...     accy.checkpoint_policies.save_only_these_names("h"),
        ... )
        >>> g = accy.grad(accy.checkpoint(f, policy=policy))
        >>> round(g(accy.named(np.float32(1.0), ())).item(), 4)  # -sin(sin 1) cos 1
        -0.4029
        """
        return _Both(_checked_policy(first), _checked_policy(second))


# Values named by `checkpoint_name`, per trace: value index -> name.
_NAMES: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def checkpoint_name(tree: Any, name: str) -> Any:
    """`tree` unchanged, its arrays named `name` for the policies of an enclosing
    `accy.checkpoint` (`jax.ad_checkpoint.checkpoint_name`): `save_only_these_names(name)`
    stores them for the backward pass. Outside a checkpointed region it does nothing.

    >>> import accy, numpy as np
    >>> policy = accy.checkpoint_policies.save_only_these_names("h")
    >>> def f(x):
    ...     return accy.checkpoint_name(x.sin(), "h").sin()
    >>> x = accy.named(np.float32(1.0), ())
    >>> g = accy.grad(accy.checkpoint(f, policy=policy))(x)
    >>> bool(np.isclose(g.item(), np.cos(np.sin(1.0)) * np.cos(1.0)))
    True
    """
    if not isinstance(name, str):
        raise AccyError(f"accy.checkpoint_name: the name is a string, got {name!r}")

    def named(leaf: Any) -> Any:
        if isinstance(leaf, Value) and not getattr(leaf.builder, "finished", False):
            _NAMES.setdefault(leaf.builder, {})[leaf.index] = name
        return leaf

    return optree.tree_map(named, tree, namespace=NAMESPACE)


def _checked_policy(policy: Any) -> Policy:
    if policy is None:
        return checkpoint_policies.nothing_saveable
    if not callable(policy):
        raise AccyError(
            f"accy.checkpoint: policy={policy!r} is not a policy; give one of "
            "accy.checkpoint_policies (nothing_saveable, the default; everything_saveable; "
            "dots_saveable; dots_with_no_batch_dims_saveable; save_only_these_names(...); "
            "save_anything_except_these_names(...)) or a function (operation, name) -> bool"
        )
    return policy


def with_saved_marked(program: Program, names: dict[int, str], policy: Policy) -> Program:
    """`program` with each operation whose results `policy` stores marked with the attribute
    `SAVED` (`True`), which reverse mode of a `remat` scan reads (`transforms.scan_split`)."""
    operations = []
    for op in program.operations:
        if op.kind == "cond":  # reverse mode inlines both branches: their operations count too
            branches = {k: with_saved_marked(op.attrs[k], {}, policy) for k in BRANCHES}
            op = dataclasses.replace(op, attrs=op.attrs.replace(**branches))
        elif op.kind != "parameter":
            name = next((names[v] for v in op.results if v in names), None)
            if policy(op, name):
                op = dataclasses.replace(op, attrs=op.attrs.replace(**{SAVED: True}))
        operations.append(op)
    return Program(program.name, tuple(operations), program.outputs, program.value_types)


BRANCHES = ("true_body", "false_body")


class Checkpointed:
    """The function behind `accy.checkpoint(fn)`."""

    def __init__(self, fn: Callable, policy: Policy):
        self.fn = fn
        self.policy = policy
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 2 and not kwargs and isinstance(args[0], OpsApi):
            return args[0].checkpoint(self.fn, list(args[1]))  # the builder-style form
        if self.policy is checkpoint_policies.everything_saveable:
            return self.fn(*args, **kwargs)
        leaves, treedef = flatten((args, kwargs))
        outer = innermost([leaf for leaf in leaves if is_array(leaf)])
        builders = []

        def region(*args: Any, **kwargs: Any) -> Any:
            builder = innermost_trace()
            # Work on enclosing values inside the region is the region's (recomputed with it),
            # as a loop body's is: `x.sin()` on a closed-over traced `x` happens in here.
            builder.body = True
            builders.append(builder)
            return self.fn(*args, **kwargs)

        traced = trace(region, leaves, treedef, f"checkpoint_{_name(self.fn)}")
        if outer is None and traced.foreign:
            outer = innermost(traced.captured)
        if outer is None:  # nothing is traced: no differentiation to save memory for
            return self.fn(*args, **kwargs)
        values = [outer.lift(leaf) for leaf in leaves if is_array(leaf)]
        values += [outer.lift(c) for c in traced.captured]
        names = _NAMES.pop(builders[0], {})
        body = with_saved_marked(traced.program, names, self.policy)
        outputs = emit_region(outer, body, values)
        return unflatten(traced.out_treedef, outputs)

    def __repr__(self) -> str:
        return f"<accy.checkpoint of {self.fn!r}>"


def emit_region(builder: Any, program: Program, values: list) -> list:
    """`program` applied to `values` as a checkpointed region: the one-step `remat` scan of
    `OpsApi.checkpoint`."""
    attrs = {
        "body": program,
        "axis": CHECKPOINT_AXIS,
        "length": 1,
        "num_consts": len(values),
        "num_carry": 0,
        "reverse": False,
        "remat": True,
    }
    if not program.outputs:
        return []
    results = builder.emit("scan", values, attrs)
    results = results if isinstance(results, tuple) else (results,)
    return [
        builder.reshape(r, [(a, e) for a, e in r.ty.named_extents if a != CHECKPOINT_AXIS])
        for r in results
    ]


def checkpoint(fn: Callable | None = None, *, policy: Any = None) -> Any:
    """`fn` as a region whose intermediates reverse mode does not store: the backward pass
    recomputes them from the region's arguments, trading compute for memory
    (`jax.checkpoint`, also spelled `jax.remat`). `fn` takes and returns trees of arrays;
    `policy` (one of `checkpoint_policies`, or a function `(operation, name) -> bool`) says
    which intermediates are stored after all: `nothing_saveable` (None, the default),
    `everything_saveable` (no recomputation), `dots_saveable`, `save_only_these_names(...)` of
    values tagged with `checkpoint_name`, ... A builder-style `fn(builder, args)` works too:
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
    return Checkpointed(fn, _checked_policy(policy))


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


__all__ = [
    "Checkpointed",
    "Policy",
    "checkpoint",
    "checkpoint_name",
    "checkpoint_policies",
    "remat",
    "stop_gradient",
]
