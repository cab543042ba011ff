"""`accy.shard`: a Program or a function over named arrays, sharded over a mesh."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..core import Program
from ..errors import MeshError
from ..frontend.named import NamedArray
from ..frontend.tracing import as_array_leaf, flatten, leaf_paths, trace, unflatten
from ..transforms.simplify import simplify
from .executable import MeshExecutable
from .mesh import Mesh, check_axis_mapping
from .spmd import ShardedProgram, shard_program


class ShardedFunction:
    """A function over trees of named arrays run on every device of a simulated mesh: traced
    (once per signature) over the whole arrays, sharded, compiled for `device`; called with
    whole arrays, it returns whole arrays (cut into blocks and put back together around the
    run). `.sharded(*args)` gives the `ShardedProgram` of a signature."""

    def __init__(self, fn: Callable, mesh: Mesh, axis_mapping: dict[str, str], device: str):
        self.fn, self.mesh, self.axis_mapping, self.device = fn, mesh, axis_mapping, device
        self._entries: dict[Any, tuple[MeshExecutable, Any, list[Any]]] = {}

    def _entry(self, args: tuple, kwargs: dict):
        tree = (args, kwargs)
        leaves, treedef = flatten(tree)
        paths = leaf_paths(tree)
        leaves = [as_array_leaf(x, f"argument{p}") for x, p in zip(leaves, paths, strict=True)]
        key = (treedef, tuple(x.ty for x in leaves))
        if key not in self._entries:

            def call(*a: Any, **k: Any) -> Any:
                return self.fn(*a, **k)

            traced = trace(call, leaves, treedef, getattr(self.fn, "__name__", "function"))
            sharded = shard_program(simplify(traced.program), self.mesh, self.axis_mapping)
            captured = [np.asarray(c.array) for c in traced.captured]
            self._entries[key] = (MeshExecutable(sharded, device=self.device), traced, captured)
        return self._entries[key], leaves

    def sharded(self, *args: Any, **kwargs: Any) -> ShardedProgram:
        (executable, _, _), _ = self._entry(args, kwargs)
        return executable.sharded

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        (executable, traced, captured), leaves = self._entry(args, kwargs)
        outputs = executable(*[np.asarray(x.array) for x in leaves], *captured)
        types = executable.sharded.source.output_types
        named = [NamedArray(o, t, "cpu") for o, t in zip(outputs, types, strict=True)]
        return unflatten(traced.out_treedef, named)


def shard(
    fn_or_program: Callable | Program,
    mesh: Mesh,
    axis_mapping: Mapping[str, str],
    *,
    device: str = "cpu",
) -> ShardedProgram | ShardedFunction:
    """Shard a Program (-> its `ShardedProgram`: the per-device program, and how arrays split)
    or a function over named arrays (-> a `ShardedFunction`, run on a simulated mesh of
    `device` "cpu" or "reference") over `mesh`, each device holding its block of every axis
    `axis_mapping` maps to a mesh axis.

    >>> import accy, numpy as np
    >>> mesh = accy.Mesh(range(2), "data")
    >>> mean = accy.shard(lambda x: x.mean("batch"), mesh, {"batch": "data"})
    >>> mean(accy.named(np.arange(8, dtype=np.float32).reshape(4, 2), ("batch", "f"))).array
    array([3., 4.], dtype=float32)
    """
    if not isinstance(mesh, Mesh):
        raise MeshError(f"shard needs an accy.Mesh, got {mesh!r}")
    mapping = check_axis_mapping(mesh, axis_mapping)
    if isinstance(fn_or_program, Program):
        return shard_program(fn_or_program, mesh, mapping)
    if not callable(fn_or_program):
        raise MeshError(f"shard needs a Program or a function, got {fn_or_program!r}")
    return ShardedFunction(fn_or_program, mesh, mapping, device)


def compile(sharded: ShardedProgram, device: str = "cpu") -> MeshExecutable:  # noqa: A001
    """The executable of a sharded program on its simulated mesh (see `MeshExecutable`)."""
    return MeshExecutable(sharded, device=device)


__all__ = ["ShardedFunction", "compile", "shard"]
