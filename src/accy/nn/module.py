"""`Module`: layers as trees. A module is a frozen dataclass registered as a tree node, so
`accy.jit`, `accy.grad`, `accy.vmap` and the optimizers take it whole: its array (and module)
fields are the children, and its hyper-parameters (axis names, sizes, flags, functions) are
static, part of the tree's structure, as in Equinox.

A field is static when declared so (`accy.nn.field(static=True)`, also `accy.field`) or when
its value is a string, number, bool, dtype, function or a tuple of those; everything else (named
arrays, traced values, modules, lists and dicts of them, None) is a child.

>>> import accy, numpy as np
>>> class Scale(accy.nn.Module):
...     weight: accy.NamedArray
...     axis: str = "feature"
...     def __call__(self, x):
...         return x * self.weight
>>> m = Scale(accy.named(np.array([1.0, 2.0], np.float32), "feature"))
>>> g = accy.grad(lambda m, x: m(x).sum())(m, accy.named(np.ones(2, np.float32), "feature"))
>>> g.weight.array.tolist(), g.axis
([1.0, 1.0], 'feature')
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
import optree

from ..core import Value
from ..core.types import DType, TensorType
from ..errors import AccyError
from ..frontend.named import NamedArray
from ..frontend.tracing import NAMESPACE, leaf_paths, register_dataclass

STATIC_TYPES = (str, bool, int, float, complex, DType, TensorType, type, enum.Enum)


def field(*, static: bool = False, **kwargs: Any) -> Any:
    """A dataclass field of a `Module`; `static=True` makes it part of the tree's structure (a
    hyper-parameter) rather than a child, whatever its value. Other arguments are
    `dataclasses.field`'s.

    >>> import accy
    >>> class Norm(accy.nn.Module):
    ...     eps: float = accy.nn.field(static=True, default=1e-5)
    >>> Norm().eps
    1e-05
    """
    metadata = dict(kwargs.pop("metadata", None) or {})
    metadata["static"] = static
    return dataclasses.field(metadata=metadata, **kwargs)


def is_static_value(value: Any) -> bool:
    """Whether a field's value is a hyper-parameter: a string, number, bool, dtype, type,
    function (not a module) or a tuple of those.

    >>> is_static_value(("head", "dim")), is_static_value(None), is_static_value([1])
    (True, False, False)
    """
    if isinstance(value, STATIC_TYPES):
        return True
    if isinstance(value, tuple):
        return len(value) > 0 and all(is_static_value(v) for v in value)
    if isinstance(value, Module | NamedArray | Value | np.ndarray | np.generic):
        return False
    return callable(value)


def _is_static_field(f: dataclasses.Field, value: Any) -> bool:
    return bool(f.metadata.get("static")) or is_static_value(value)


class Module:
    """The base of layers: subclasses are frozen dataclasses (made so on definition) and tree
    nodes. Build them with their generated `__init__` or a classmethod (`Linear.init(...)`),
    change them with `replace`; `__call__` is the layer's computation."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__hash__" not in cls.__dict__:
            cls.__hash__ = object.__hash__  # identity, as the arrays inside are unhashable
        dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
        register_dataclass(cls, static=_is_static_field)

    def replace(self, **changes: Any) -> Module:
        """A copy with the fields in `changes` replaced (`init=False` fields kept too).

        >>> import accy, numpy as np
        >>> lin = accy.nn.Linear.init(accy.random.key(0), {"a": 2}, {"b": 3}, use_bias=False)
        >>> lin.replace(outputs=("c",)).outputs
        ('c',)
        """
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise AccyError(
                f"{type(self).__name__}.replace: no field {', '.join(map(repr, unknown))}; "
                f"its fields are {', '.join(sorted(names))}"
            )
        copy = object.__new__(type(self))
        for name in names:
            object.__setattr__(copy, name, changes.get(name, getattr(self, name)))
        return copy

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name, None)
            shown = str(value.ty) if isinstance(value, NamedArray | Value) else repr(value)
            parts.append(f"{f.name}={shown}")
        return f"{type(self).__name__}({', '.join(parts)})"


def _leaves_with_paths(tree: Any) -> tuple[list[str], list[Any], Any]:
    leaves, treedef = optree.tree_flatten(tree, namespace=NAMESPACE, none_is_leaf=True)
    return leaf_paths(tree), leaves, treedef


def is_array(leaf: Any) -> bool:
    """Whether `leaf` is an array (a NamedArray or a traced value).

    >>> import accy, numpy as np
    >>> is_array(accy.named(np.zeros(2), "a")), is_array(3.0)
    (True, False)
    """
    return isinstance(leaf, NamedArray | Value)


def is_float_array(leaf: Any) -> bool:
    """Whether `leaf` is an array of floating-point numbers (what is trained).

    >>> import accy, numpy as np
    >>> is_float_array(accy.named(np.zeros(2, np.float32), "a")), is_float_array(1.0)
    (True, False)
    """
    return is_array(leaf) and leaf.dtype.is_float


def is_matrix(leaf: Any) -> bool:
    """Whether `leaf` is a float array of rank 2 or more (matrices, embeddings, and biases
    over several axes such as {head, dim}).

    >>> import accy, numpy as np
    >>> is_matrix(accy.named(np.zeros((2, 3), np.float32), ("a", "b")))
    True
    """
    return is_float_array(leaf) and leaf.ty.rank >= 2


def decayed(path: str, leaf: Any, stacked_axes: Collection[str] = ()) -> bool:
    """Whether weight decay applies to the leaf at `path` (use with `partition(...,
    paths=True)`): a float array of rank 2 or more that is not a `bias` field, so matrices and
    embeddings but not gains and biases, as nanoGPT. Axes in `stacked_axes` (the axis a
    `Stacked` adds to its layers' arrays) do not count in the rank; `accy.nn.decay_mask` finds
    them for a whole model.

    >>> import accy
    >>> lin = accy.nn.Linear.init(accy.random.key(0), {"a": 2}, {"head": 2, "dim": 3})
    >>> decay, rest = accy.nn.partition(lin, accy.nn.decayed, paths=True)
    >>> decay.bias is None, rest.bias.shape
    (True, {'head': 2, 'dim': 3})
    """
    if not is_float_array(leaf) or path.endswith("['bias']"):
        return False
    return leaf.ty.rank - len(set(stacked_axes) & set(leaf.axes)) >= 2


def partition(tree: Any, keep: Callable[..., bool], *, paths: bool = False) -> tuple[Any, Any]:
    """Split `tree` into two trees of its structure: the first holds the leaves for which
    `keep(leaf)` is true (`keep(path, leaf)` with `paths=True`, the path as `leaf_paths` writes
    it: `['blocks'][0]['weight']`) and None elsewhere, the second the others. `combine` puts
    them back together: as Equinox's `partition`/`combine`, for training part of a model
    (frozen vs trainable) or grouping parameters (decay vs no decay).

    >>> import accy, numpy as np
    >>> lin = accy.nn.Linear.init(accy.random.key(0), {"a": 2}, {"b": 3})
    >>> matrices, rest = accy.nn.partition(lin, accy.nn.is_matrix)
    >>> matrices.bias is None, rest.weight is None, rest.bias.shape
    (True, True, {'b': 3})
    >>> accy.nn.combine(matrices, rest).weight.shape
    {'a': 2, 'b': 3}
    """
    where, leaves, treedef = _leaves_with_paths(tree)
    chosen = [
        leaf is not None and bool(keep(path, leaf) if paths else keep(leaf))
        for path, leaf in zip(where, leaves, strict=True)
    ]
    first = [leaf if c else None for leaf, c in zip(leaves, chosen, strict=True)]
    second = [None if c else leaf for leaf, c in zip(leaves, chosen, strict=True)]
    return treedef.unflatten(first), treedef.unflatten(second)


def combine(*trees: Any) -> Any:
    """One tree from trees of one structure (as `partition` makes): each leaf is the first of
    the trees' leaves there that is not None.

    >>> combine({"a": None, "b": 2}, {"a": 1, "b": None})
    {'a': 1, 'b': 2}
    """
    if not trees:
        raise AccyError("combine needs at least one tree")
    flat = [optree.tree_flatten(t, namespace=NAMESPACE, none_is_leaf=True) for t in trees]
    treedef = flat[0][1]
    for position, (_, other) in enumerate(flat[1:], 1):
        if other != treedef:
            raise AccyError(
                f"combine: tree {position} has another structure than tree 0 ({other} against "
                f"{treedef}); combine the two halves of one partition"
            )
    merged = [
        next((x for x in column if x is not None), None)
        for column in zip(*(f[0] for f in flat), strict=True)
    ]
    return treedef.unflatten(merged)


def parameter_count(tree: Any) -> int:
    """The number of array elements in `tree`.

    >>> import accy
    >>> parameter_count(accy.nn.Linear.init(accy.random.key(0), {"a": 2}, {"b": 3}))
    9
    """
    leaves = optree.tree_leaves(tree, namespace=NAMESPACE)
    return sum(leaf.ty.size for leaf in leaves if is_array(leaf))


__all__ = [
    "Module",
    "combine",
    "decayed",
    "field",
    "is_array",
    "is_float_array",
    "is_matrix",
    "is_static_value",
    "parameter_count",
    "partition",
]
