"""Grouped-query attention: `nn.attention(q, k, v, group_axes=...)`, the keys and values
without the query's group axes (each key/value head shared by a group of query heads).

Broadcasting the keys and values along the group axes materialises them once per query head
(group times their size), and their gradients are that broadcast's transpose: a sum over the
group axes of group-times-larger cotangents. cuDNN's fused attention takes fewer key/value
heads than query heads (h_k dividing h_q; dK and dV come out per key/value head), so the
records here take k and v as they are:

- `forward(q, k, v)` -> [output | logsumexp], as `nn.attention`'s forward record;
- `backward(q, k, v, packed, dpacked)` -> dQ, dK and dV, each in its operand's layout, one
  after another in each block of the result (`backward_type`: {b0, dim: ...} when the three
  operands share their outermost batch axis b0, else one axis).

Where no kernel takes them (the CPU, f32) the fallbacks broadcast k and v and call
`nn.attention`'s records (`records.py`), the gradients summed over the group axes: what the
broadcast and `nn.attention` computed, value for value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.types import TensorType
from ..custom import CustomCall
from ..errors import AxisError
from . import composition as c
from . import cuda
from .records import Records, cpu_declines, records_for
from .signature import Shape, Signature, check, packed_type


@dataclass(frozen=True)
class GroupedSignature:
    """One grouped-query attention call: the operands' axes in layout order (the key's and
    value's without the group axes), the group axes (batch axes of the query only), roles and
    options.

    >>> s = GroupedSignature(("batch", "token", "head", "group", "dim"),
    ...                      ("batch", "key", "head", "dim"), ("batch", "key", "head", "dim"),
    ...                      ("group",), causal=True)
    >>> s.split.key
    ('batch', 'key', 'head', 'group', 'dim')
    """

    query: tuple[str, ...]
    key: tuple[str, ...]
    value: tuple[str, ...]
    groups: tuple[str, ...]
    query_axis: str = "token"
    key_axis: str = "key"
    dim_axis: str = "dim"
    causal: bool = False
    scale: float | None = None

    def broadcast_axes(self, axes: tuple[str, ...]) -> tuple[str, ...]:
        """`axes` (a key's or value's) with the group axes inserted, each after the nearest
        axis before it in the query's order that `axes` has (first when none)."""
        out = list(axes)
        as_key = [self.key_axis if a == self.query_axis else a for a in self.query]
        for group in self.groups:
            before = as_key[: as_key.index(group)]
            present = [a for a in before if a in out]
            out.insert(out.index(present[-1]) + 1 if present else 0, group)
        return tuple(out)

    @property
    def split(self) -> Signature:
        """`nn.attention`'s signature on the key and value broadcast along the group axes."""
        return Signature(
            self.query,
            self.broadcast_axes(self.key),
            self.broadcast_axes(self.value),
            None,
            self.query_axis,
            self.key_axis,
            self.dim_axis,
            self.causal,
            self.scale,
        )

    def target(self, part: str) -> str:
        """The custom-call target of the record `part` ("forward" or "backward")."""
        fields = [
            f"{name}={','.join(axes)}"
            for name, axes in (
                ("q", self.query),
                ("k", self.key),
                ("v", self.value),
                ("groups", self.groups),
            )
        ]
        return f"accy.nn.attention.grouped_{part}[{';'.join(fields + self.split.option_fields())}]"

    def broadcast_type(self, t: TensorType, q: TensorType) -> TensorType:
        """`t` (the key or value) broadcast along the group axes (their extents: `q`'s)."""
        extents = {**dict(t.named_extents), **{g: q.extent(g) for g in self.groups}}
        return TensorType(t.dtype, tuple((a, extents[a]) for a in self.broadcast_axes(t.axes)))

    def result_blocks(self, q: TensorType, k: TensorType, v: TensorType) -> tuple[int, int]:
        """(blocks, elements a block) of the backward's result: one block per entry of the
        operands' shared outermost batch axis, else one block."""
        return self.blocks_of(q.named_extents, k.named_extents, v.named_extents)

    def blocks_of(self, *named: tuple[tuple[str, int], ...]) -> tuple[int, int]:
        """`result_blocks` of q, k and v given as (axis, extent) pairs in layout order."""
        axis = self.block_axis_of(*named)
        blocks = named[0][0][1] if axis is not None else 1
        total = sum(int(np.prod([e for _, e in n], dtype=np.int64)) for n in named)
        return blocks, total // max(blocks, 1)

    def block_axis_of(self, *named: tuple[tuple[str, int], ...]) -> str | None:
        """The axis of the backward's blocks: the outermost axis of q, k and v when they share
        it and it is a batch axis (not a group axis), else None (one block)."""
        first = named[0][0][0]
        roles = (self.query_axis, self.key_axis, self.dim_axis, *self.groups)
        shared = all(n[0][0] == first for n in named) and first not in roles
        return first if shared else None

    def block_axis(self, q: TensorType, k: TensorType, v: TensorType) -> str | None:
        """`block_axis_of` the types q, k and v."""
        return self.block_axis_of(q.named_extents, k.named_extents, v.named_extents)

    def result_named(self, blocks: int, block: int, axis: str | None) -> tuple:
        """The backward's result axes: {axis: blocks, dim_axis: block}, or {dim_axis: all}."""
        if axis is not None:
            return ((axis, blocks), (self.dim_axis, block))
        return ((self.dim_axis, block),)


def check_grouped(s: GroupedSignature, q: TensorType, k: TensorType, v: TensorType) -> Shape:
    """Check grouped-query operands (the group axes on the query only, as batch axes); their
    extents, or a clear error."""
    for group in s.groups:
        if not q.has(group) or group in (s.query_axis, s.key_axis, s.dim_axis):
            raise AxisError(
                f"nn.attention: group axis {group!r} must be a batch axis of the query {q} "
                "(an axis besides the query and dim axes)"
            )
        for name, t in (("key", k), ("value", v)):
            if t.has(group):
                raise AxisError(
                    f"nn.attention: the {name} {t} has the group axis {group!r}; with "
                    "group_axes= the key and value lack them (each is shared by the group)"
                )
    return check(s.split, q, s.broadcast_type(k, q), s.broadcast_type(v, q))


def backward_type(s: GroupedSignature, q: TensorType, k: TensorType, v: TensorType) -> TensorType:
    """The backward record's result: dQ, dK and dV flattened one after another in each block
    (`GroupedSignature.result_blocks`), as {b0, dim_axis: block} or {dim_axis: all}."""
    check_grouped(s, q, k, v)
    return TensorType(q.dtype, s.result_named(*s.result_blocks(q, k, v), s.block_axis(q, k, v)))


def _broadcast(e: Any, s: GroupedSignature, x: Any, q: Any) -> Any:
    return e.broadcast_to(x, s.broadcast_type(x.ty, q.ty))


def _gradients(e: Any, s: GroupedSignature, result: Any, operands: list) -> list:
    """dQ, dK and dV out of the backward's result, each in its operand's layout."""
    blocks, _ = s.result_blocks(*(x.ty for x in operands))
    out, at = [], 0
    for x in operands:
        size = x.ty.size // blocks
        out.append(e.reshape(e.slice(result, s.dim_axis, at, at + size), x.ty.named_extents))
        at += size
    return out


def _flattened(e: Any, s: GroupedSignature, gradients: list) -> Any:
    """dQ, dK and dV (in their operands' layouts) as the backward's result."""
    types = [g.ty for g in gradients]
    blocks, _ = s.result_blocks(*types)
    axis = s.block_axis(*types)
    flat = [e.reshape(g, s.result_named(blocks, g.ty.size // blocks, axis)) for g in gradients]
    return e.concatenate(flat, s.dim_axis)


def numpy_broadcast(s: GroupedSignature, x: np.ndarray, axes, q_shape: dict) -> np.ndarray:
    """A key or value array broadcast along the group axes (NumPy)."""
    target = s.broadcast_axes(tuple(axes))
    expanded = np.expand_dims(x, tuple(target.index(g) for g in s.groups))
    shape = tuple(
        q_shape[a] if a in s.groups else n for a, n in zip(target, expanded.shape, strict=True)
    )
    return np.broadcast_to(expanded, shape)


def numpy_forward(s: GroupedSignature, q, k, v) -> np.ndarray:
    """The forward's reference: `nn.attention`'s on the broadcast key and value."""
    q_shape = dict(zip(s.query, q.shape, strict=True))
    bk, bv = (numpy_broadcast(s, x, a, q_shape) for x, a in ((k, s.key), (v, s.value)))
    return c.numpy_forward(s.split, q, bk, bv)


def numpy_backward(s: GroupedSignature, q, k, v, packed, dpacked) -> np.ndarray:
    """The backward's reference: `nn.attention`'s on the broadcast operands, dK and dV summed
    over the group axes (in f32, rounded once to the operands' dtype), flattened."""
    q_shape = dict(zip(s.query, q.shape, strict=True))
    bk, bv = (numpy_broadcast(s, x, a, q_shape) for x, a in ((k, s.key), (v, s.value)))
    split = s.split
    rows = c.numpy_backward(split, q, bk, bv, packed, dpacked)
    t, keys = q_shape[s.query_axis], k.shape[s.key.index(s.key_axis)]
    row_axes = (*split.batch_axes, s.query_axis, s.dim_axis)  # `signature.backward_type`
    at = row_axes.index(s.query_axis)
    as_key = tuple(s.key_axis if a == s.query_axis else a for a in row_axes)
    spans = ((0, t, row_axes, s.query), (t, keys, as_key, split.key))
    spans += ((t + keys, keys, as_key, split.value),)
    parts = []
    for start, count, names, axes in spans:
        block = np.take(rows, np.arange(start, start + count), axis=at)
        parts.append(np.transpose(block, [names.index(a) for a in axes]))
    dq, dk, dv = parts
    summed = [
        x.astype(np.float32).sum(axis=tuple(axes.index(g) for g in s.groups)).astype(q.dtype)
        for x, axes in ((dk, split.key), (dv, split.value))
    ]
    named = [
        tuple(zip(a, x.shape, strict=True)) for a, x in ((s.query, q), (s.key, k), (s.value, v))
    ]
    blocks, block = s.blocks_of(*named)
    flat = np.concatenate([x.reshape(blocks, -1) for x in (dq, *summed)], axis=1)
    return flat if s.block_axis_of(*named) is not None else flat.reshape(block)


def _like(e: Any, x: Any, operand: Any) -> Any:
    """`x` in `operand`'s layout and dtype."""
    if x.ty.axes != operand.ty.axes:
        x = e.transpose(x, operand.ty.axes)
    return e.convert(x, operand.ty.dtype)


def _block_axes(s: GroupedSignature, q: TensorType, k: TensorType, v: TensorType) -> tuple:
    """The backward's mapped axes: the blocks' axis (each block is one entry's dQ, dK, dV)."""
    axis = s.block_axis(q, k, v)
    return () if axis is None else (axis,)


@functools.cache  # not a cache: one registered record per signature for the process's life
def grouped_records_for(s: GroupedSignature) -> Records:
    """The records of grouped signature `s` (made once per signature, registered by the
    caller; `nn.attention`'s records of `s.split` are registered with them)."""
    split = records_for(s.split)

    def broadcast_all(e, q, k, v):
        return [q, _broadcast(e, s, k, q), _broadcast(e, s, v, q)]

    def backward_fallback(q, k, v, packed, dpacked):
        e = q.builder
        shape = check_grouped(s, q.ty, k.ty, v.ty)
        operands = broadcast_all(e, q, k, v)
        grads = split.register().backward.call(e, *operands, packed, dpacked)
        t, keys = shape.tokens, shape.keys
        dq = _like(e, e.slice(grads, s.query_axis, 0, t), q)
        wide = [
            _like(
                e, e.rename(e.slice(grads, s.query_axis, a, a + keys), s.query_axis, s.key_axis), x
            )
            for a, x in ((t, operands[1]), (t + keys, operands[2]))
        ]
        dk, dv = (_like(e, e.sum(w, s.groups), x) for w, x in zip(wide, (k, v), strict=True))
        return _flattened(e, s, [dq, dk, dv])

    backward = CustomCall(
        s.target("backward"),
        result_type=lambda q, k, v, packed, dpacked: backward_type(s, q, k, v),
        reference=lambda *arrays: numpy_backward(s, *arrays),
        fallback=backward_fallback,
        kernels={"cpu": cpu_declines, "cuda": cuda.kernel_factory(s, "backward")},
        mapped_axes=lambda q, k, v, packed, dpacked: _block_axes(s, q, k, v),
        register=False,
    )

    def vjp(e, primals, result, cotangent):
        grads = backward.call(e, *primals, result, cotangent)
        return _gradients(e, s, grads, list(primals))

    def jvp(e, primals, tangents, result):
        q, k, v = primals
        dq, dk, dv = tangents
        return split.register().forward.jvp(
            e, broadcast_all(e, q, k, v), broadcast_all(e, dq, dk, dv), result
        )

    def forward_fallback(q, k, v):
        return split.register().forward.call(q.builder, *broadcast_all(q.builder, q, k, v))

    forward = CustomCall(
        s.target("forward"),
        result_type=lambda q, k, v: packed_type(s.split, check_grouped(s, q, k, v)),
        reference=lambda q, k, v: numpy_forward(s, q, k, v),
        jvp=jvp,
        vjp=vjp,
        fallback=forward_fallback,
        kernels={"cpu": cpu_declines, "cuda": cuda.kernel_factory(s, "forward")},
        mapped_axes=s.split.batch_axes,
        register=False,
    )
    return Records(forward, backward)


__all__ = ["GroupedSignature", "check_grouped", "grouped_records_for"]
