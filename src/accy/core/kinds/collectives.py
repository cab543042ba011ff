"""Collectives over a named mesh axis: `psum`, `all_gather`, `reduce_scatter`, `all_to_all`,
`ppermute`, and `axis_index` (a device's position along a mesh axis).

They appear in per-device (SPMD) programs, the programs `accy.mesh.shard` makes: every device
runs the same program on its own slice of the data, and a collective is where the devices meet.
Each names its mesh axis (`mesh_axis="data"`) and carries the number of devices along it
(`size`), so that its type rule needs no mesh; the devices that meet are those that differ only
in their position along that mesh axis (a group), ordered by that position.

- `psum` {mesh_axis, size}: the sum of the group's operands.
- `all_gather` {mesh_axis, size, axis}: the group's operands concatenated along `axis`
  (its extent times `size`).
- `reduce_scatter` {mesh_axis, size, axis}: the group's sum, cut along `axis` into `size`
  blocks; the device at position `i` keeps block `i`.
- `all_to_all` {mesh_axis, size, split_axis, concat_axis}: block `j` of `split_axis` goes to
  position `j`; the blocks received are concatenated along `concat_axis` in the senders' order.
- `ppermute` {mesh_axis, size, perm}: position `dst` receives the operand of position `src`
  for each `(src, dst)` of `perm`; a position that receives nothing gets zeros.
- `axis_index` {mesh_axis, size}: the device's position along the mesh axis (an i32 scalar).

Evaluation: the evaluator in `ev` gives the group's arrays (`ev.exchange(attrs, x)`); the NumPy
reference evaluator does so for a mesh axis of size 1, and `accy.mesh`'s mesh evaluator (which
runs every device's program in lockstep) for any size.

Differentiation treats every device's value as a variable of its own (the semantics of JAX's
`pmap`, and of `shard_map` without replication checking): all five collectives are linear, their
JVP is the same collective of the tangent, and their transposes are: `psum` -> `psum` (the
cotangent of each device's operand is the sum over the group of the cotangents of its
results), `all_gather` <-> `reduce_scatter`, `all_to_all` -> the `all_to_all` with the split and
concatenated axes exchanged, `ppermute` -> the inverse permutation. (JAX's `shard_map` with
replication typing distinguishes device-invariant values, whose cotangent is counted once, and
transposes `psum` into a no-op `pvary`; accy has no invariant type, and `accy.mesh.shard`
differentiates before sharding, so its gradients never need that distinction.)

Batching: each acts on every element alike along the axes it does not name, so a vmapped
collective is the same collective of the batched operand.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import AccyError, AxisError, DTypeError, TypeRuleError
from ..types import TensorType, bool_, i32
from .registry import (
    Rule,
    Zero,
    attr,
    batch_same_kind,
    check_arity,
    check_has_axes,
    register,
    zero_tangent,
)

COLLECTIVES = ("psum", "all_gather", "reduce_scatter", "all_to_all", "ppermute")
"""The kinds that exchange data between devices (`axis_index` only reads a position)."""


def _mesh_attrs(kind: str, attrs) -> tuple[str, int]:
    mesh_axis = attr(kind, attrs, "mesh_axis")
    size = attr(kind, attrs, "size")
    if not isinstance(mesh_axis, str) or not mesh_axis:
        raise TypeRuleError(f"{kind}: mesh_axis must be a mesh axis name, got {mesh_axis!r}")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise TypeRuleError(
            f"{kind}: size (the devices along mesh axis {mesh_axis!r}) must be an int >= 1, "
            f"got {size!r}"
        )
    return mesh_axis, size


def _check_numeric(kind: str, t: TensorType) -> None:
    if t.dtype == bool_:
        raise DTypeError(f"{kind} does not apply to bool operands ({t}); convert it first")


def _divided(kind: str, t: TensorType, axis: str, size: int, mesh_axis: str) -> int:
    extent = t.extent(axis)
    if extent % size:
        raise AxisError(
            f"{kind}: axis {axis!r} of {t} has extent {extent}, which the {size} devices of mesh "
            f"axis {mesh_axis!r} cannot split evenly; pad it to a multiple of {size}"
        )
    return extent // size


def _resized(t: TensorType, changes: dict[str, int]) -> TensorType:
    return t.with_axes((n, changes.get(n, e)) for n, e in t.named_extents)


def exchange(ev: Any, attrs, x: np.ndarray) -> tuple[list[np.ndarray], int]:
    """The operands of the devices of this device's group (in order of position along the mesh
    axis) and this device's position, from the evaluator `ev`. A plain evaluator (no mesh) can
    only evaluate a mesh axis of one device."""
    meet = getattr(ev, "exchange", None)
    if meet is not None:
        return meet(attrs, x)
    _require_mesh(attrs)
    return [x], 0


def position(ev: Any, attrs) -> int:
    """This device's position along the mesh axis of `attrs` (no exchange)."""
    where = getattr(ev, "position", None)
    if where is not None:
        return where(attrs)
    _require_mesh(attrs)
    return 0


def _require_mesh(attrs) -> None:
    if attrs["size"] != 1:
        raise AccyError(
            f"an operation over mesh axis {attrs['mesh_axis']!r} ({attrs['size']} devices) needs "
            "every device's program: run the per-device program on a mesh (accy.mesh.run, or "
            "accy.shard(...)'s executable), not with accy.reference.run"
        )


# psum ----------------------------------------------------------------------------------------


def _psum_infer(types, attrs):
    check_arity("psum", types, 1)
    _mesh_attrs("psum", attrs)
    _check_numeric("psum", types[0])
    return types[0]


def _psum_evaluate(attrs, args, ev):
    group, _ = exchange(ev, attrs, args[0])
    return np.sum(np.stack(group), axis=0, dtype=args[0].dtype)


def _same_collective_jvp(e, op, primals, tangents, out):
    """Every collective is linear: the tangent goes through the same collective."""
    if isinstance(tangents[0], Zero):
        return Zero(op.type)
    return e.emit(op.kind, [tangents[0]], op.attrs)


def _psum_transpose(e, op, ct, operands):
    return [e.emit("psum", [ct], op.attrs)]


# all_gather and reduce_scatter -------------------------------------------------------------


def _all_gather_infer(types, attrs):
    check_arity("all_gather", types, 1)
    mesh_axis, size = _mesh_attrs("all_gather", attrs)
    axis = attr("all_gather", attrs, "axis")
    (t,) = types
    check_has_axes(f"all_gather over mesh axis {mesh_axis!r}", t, [axis])
    return _resized(t, {axis: t.extent(axis) * size})


def _all_gather_evaluate(attrs, args, ev):
    group, _ = exchange(ev, attrs, args[0])
    return np.concatenate(group, axis=ev.operand_types[0].position(attrs["axis"]))


def _all_gather_transpose(e, op, ct, operands):
    return [e.emit("reduce_scatter", [ct], op.attrs)]


def _reduce_scatter_infer(types, attrs):
    check_arity("reduce_scatter", types, 1)
    mesh_axis, size = _mesh_attrs("reduce_scatter", attrs)
    axis = attr("reduce_scatter", attrs, "axis")
    (t,) = types
    check_has_axes(f"reduce_scatter over mesh axis {mesh_axis!r}", t, [axis])
    _check_numeric("reduce_scatter", t)
    return _resized(t, {axis: _divided("reduce_scatter", t, axis, size, mesh_axis)})


def _reduce_scatter_evaluate(attrs, args, ev):
    group, me = exchange(ev, attrs, args[0])
    total = np.sum(np.stack(group), axis=0, dtype=args[0].dtype)
    position = ev.operand_types[0].position(attrs["axis"])
    return np.split(total, attrs["size"], axis=position)[me]


def _reduce_scatter_transpose(e, op, ct, operands):
    return [e.emit("all_gather", [ct], op.attrs)]


# all_to_all ----------------------------------------------------------------------------------


def _all_to_all_infer(types, attrs):
    check_arity("all_to_all", types, 1)
    mesh_axis, size = _mesh_attrs("all_to_all", attrs)
    split = attr("all_to_all", attrs, "split_axis")
    concat = attr("all_to_all", attrs, "concat_axis")
    (t,) = types
    check_has_axes(f"all_to_all over mesh axis {mesh_axis!r}", t, [split, concat])
    local = _divided("all_to_all", t, split, size, mesh_axis)
    if split == concat:
        return t
    return _resized(t, {split: local, concat: t.extent(concat) * size})


def _all_to_all_evaluate(attrs, args, ev):
    group, me = exchange(ev, attrs, args[0])
    t = ev.operand_types[0]
    split, concat = t.position(attrs["split_axis"]), t.position(attrs["concat_axis"])
    # Sender s's block `me` along the split axis comes to this device, in order of s.
    received = [np.split(x, attrs["size"], axis=split)[me] for x in group]
    return np.concatenate(received, axis=concat)


def _all_to_all_transpose(e, op, ct, operands):
    attrs = op.attrs.replace(split_axis=op.attrs["concat_axis"], concat_axis=op.attrs["split_axis"])
    return [e.emit("all_to_all", [ct], attrs)]


# ppermute ------------------------------------------------------------------------------------


def _permutation(attrs) -> tuple[tuple[int, int], ...]:
    mesh_axis, size = _mesh_attrs("ppermute", attrs)
    perm = attr("ppermute", attrs, "perm")
    pairs = tuple(tuple(p) for p in perm) if isinstance(perm, tuple) else None
    if pairs is None or not all(
        len(p) == 2 and all(isinstance(i, int) and 0 <= i < size for i in p) for p in pairs
    ):
        raise TypeRuleError(
            f"ppermute over mesh axis {mesh_axis!r}: perm must be (source, destination) pairs "
            f"of positions in 0..{size - 1}, got {perm!r}"
        )
    for role, index in (("source", 0), ("destination", 1)):
        seen = [p[index] for p in pairs]
        if len(set(seen)) != len(seen):
            raise TypeRuleError(
                f"ppermute over mesh axis {mesh_axis!r}: perm {list(pairs)} names a {role} "
                "twice; each device sends at most once and receives at most once"
            )
    return pairs


def _ppermute_infer(types, attrs):
    check_arity("ppermute", types, 1)
    _permutation(attrs)
    return types[0]


def _ppermute_evaluate(attrs, args, ev):
    group, me = exchange(ev, attrs, args[0])
    for source, destination in attrs["perm"]:
        if destination == me:
            return group[source]
    return np.zeros_like(args[0])


def _ppermute_transpose(e, op, ct, operands):
    inverse = tuple((d, s) for s, d in op.attrs["perm"])
    return [e.emit("ppermute", [ct], op.attrs.replace(perm=inverse))]


# axis_index ----------------------------------------------------------------------------------


def _axis_index_infer(types, attrs):
    check_arity("axis_index", types, 0)
    _mesh_attrs("axis_index", attrs)
    return TensorType(i32, ())


def _axis_index_evaluate(attrs, args, ev):
    return np.int32(position(ev, attrs))


def _collective(kind, infer, evaluate, transpose) -> Rule:
    return Rule(
        kind, infer, evaluate, _same_collective_jvp, transpose, arity=1, batch=batch_same_kind
    )


register(_collective("psum", _psum_infer, _psum_evaluate, _psum_transpose))
register(_collective("all_gather", _all_gather_infer, _all_gather_evaluate, _all_gather_transpose))
register(
    _collective(
        "reduce_scatter", _reduce_scatter_infer, _reduce_scatter_evaluate, _reduce_scatter_transpose
    )
)
register(_collective("all_to_all", _all_to_all_infer, _all_to_all_evaluate, _all_to_all_transpose))
register(_collective("ppermute", _ppermute_infer, _ppermute_evaluate, _ppermute_transpose))
register(
    Rule(
        "axis_index",
        _axis_index_infer,
        _axis_index_evaluate,
        zero_tangent,
        arity=0,
    )
)

__all__ = ["COLLECTIVES", "exchange", "position"]
