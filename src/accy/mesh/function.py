"""`accy.shard`: a Program or a function over named arrays, sharded over a mesh."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..backends.devices import CPU, Device, as_device
from ..caches import Group
from ..core import Program
from ..errors import AccyError, MeshError
from ..frontend.functions import donated_inputs
from ..frontend.named import NamedArray, intern
from ..frontend.tracing import as_array_leaf, flatten, leaf_paths, trace, unflatten
from ..transforms.simplify import simplify
from .executable import SIMULATED_DEVICES, MeshExecutable
from .mesh import Mesh, check_axis_mapping
from .spmd import ShardedProgram, local_type, shard_program

# Each sharded function's programs per signature (accy.clear_caches() empties them).
SHARDED_SIGNATURES = Group("sharded signatures", "jit_signatures_max_entries")


class ShardedFunction:
    """A function over trees of named arrays, traced (once per signature) over the whole arrays
    and sharded. `.sharded(*args)` gives the `ShardedProgram` of a signature.

    - On a simulated mesh (`device` "cpu" or "reference"): called with whole arrays, it
      returns whole arrays (cut into blocks and put back together around the run).
    - On GPUs (`device="cuda"`, one process per GPU, `distributed` its `accy.mesh.nccl
      .Distributed`): every argument is either the whole array or this device's block of it,
      and the results are this device's blocks (whole where replicated, as the parameters of
      data parallelism). So a training loop feeds the results back as they come, and a batch
      made whole on every process is cut to each device's part. The arrays of positional
      arguments `donate_argnums` are donated there, as `accy.jit`'s: a result that can take a
      donated array's memory is that array (parameters and optimizer state updated in place);
      a donated array must not be used after the call. A simulated mesh cuts the arrays and
      puts them back together around each run, so it ignores donation.
    """

    def __init__(
        self,
        fn: Callable,
        mesh: Mesh,
        axis_mapping: dict[str, str],
        device: str,
        distributed: Any = None,
        precision: str = "f32",
        donate_argnums: tuple[int, ...] = (),
    ):
        self.fn, self.mesh, self.axis_mapping, self.device = fn, mesh, axis_mapping, device
        self.distributed, self.precision = distributed, precision
        self.donate_argnums = tuple(donate_argnums)
        self._entries = SHARDED_SIGNATURES.table()

    def _entry(self, args: tuple, kwargs: dict) -> tuple[_Entry, list[Any]]:
        tree = (args, kwargs)
        leaves, treedef = flatten(tree)
        # Named arrays pass as they are; the paths (for the errors of a conversion) are only
        # worked out when some leaf is not one: a training step passes hundreds every call.
        if set(map(type, leaves)) != {NamedArray}:
            paths = leaf_paths(tree)
            leaves = [as_array_leaf(x, f"argument{p}") for x, p in zip(leaves, paths, strict=True)]
        types = tuple(x.ty for x in leaves)
        key = (treedef, types)
        entry = self._entries.get(key)
        if entry is None and (entry := self._local_entry(treedef, types)) is not None:
            self._entries.put(key, entry)  # the next call with these types finds it at once
        if entry is None:

            def call(*a: Any, **k: Any) -> Any:
                return self.fn(*a, **k)

            donate = donated_inputs(self.donate_argnums, leaves, treedef, "shard")
            traced = trace(call, leaves, treedef, getattr(self.fn, "__name__", "function"))
            sharded = shard_program(simplify(traced.program), self.mesh, self.axis_mapping)
            executable = self._executable(sharded, donate)
            entry = self._entries.put(key, _Entry(executable, traced, sharded))
        return entry, leaves

    def _executable(self, sharded: ShardedProgram, donate: tuple[int, ...]) -> Any:
        if self.distributed is None:
            return MeshExecutable(sharded, device=self.device)
        from .nccl import NcclExecutable  # CuPy only on GPUs

        return NcclExecutable(sharded, self.distributed, precision=self.precision, donate=donate)

    def _local_entry(self, treedef: Any, types: tuple) -> _Entry | None:
        """On GPUs: the entry whose every parameter is given whole or as this device's block."""
        if self.distributed is None:
            return None
        for (known, _), entry in self._entries.items():
            if known == treedef and all(
                t in (whole, local)
                for t, whole, local in zip(
                    types, entry.whole_types, entry.local_types, strict=False
                )
            ):
                return entry
        return None

    def sharded(self, *args: Any, **kwargs: Any) -> ShardedProgram:
        entry, _ = self._entry(args, kwargs)
        return entry.sharded

    def executable(self, *args: Any, **kwargs: Any) -> Any:
        """What runs the call on these arguments: a `MeshExecutable` (simulated mesh), or on
        GPUs an `accy.mesh.nccl.NcclExecutable` (its `mode`: one CUDA graph, or segments).

        >>> import accy
        >>> mesh = accy.mesh.Mesh(range(2), "data")
        >>> f = accy.shard(lambda x: (x * 2.0).sum("batch"), mesh, {"batch": "data"})
        >>> type(f.executable(accy.named(np.ones(4, np.float32), "batch"))).__name__
        'MeshExecutable'
        """
        entry, _ = self._entry(args, kwargs)
        return entry.executable

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        entry, leaves = self._entry(args, kwargs)
        if self.distributed is not None:
            return self._call_local(entry, leaves)
        captured = [np.asarray(c.array) for c in entry.traced.captured]
        outputs = entry.executable(*[np.asarray(x.array) for x in leaves], *captured)
        types = entry.sharded.source.output_types
        named = [NamedArray(o, t, CPU) for o, t in zip(outputs, types, strict=True)]
        return unflatten(entry.traced.out_treedef, named)

    def _call_local(self, entry: _Entry, leaves: list[Any]) -> Any:
        rank = self.distributed.rank
        if entry.captured is None:  # this device's blocks of the captured constants, kept
            count = len(leaves)
            entry.captured = [
                entry.block(rank, count + i, np.asarray(c.array))
                for i, c in enumerate(entry.traced.captured)
            ]
        arrays = [x.array for x in leaves]
        for i in entry.cut:  # only the parameters with a mapped axis can be given whole
            arrays[i] = entry.block(rank, i, arrays[i])
        outputs = entry.executable(*arrays, *entry.captured)
        named = list(
            map(NamedArray, outputs, entry.local_output_types, itertools.repeat(self.device))
        )
        return unflatten(entry.traced.out_treedef, named)


class _Entry:
    """One traced signature: its executable, the trace, and the whole and local parameter
    types (a process mesh accepts either)."""

    def __init__(self, executable: Any, traced: Any, sharded: ShardedProgram):
        self.executable, self.traced, self.sharded = executable, traced, sharded
        # Interned, as NamedArrays' types are, so that comparing them is comparing identities
        # (a training step passes and returns hundreds of arrays every call).
        self.whole_types = tuple(map(intern, sharded.source.parameter_types))
        self.local_types = tuple(
            intern(local_type(t, s, sharded.mesh))
            for t, s in zip(self.whole_types, sharded.input_shardings, strict=True)
        )
        self.local_output_types = tuple(
            intern(local_type(t, s, sharded.mesh))
            for t, s in zip(sharded.source.output_types, sharded.output_shardings, strict=True)
        )
        # The parameters that a caller may give whole where this device holds a block.
        pairs = enumerate(zip(self.whole_types, self.local_types, strict=True))
        self.cut = tuple(i for i, (whole, local) in pairs if whole is not local)
        self.captured: list[Any] | None = None

    def block(self, rank: int, i: int, array: Any) -> Any:
        """Parameter `i`'s array for device `rank`: as it is when it is the block already."""
        whole, local = self.whole_types[i], self.local_types[i]
        if whole is local or tuple(array.shape) == local.extents:
            return array
        cut = array[self.sharded.block(rank, whole, self.sharded.input_shardings[i])]
        return np.ascontiguousarray(cut) if isinstance(cut, np.ndarray) else cut.copy()


def shard(
    fn_or_program: Callable | Program,
    mesh: Mesh,
    axis_mapping: Mapping[str, str],
    *,
    device: str | Device = "cpu",
    distributed: Any = None,
    precision: str = "f32",
    donate_argnums: tuple[int, ...] = (),
) -> ShardedProgram | ShardedFunction:
    """Shard a Program (-> its `ShardedProgram`: the per-device program, and how arrays split)
    or a function over named arrays (-> a `ShardedFunction`) over `mesh`, each device holding
    its block of every axis `axis_mapping` maps to a mesh axis. A function runs on a simulated
    mesh (`device` "cpu" or "reference"), or with `device="cuda"` on this process's GPU, its
    collectives through NCCL (`distributed`: this process's `accy.mesh.nccl.Distributed`;
    `precision="tf32"` lets f32 GEMMs use TF32; `donate_argnums` donates those positional
    arguments' arrays on GPUs, as `accy.jit`'s).

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
    given = device
    try:
        device = as_device(device)
    except AccyError:
        device = None  # named below, with what a sharded function runs on
    if device is not None and device.is_cuda and distributed is None:
        raise MeshError(
            "shard(..., device='cuda') runs one process per GPU: pass distributed="
            "accy.mesh.nccl.Distributed(mesh) (made in each process started by accy launch)"
        )
    if device is None or (not device.is_cuda and device not in SIMULATED_DEVICES):
        raise MeshError(
            f"shard: device {given!r}; a function runs on a simulated mesh "
            f"({', '.join(map(str, SIMULATED_DEVICES))}) or on GPUs ('cuda', with distributed=...)"
        )
    return ShardedFunction(
        fn_or_program, mesh, mapping, device, distributed, precision, tuple(donate_argnums)
    )


def compile(sharded: ShardedProgram, device: str | Device = "cpu") -> MeshExecutable:  # noqa: A001
    """The executable of a sharded program on its simulated mesh (see `MeshExecutable`)."""
    return MeshExecutable(sharded, device=device)


__all__ = ["ShardedFunction", "compile", "shard"]
