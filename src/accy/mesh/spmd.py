"""The SPMD transform: a program over whole arrays -> the program each device of a mesh runs.

`shard_program(program, mesh, axis_mapping)` walks the program once. Every value gets a
*sharding*: which of its axes are split over which mesh axis (each device holds its block of
them), and over which mesh axes it is *partial* (each device holds a term of a sum that is not
yet taken). Parameters and outputs have the canonical sharding of their type: every axis that
the mapping names is split over its mesh axis (if two axes of one value map to the same mesh
axis, the one listed first in the mapping wins, the other stays whole). In between, shardings
follow the data, and collectives go where an operation needs what another device holds:

- elementwise operations work on blocks alike; an operand that is whole where another is split
  is cut to its own block locally (no communication: `axis_index` picks it);
- a sum or a contraction over a split axis is done locally and leaves a *partial* value, made
  whole by `psum`, or by `reduce_scatter` when the value has an axis mapped to that mesh axis
  (the gradient of a parameter that is sharded itself: ZeRO/FSDP);
- an operation that needs a split axis whole (a slice, a pad or a concatenation along it, a
  gather along it, a max over it, a reshape that regroups it, a scan, a custom call along an
  axis it does not map over) gets it by `all_gather`; a custom call that maps over an axis
  (`accy.CustomCall(mapped_axes=...)`: attention over its batch and head axes) runs on the
  blocks;
- when an operation would split two axes of its result over one mesh axis, the axis listed
  first in the mapping keeps it, the other is all-gathered first (a sharded parameter meeting a
  sharded batch: FSDP's gather of the parameters).

So the mapping alone chooses the scheme: `{"batch": "data"}` is data parallelism (parameters
whole on every device, gradients psum-med before the update); adding a parameter axis,
`{"batch": "data", "hidden": "data"}`, shards that axis of the parameters and of the optimizer
state over the same devices (gradients reduce-scattered, the update done on each device's
block, the parameters all-gathered where they are used).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core import Operation, Program
from ..core.arrays import is_array
from ..core.builder import Builder
from ..core.kinds.contraction import dimensions
from ..core.kinds.control import custom_call_record
from ..core.types import TensorType, i32
from ..core.walk import run
from ..errors import MeshError
from ..transforms.simplify import simplify
from .mesh import Mesh, check_axis_mapping


@dataclass(frozen=True)
class Sharding:
    """How one value is spread over the mesh: `axes` maps split program axes to their mesh axis;
    `partial` lists the mesh axes over which the devices hold terms of a pending sum."""

    axes: tuple[tuple[str, str], ...] = ()
    partial: frozenset[str] = field(default_factory=frozenset)

    @property
    def split(self) -> dict[str, str]:
        return dict(self.axes)

    def used(self) -> set[str]:
        """The mesh axes this value already uses (a mesh axis splits at most one axis)."""
        return {m for _, m in self.axes} | set(self.partial)

    def __str__(self) -> str:
        parts = [f"{a}->{m}" for a, m in self.axes]
        parts += [f"partial({m})" for m in sorted(self.partial)]
        return "{" + ", ".join(parts) + "}"


REPLICATED = Sharding()


@dataclass(frozen=True)
class Sharded:
    """A value of the per-device program and the sharding it has."""

    value: Any
    sharding: Sharding


def local_type(t: TensorType, sharding: Sharding, mesh: Mesh) -> TensorType:
    """The per-device type of a value of global type `t`."""
    split = sharding.split
    return t.with_axes(
        (a, e // mesh.shape[split[a]] if a in split else e) for a, e in t.named_extents
    )


def canonical(
    t: TensorType, mesh: Mesh, mapping: Mapping[str, str], where: str | None = None
) -> Sharding:
    """The sharding of parameters and outputs: every mapped axis of `t` split over its mesh axis,
    in the mapping's order, one axis per mesh axis. With `where`, an extent the devices cannot
    split is a MeshError naming it; otherwise that axis stays whole."""
    chosen: list[tuple[str, str]] = []
    used: set[str] = set()
    for axis, mesh_axis in mapping.items():
        if not t.has(axis) or mesh_axis in used:
            continue
        devices = mesh.shape[mesh_axis]
        if t.extent(axis) % devices:
            if where is not None:
                raise MeshError(
                    f"{where} ({t}): axis {axis!r} has extent {t.extent(axis)}, which the "
                    f"{devices} devices of mesh axis {mesh_axis!r} cannot split evenly; make it a "
                    f"multiple of {devices} or leave {axis!r} out of the axis mapping"
                )
            continue
        chosen.append((axis, mesh_axis))
        used.add(mesh_axis)
    return Sharding(tuple(chosen))


@dataclass
class ShardedProgram:
    """The per-device program of `source` on `mesh`, and where each device's data lies.

    `input_shardings[i]` / `output_shardings[i]` say which axes of parameter / output `i` are
    split over which mesh axis; `split` cuts whole arrays into every device's inputs and
    `assemble` puts every device's outputs back together.
    """

    program: Program
    source: Program
    mesh: Mesh
    axis_mapping: dict[str, str]
    input_shardings: tuple[Sharding, ...]
    output_shardings: tuple[Sharding, ...]

    def block(self, rank: int, t: TensorType, sharding: Sharding) -> tuple[slice, ...]:
        """Where device `rank`'s block of a value of global type `t` lies."""
        coordinates = self.mesh.coordinates(rank)
        split = sharding.split
        index = []
        for axis, extent in t.named_extents:
            if axis in split:
                size = extent // self.mesh.shape[split[axis]]
                start = coordinates[split[axis]] * size
                index.append(slice(start, start + size))
            else:
                index.append(slice(None))
        return tuple(index)

    def split(self, arrays: Sequence[Any]) -> list[list[np.ndarray]]:
        """Every device's inputs (by rank), cut from whole arrays (one per parameter).

        >>> import accy, numpy as np
        >>> p = accy.trace.define("s", [accy.spec(accy.f32, batch=4)], lambda b, a: a[0].sum())
        >>> sharded = shard_program(p, Mesh(range(2), "data"), {"batch": "data"})
        >>> [inputs[0].tolist() for inputs in sharded.split([np.arange(4.0)])]
        [[0.0, 1.0], [2.0, 3.0]]
        """
        arrays = self._checked(arrays)
        return [self.local(rank, arrays) for rank in range(self.mesh.size)]

    def local(self, rank: int, arrays: Sequence[Any]) -> list[Any]:
        """Device `rank`'s inputs, cut from whole arrays (NumPy, or CuPy ones on a GPU).

        >>> import accy, numpy as np
        >>> p = accy.trace.define("s", [accy.spec(accy.f32, batch=4)], lambda b, a: a[0].sum())
        >>> sharded = shard_program(p, Mesh(range(2), "data"), {"batch": "data"})
        >>> sharded.local(1, [np.arange(4.0)])[0].tolist()
        [2.0, 3.0]
        """
        arrays = self._checked(arrays)
        return [
            a[self.block(rank, t, s)].copy()  # C order; 0-d stays 0-d
            for a, t, s in zip(
                arrays, self.source.parameter_types, self.input_shardings, strict=True
            )
        ]

    def _checked(self, arrays: Sequence[Any]) -> list[Any]:
        types = self.source.parameter_types
        if len(arrays) != len(types):
            raise MeshError(
                f"sharded program {self.source.name!r} takes {len(types)} inputs, got {len(arrays)}"
            )
        arrays = [a if hasattr(a, "__cuda_array_interface__") else np.asarray(a) for a in arrays]
        for i, (a, t) in enumerate(zip(arrays, types, strict=True)):
            if a.shape != t.extents:
                raise MeshError(
                    f"sharded program {self.source.name!r}, input {i}: an array of shape "
                    f"{a.shape}, but the parameter is {t} (the whole array, before sharding)"
                )
        return arrays

    def assemble(self, outputs: Sequence[Sequence[Any]]) -> list[np.ndarray]:
        """The whole outputs, put together from every device's outputs (by rank)."""
        whole = []
        for i, (t, s) in enumerate(
            zip(self.source.output_types, self.output_shardings, strict=True)
        ):
            result = np.empty(t.extents, dtype=np.asarray(outputs[0][i]).dtype)
            for rank in range(self.mesh.size):
                result[self.block(rank, t, s)] = np.asarray(outputs[rank][i])
            whole.append(result)
        return whole


class _Transform:
    """Semantics over `Sharded` values that emits the per-device program into a Builder."""

    def __init__(self, source: Program, mesh: Mesh, mapping: dict[str, str], builder: Builder):
        self.mesh = mesh
        self.mapping = mapping
        self.priority = {axis: i for i, axis in enumerate(mapping)}
        self.e = builder
        self.source = source
        self.producers = {r: op for op in source.operations for r in op.results}
        self.input_shardings: dict[int, Sharding] = {}
        self.uses: dict[int, int] = {}
        for op in source.operations:
            for v in op.operands:
                self.uses[v] = self.uses.get(v, 0) + 1
        self.resolved: dict[int, Sharded] = {}

    # -- building blocks ------------------------------------------------------------------------

    def attrs(self, mesh_axis: str, **extra: Any) -> dict[str, Any]:
        return {"mesh_axis": mesh_axis, "size": self.mesh.shape[mesh_axis], **extra}

    def with_axes(self, x: Sharded, axes: dict[str, str], value: Any = None) -> Sharded:
        ordered = tuple((a, axes[a]) for a in sorted(axes, key=self.rank_of))
        return Sharded(x.value if value is None else value, Sharding(ordered, x.sharding.partial))

    def rank_of(self, axis: str) -> int:
        return self.priority.get(axis, len(self.priority))

    def gather_axis(self, x: Sharded, axis: str) -> Sharded:
        """`x` with `axis` whole on every device (all_gather)."""
        split = x.sharding.split
        mesh_axis = split.pop(axis)
        value = self.e.emit("all_gather", [x.value], self.attrs(mesh_axis, axis=axis))
        return self.with_axes(x, split, value)

    def take_axis(self, x: Sharded, axis: str, mesh_axis: str) -> Sharded:
        """`x`, whole along `axis`, cut to this device's block of it: a local gather of the rows
        `position * block + (0..block-1)` (no communication)."""
        e = self.e
        block = x.value.ty.extent(axis) // self.mesh.shape[mesh_axis]
        position = e.emit("axis_index", [], self.attrs(mesh_axis))
        start = e.mul(position, e.scalar(i32, block))
        rows = e.add(e.iota(TensorType(i32, ((axis, block),)), axis), start)
        value = e.gather(x.value, rows, axis)
        split = x.sharding.split
        split[axis] = mesh_axis
        return self.with_axes(x, split, value)

    def resolve(
        self, x: Sharded, target: Mapping[str, str] | None = None, keep=frozenset()
    ) -> Sharded:
        """`x` with its pending sums taken, except over the mesh axes in `keep`: by
        `reduce_scatter` onto an axis mapped to that mesh axis where there is one that is whole
        (the axis `target` splits over it first), else by `psum`."""
        for mesh_axis in sorted(x.sharding.partial - set(keep)):
            split = x.sharding.split
            wanted = self.mapping if target is None else target
            axis = next(
                (
                    a
                    for a, m in wanted.items()
                    if m == mesh_axis
                    and x.value.ty.has(a)
                    and a not in split
                    and x.value.ty.extent(a) % self.mesh.shape[mesh_axis] == 0
                ),
                None,
            )
            partial = x.sharding.partial - {mesh_axis}
            if axis is None:
                value = self.e.emit("psum", [x.value], self.attrs(mesh_axis))
            else:
                value = self.e.emit("reduce_scatter", [x.value], self.attrs(mesh_axis, axis=axis))
                split[axis] = mesh_axis
            x = self.with_axes(Sharded(value, Sharding((), partial)), split)
        return x

    def reshard(self, x: Sharded, target: Mapping[str, str], keep=frozenset()) -> Sharded:
        """`x` split exactly as `target` says (partial only over `keep`)."""
        x = self.resolve(x, target, keep)
        for axis, mesh_axis in list(x.sharding.axes):
            if target.get(axis) != mesh_axis:
                x = self.gather_axis(x, axis)
        for axis, mesh_axis in target.items():
            if axis not in x.sharding.split:
                x = self.take_axis(x, axis, mesh_axis)
        return x

    def choose(self, t: TensorType, candidates: Mapping[str, str], used=()) -> dict[str, str]:
        """The split axes of a result of type `t` from the `candidates` the operands bring, one
        per mesh axis (none in `used`), the mapping's order deciding."""
        chosen: dict[str, str] = {}
        taken = set(used)
        for axis in sorted(candidates, key=self.rank_of):
            mesh_axis = candidates[axis]
            divisible = t.has(axis) and t.extent(axis) % self.mesh.shape[mesh_axis] == 0
            if divisible and mesh_axis not in taken:
                chosen[axis] = mesh_axis
                taken.add(mesh_axis)
        return chosen

    def local_attrs(self, op: Operation, name: str, split: Mapping[str, str]):
        """`op`'s named-extents attribute `name` (a shape) with the split axes' local extents."""
        shape = tuple(
            (a, e // self.mesh.shape[split[a]] if a in split else e) for a, e in op.attrs[name]
        )
        return op.attrs.replace(**{name: shape})

    def replicate_all(self, args: Sequence[Sharded]) -> list[Any]:
        return [self.reshard(x, {}).value for x in args]

    # -- the walk ------------------------------------------------------------------------------

    def bind(self, op: Operation, args: list[Sharded]) -> Any:
        if op.kind == "parameter":
            t = op.type
            sharding = canonical(
                t, self.mesh, self.mapping, f"parameter {op.attrs['index']} of {self.source.name!r}"
            )
            self.input_shardings[op.attrs["index"]] = sharding
            value = self.e.parameter(local_type(t, sharding, self.mesh), op.attrs["index"])
            return Sharded(value, sharding)
        rule = RULES.get(op.kind, _replicated)
        return rule(self, op, [self.once(v, x) for v, x in zip(op.operands, args, strict=True)])

    def once(self, source_value: int, x: Sharded) -> Sharded:
        """A pending sum read by several operations is taken once, where it is first read (each
        reader carrying it further would take as many sums of different values)."""
        if not x.sharding.partial or self.uses.get(source_value, 0) < 2:
            return x
        if source_value not in self.resolved:
            self.resolved[source_value] = self.resolve(x)
        return self.resolved[source_value]

    def finish(self, outputs: list[Sharded]) -> tuple[Program, list[Sharding]]:
        values, shardings = [], []
        for i, (x, t) in enumerate(zip(outputs, self.source.output_types, strict=True)):
            target = canonical(t, self.mesh, self.mapping, f"output {i} of {self.source.name!r}")
            x = self.reshard(x, target.split)
            values.append(x.value)
            shardings.append(x.sharding)
        return self.e.build(values), shardings


# -- per-kind rules ------------------------------------------------------------------------------
# rule(transform, op, args) -> Sharded (or a tuple of them); `op` is the whole-array operation.


def _replicated(s: _Transform, op: Operation, args: list[Sharded]) -> Any:
    """Any kind: every operand made whole, the operation as it is (correct for every kind)."""
    result = s.e.emit(op.kind, s.replicate_all(args), op.attrs)
    if isinstance(result, tuple):
        return tuple(Sharded(r, REPLICATED) for r in result)
    return Sharded(result, REPLICATED)


def _custom_call(s: _Transform, op: Operation, args: list[Sharded]) -> Any:
    """A call that maps over some axes (`accy.CustomCall(mapped_axes=...)`: attention's batch
    and head axes) runs on each device's blocks of those its operands bring split, every other
    axis whole; any other call runs whole on every device."""
    record = custom_call_record(op.attrs)
    mapped = record.mapped_axes_for(op.operand_types) if record is not None else frozenset()
    candidates = {a: m for x in args for a, m in x.sharding.split.items() if a in mapped}
    target = s.choose(op.type, candidates)
    if not target:
        return _replicated(s, op, args)
    operands = [
        s.reshard(x, {a: m for a, m in target.items() if t.has(a)})
        for x, t in zip(args, op.operand_types, strict=True)
    ]
    local = local_type(op.type, Sharding(tuple(target.items())), s.mesh)
    value = s.e.emit(op.kind, [x.value for x in operands], op.attrs.replace(type=local))
    return s.with_axes(Sharded(value, REPLICATED), target)


def _creation(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    """Constants and iotas are made whole, except a splat constant: every block of it is the
    same, so its mapped axes are split at once."""
    if op.kind != "constant" or is_array(op.attrs["value"]):  # an array constant: whole
        return Sharded(s.e.emit(op.kind, [], op.attrs), REPLICATED)
    split = s.choose(op.type, s.mapping)
    local = local_type(op.type, Sharding(tuple(split.items())), s.mesh)
    value = s.e.emit("constant", [], op.attrs.replace(type=local))
    return s.with_axes(Sharded(value, REPLICATED), split)


def _linear_partials(op: Operation, args: list[Sharded]) -> frozenset[str]:
    """The pending sums an elementwise operation can carry through: it is linear in them."""
    partials = [x.sharding.partial for x in args]
    kind = op.kind
    if kind == "unary" and op.attrs["op"] == "neg" or kind == "convert" and op.type.dtype.is_float:
        return partials[0]
    if kind in ("add", "sub") and partials[0] and all(p == partials[0] for p in partials):
        return partials[0]
    carrying = [p for p in partials if p]
    if kind == "mul" and len(carrying) == 1:
        return carrying[0]
    if kind == "div" and partials[0] and not partials[1]:
        return partials[0]
    return frozenset()


def _elementwise(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    keep = _linear_partials(op, args)
    candidates: dict[str, str] = {}
    for x in args:
        candidates.update(x.sharding.split)
        for m in x.sharding.partial - keep:
            # A pending sum that must be taken lands on a mapped axis where it can.
            candidates.update(
                {a: mm for a, mm in s.mapping.items() if mm == m and a not in candidates}
            )
    target = s.choose(op.operand_types[0], candidates, keep)
    operands = [s.reshard(x, target, keep & x.sharding.partial) for x in args]
    value = s.e.emit(op.kind, [x.value for x in operands], op.attrs)
    return Sharded(value, Sharding(tuple(target.items()), keep))


def _broadcast(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    """Axes the broadcast adds are the same on every block: a mapped one is made split at
    once (each device broadcasts to its block only, no communication)."""
    (x,) = args
    added = {
        a: m for a, m in s.mapping.items() if op.type.has(a) and a not in op.operand_types[0].axes
    }
    split = {**x.sharding.split, **s.choose(op.type, added, x.sharding.used())}
    value = s.e.emit(op.kind, [x.value], s.local_attrs(op, "shape", split))
    return s.with_axes(Sharded(value, x.sharding), split)


def _transpose(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    (x,) = args
    return Sharded(s.e.emit(op.kind, [x.value], op.attrs), x.sharding)


def _reshape(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    """A split axis stays split where the reshape leaves it and every axis before it alone
    (row-major blocks then stay each device's own); others are gathered first."""
    (x,) = args
    before, after = op.operand_types[0].named_extents, op.type.named_extents
    for axis in list(x.sharding.split):
        position = op.operand_types[0].position(axis)
        if after[: position + 1] != before[: position + 1]:
            x = s.gather_axis(x, axis)
    value = s.e.emit(op.kind, [x.value], s.local_attrs(op, "shape", x.sharding.split))
    return Sharded(value, x.sharding)


def _is_zero(s: _Transform, op: Operation, operand: int) -> bool:
    producer = s.producers.get(op.operands[operand])
    return producer is not None and producer.kind == "constant" and producer.attrs["value"] == 0


def _reduce(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    x, init = args
    init = s.reshard(init, {})
    reduced = op.attrs["axes"]
    e = s.e
    if op.attrs["op"] != "sum":
        x = s.resolve(x)
        for axis in reduced:
            if axis in x.sharding.split:
                x = s.gather_axis(x, axis)
        value = e.emit("reduce", [x.value, init.value], op.attrs)
        return Sharded(value, x.sharding)
    split = x.sharding.split
    pending = frozenset(split[a] for a in reduced if a in split)
    kept = {a: m for a, m in split.items() if a not in reduced}
    if not pending:
        value = e.emit("reduce", [x.value, init.value], op.attrs)
        return s.with_axes(Sharded(value, x.sharding), kept)
    # Each device sums its block: the init must be added once, not once per device.
    zero = init.value if _is_zero(s, op, 1) else e.scalar(op.type.dtype, 0)
    value = e.emit("reduce", [x.value, zero], op.attrs)
    result = Sharded(value, Sharding(tuple(kept.items()), x.sharding.partial | pending))
    if _is_zero(s, op, 1):
        return result
    result = s.resolve(result)
    total = e.add(result.value, e.broadcast_to(init.value, result.value.ty))
    return Sharded(total, result.sharding)


def _dot_general(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    lhs, rhs = args
    if lhs.sharding.partial and rhs.sharding.partial:
        rhs = s.resolve(rhs)
    lt, rt = op.operand_types
    lc, rc, lb, rb = dimensions(op.attrs)
    ls, rs = lhs.sharding.split, rhs.sharding.split
    # Paired axes (contracted or batch) must be split alike on both sides.
    for l, r in zip(lc + lb, rc + rb, strict=True):
        al, ar = lt.axes[l], rt.axes[r]
        ml, mr = ls.get(al), rs.get(ar)
        if ml == mr:
            continue
        if (
            ml
            and not mr
            and ml not in {*rs.values(), *rhs.sharding.partial}
            and rt.extent(ar) % s.mesh.shape[ml] == 0
        ):
            rs[ar] = ml
        elif (
            mr
            and not ml
            and mr not in {*ls.values(), *lhs.sharding.partial}
            and lt.extent(al) % s.mesh.shape[mr] == 0
        ):
            ls[al] = mr
        else:
            ls.pop(al, None)
            rs.pop(ar, None)
    partial = lhs.sharding.partial | rhs.sharding.partial
    partial |= {ls[lt.axes[l]] for l in lc if lt.axes[l] in ls}
    # The result's split axes: one per mesh axis, none over a pending sum, the mapping deciding.
    result_axes = [
        (lt.axes[l], ls, lt.axes[l], rs, rt.axes[r]) for l, r in zip(lb, rb, strict=True)
    ]
    result_axes += [
        (a, ls, a, None, None) for a in lt.axes if a in ls and lt.axes.index(a) not in lc + lb
    ]
    result_axes += [
        (a, rs, a, None, None) for a in rt.axes if a in rs and rt.axes.index(a) not in rc + rb
    ]
    taken = set(partial)
    for _, side, axis, other, other_axis in sorted(result_axes, key=lambda r: s.rank_of(r[0])):
        mesh_axis = side.get(axis)
        if mesh_axis is None:
            continue
        if mesh_axis in taken:
            side.pop(axis)
            if other is not None:
                other.pop(other_axis, None)
        else:
            taken.add(mesh_axis)
    lhs = s.reshard(lhs, ls, lhs.sharding.partial)
    rhs = s.reshard(rhs, rs, rhs.sharding.partial)
    value = s.e.emit("dot_general", [lhs.value, rhs.value], op.attrs)
    split = {lt.axes[l]: ls[lt.axes[l]] for l in lb if lt.axes[l] in ls}
    split.update({a: m for a, m in ls.items() if lt.axes.index(a) not in lc + lb})
    split.update({a: m for a, m in rs.items() if rt.axes.index(a) not in rc + rb})
    return s.with_axes(Sharded(value, Sharding((), frozenset(partial))), split)


def _gather(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    """The table is gathered whole along the indexed axis; its other axes and the indices'
    axes keep their splits (one per mesh axis, the mapping deciding)."""
    table, indices = s.resolve(args[0], keep=args[0].sharding.partial), s.resolve(args[1])
    axis = op.attrs["axis"]
    candidates = {**table.sharding.split, **indices.sharding.split}
    candidates.pop(axis, None)
    target = s.choose(op.type, candidates, table.sharding.partial)
    table_axes, index_axes = op.operand_types[0].axes, op.operand_types[1].axes
    table = s.reshard(
        table, {a: m for a, m in target.items() if a in table_axes}, table.sharding.partial
    )
    indices = s.reshard(indices, {a: m for a, m in target.items() if a in index_axes})
    value = s.e.emit("gather", [table.value, indices.value], op.attrs)
    return Sharded(value, Sharding(tuple(target.items()), table.sharding.partial))


def _scatter_add(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    """Into a zero operand (a gather's transpose: an embedding's gradient), with the indices
    and updates split along an axis of the indices (the batch), each device can add its own
    updates into zeros of its own: the result is the sum over devices of what each added, a
    pending sum. That sum moves about twice the operand's bytes (a ring all-reduce), gathering
    every device's updates first moves the updates' once: so it is done where the updates are
    the larger (a small vocabulary, many tokens). Otherwise (GPT-2's 50,304-row table against
    8,192 tokens a device), and into any other operand (which would be added once a device),
    it runs whole on every device."""
    _, indices, updates = args
    index_axes = op.operand_types[1].axes
    candidates = {a: m for x in (indices, updates) for a, m in x.sharding.split.items()}
    target = {a: m for a, m in s.choose(op.operand_types[1], candidates).items() if a in index_axes}
    summing_is_cheaper = op.operand_types[2].size > 2 * op.operand_types[0].size
    if not (target and summing_is_cheaper and _is_zero_splat(s, op.operands[0])):
        return _replicated(s, op, args)
    zeros = s.e.zeros(op.operand_types[0])  # whole, made here: nothing to gather
    indices = s.reshard(indices, target)
    updates = s.reshard(updates, target)
    value = s.e.emit("scatter_add", [zeros, indices.value, updates.value], op.attrs)
    return Sharded(value, Sharding((), frozenset(target.values())))


def _is_zero_splat(s: _Transform, value: int) -> bool:
    """Whether source value `value` is zeros: a splat constant 0, or one broadcast."""
    producer = s.producers.get(value)
    while producer is not None and producer.kind == "broadcast_in_dim":
        producer = s.producers.get(producer.operands[0])
    if producer is None or producer.kind != "constant":
        return False
    splat = producer.attrs["value"]
    return not isinstance(splat, tuple) and splat == 0


def _slice(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    (x,) = args
    t = op.operand_types[0]
    starts, limits, strides = op.attrs["starts"], op.attrs["limits"], op.attrs["strides"]
    for axis in list(x.sharding.split):
        i = t.position(axis)
        if (starts[i], limits[i], strides[i]) != (0, t.extents[i], 1):
            x = s.gather_axis(x, axis)
    local = x.value.ty.extents
    limits = tuple(local[i] if a in x.sharding.split else limits[i] for i, a in enumerate(t.axes))
    value = s.e.emit("slice", [x.value], op.attrs.replace(limits=limits))
    return Sharded(value, x.sharding)


def _pad(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    x, pad_value = s.resolve(args[0]), s.reshard(args[1], {})
    t = op.operand_types[0]
    for axis in list(x.sharding.split):
        i = t.position(axis)
        if (op.attrs["low"][i], op.attrs["high"][i], op.attrs["interior"][i]) != (0, 0, 0):
            x = s.gather_axis(x, axis)
    value = s.e.emit("pad", [x.value, pad_value.value], op.attrs)
    return Sharded(value, x.sharding)


def _concatenate(s: _Transform, op: Operation, args: list[Sharded]) -> Sharded:
    candidates: dict[str, str] = {}
    for x in args:
        candidates.update(x.sharding.split)
    candidates.pop(op.attrs["axis"], None)
    target = s.choose(op.type, candidates)
    operands = [s.reshard(x, target) for x in args]
    value = s.e.emit("concatenate", [x.value for x in operands], op.attrs)
    return Sharded(value, Sharding(tuple(target.items())))


RULES = {
    "custom_call": _custom_call,
    "constant": _creation,
    "iota": _creation,
    "broadcast_in_dim": _broadcast,
    "transpose": _transpose,
    "reshape": _reshape,
    "reduce": _reduce,
    "dot_general": _dot_general,
    "gather": _gather,
    "scatter_add": _scatter_add,
    "slice": _slice,
    "pad": _pad,
    "concatenate": _concatenate,
    **{
        kind: _elementwise
        for kind in (
            "unary",
            "add",
            "sub",
            "mul",
            "div",
            "pow",
            "max",
            "min",
            "compare",
            "select",
            "convert",
        )
    },
}
"""Sharding rules by kind; a kind not listed (scan, cond, while_loop, the collectives) runs
whole on every device (`_replicated`), as a custom call does along the axes it does not map
over."""


def shard_program(program: Program, mesh: Mesh, axis_mapping: Mapping[str, str]) -> ShardedProgram:
    """The per-device program of `program` on `mesh`, each device holding its block of every
    axis that `axis_mapping` maps (see the module docstring).

    >>> import accy
    >>> p = accy.trace.define("mean", [accy.spec(accy.f32, batch=8, feature=3)],
    ...                       lambda b, a: a[0].sum("batch") * (1.0 / 8))
    >>> sharded = shard_program(p, Mesh(range(4), "data"), {"batch": "data"})
    >>> print(sharded.program.parameter_types[0], sharded.program.count("psum"))
    f32[batch=2, feature=3] 1
    """
    mapping = check_axis_mapping(mesh, axis_mapping)
    if not isinstance(program, Program):
        raise MeshError(f"shard_program needs a Program, got {type(program).__name__}")
    transform = _Transform(program, mesh, mapping, Builder(f"{program.name}_spmd"))
    per_device, output_shardings = run(program, transform)
    # The rules emit locally what they need (an axis_index per cut, a collective per use):
    # common subexpressions merged, dead code dropped.
    per_device = simplify(per_device)
    inputs = tuple(transform.input_shardings[i] for i in range(len(program.parameters)))
    return ShardedProgram(per_device, program, mesh, mapping, inputs, tuple(output_shardings))


__all__ = [
    "REPLICATED",
    "Sharded",
    "ShardedProgram",
    "Sharding",
    "canonical",
    "local_type",
    "shard_program",
]
