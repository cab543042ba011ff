"""What one attention call is: the roles of its axes, its options, and the checks of its operands.

A `Signature` names every operand's axes in layout order, which of them are the query, key and
dim axes, and the options (`causal`, `scale`, whether there is a bias). Custom calls carry no
attributes besides (target, version), so the signature is spelled into the target
(`Signature.target`): one set of records per signature, each built by `records.records_for`.
Extents are not part of it; the records' type rules and kernels read them from the operand types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.types import DType, TensorType, bf16, f16, f32, f64
from ..errors import AxisError, DTypeError, TypeRuleError

FUSED_MIN_SCORES = 64 * 64
"""Up to this many scores per batch entry (one 64 x 64 block), `nn.attention` in bf16/f16
records the composition itself: there its scores are small, and differentiating it directly
(GEMMs, the softmax reused) is faster than any fused kernel (2.6x on the demo's 21 tokens on a
CPU). Tests set it to 0 to run the fused records on small shapes."""

FULL_PRECISION_FUSED_MIN_SCORES = 2048 * 2048
"""The same bound for f32/f64 attention, higher: on two CPU cores the BLAS composition beats the
CPU kernel up to about 1,500 tokens (1 head, dim 64, causal: 0.74 against 1.11 ms at 256
tokens, 11.4 against 12.3 ms at 1,024; the kernel wins from 2,048 on, 44 against 53 ms, and at
8,192 its extra memory is 12 MB against 1 GB). Up to this bound the scores of one batch entry
take at most 16 MB in f32. The bound is the CPU's: on CUDA the f32 kernels (`flash_cuda.py`)
beat the composition at 1,024 tokens (GPT-2 small: 2.1 against 3.2 ms a layer), so GPU
programs pass `implementation="fused"` to `nn.attention`. Tests set it to 0 too."""


def records_composition(shape_scores: int, dtype: DType) -> bool:
    """Whether `nn.attention` with `shape_scores` scores per batch entry in `dtype` is recorded
    as the composition itself (faster there) rather than as the fused custom call.

    >>> records_composition(256 * 256, f32), records_composition(4096 * 4096, f32)
    (True, False)
    """
    full = dtype in (f32, f64)
    return shape_scores <= (FULL_PRECISION_FUSED_MIN_SCORES if full else FUSED_MIN_SCORES)


@dataclass(frozen=True)
class Signature:
    """The axis roles and options of one attention call (see the module docstring).

    >>> s = Signature(("head", "token", "dim"), ("head", "key", "dim"), ("head", "key", "dim"))
    >>> s.batch_axes
    ('head',)
    >>> s.target("forward")
    'accy.nn.attention.forward[q=head,token,dim;k=head,key,dim;v=head,key,dim;scale=default]'
    """

    query: tuple[str, ...]
    key: tuple[str, ...]
    value: tuple[str, ...]
    bias: tuple[str, ...] | None = None
    query_axis: str = "token"
    key_axis: str = "key"
    dim_axis: str = "dim"
    causal: bool = False
    scale: float | None = None  # None: 1/sqrt(dim extent)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The shared axes (batch, head, ...), in the query's layout order."""
        return tuple(a for a in self.query if a not in (self.query_axis, self.dim_axis))

    def target(self, part: str) -> str:
        """The custom-call target of the record `part` (forward, backward_query, ...)."""
        fields = [
            f"q={','.join(self.query)}",
            f"k={','.join(self.key)}",
            f"v={','.join(self.value)}",
        ]
        if self.bias is not None:
            fields.append(f"bias={','.join(self.bias)}")
        return f"accy.nn.attention.{part}[{';'.join(fields + self.option_fields())}]"

    def option_fields(self) -> list[str]:
        """The target's fields of the roles (where not the default ones), causality and the
        scale: what every attention record's target ends with."""
        fields = []
        roles = (self.query_axis, self.key_axis, self.dim_axis)
        if roles != ("token", "key", "dim"):
            fields.append(f"axes={','.join(roles)}")
        if self.causal:
            fields.append("causal")
        fields.append(f"scale={'default' if self.scale is None else repr(float(self.scale))}")
        return fields

    def scale_for(self, dim: int) -> float:
        """The factor of the scores: `scale`, else 1/sqrt(dim)."""
        return 1.0 / math.sqrt(dim) if self.scale is None else float(self.scale)


@dataclass(frozen=True)
class Shape:
    """The extents of a checked call: batch extents (the query's order), tokens, keys, dim."""

    batch: tuple[tuple[str, int], ...]
    tokens: int
    keys: int
    dim: int
    dtype: DType

    @property
    def accumulation(self) -> DType:
        """The dtype the kernels compute and keep statistics in: f64 for f64, else f32."""
        return f64 if self.dtype == f64 else f32

    @property
    def batch_size(self) -> int:
        return math.prod(e for _, e in self.batch)


def element_strides(t: TensorType) -> dict[str, int]:
    """The stride of each axis of `t` in elements (its layout is row-major: the last axis is
    contiguous), which the kernels use to read operands in place.

    >>> from accy import spec
    >>> element_strides(spec(f32, head=2, token=3, dim=4))
    {'dim': 1, 'token': 4, 'head': 12}
    """
    strides, step = {}, 1
    for axis, extent in reversed(t.named_extents):
        strides[axis] = step
        step *= extent
    return strides


def stride_constants(s: Signature, operands: dict[str, TensorType]) -> dict[str, int]:
    """The kernels' constants for reading q, k and v in place: QT (QD), the element stride of
    the query's query axis (dim axis), and KT, KD, VT, VD likewise for the key and value.

    >>> from accy import spec
    >>> sig = Signature(("token", "dim"), ("dim", "key"), ("key", "dim"))
    >>> q, k, v = spec(f32, token=2, dim=4), spec(f32, dim=4, key=3), spec(f32, key=3, dim=4)
    >>> stride_constants(sig, {"q": q, "k": k, "v": v})
    {'QT': 4, 'QD': 1, 'KT': 1, 'KD': 3, 'VT': 4, 'VD': 1}
    """
    roles = {"Q": ("q", s.query_axis), "K": ("k", s.key_axis), "V": ("v", s.key_axis)}
    constants = {}
    for letter, (name, row_axis) in roles.items():
        strides = element_strides(operands[name])
        constants[f"{letter}T"], constants[f"{letter}D"] = strides[row_axis], strides[s.dim_axis]
    return constants


def _require(what: str, t: TensorType, axes: tuple[str, ...], roles: str) -> None:
    for axis in axes:
        if not t.has(axis):
            raise AxisError(
                f"nn.attention: {what} {t} has no axis {axis!r}; it needs {roles} (it has "
                f"{', '.join(t.axes) or 'no axes'}); name the axes with query_axis=, key_axis= "
                "and dim_axis="
            )


def check(
    signature: Signature,
    query: TensorType,
    key: TensorType,
    value: TensorType,
    bias: TensorType | None = None,
) -> Shape:
    """Check the operands of an attention call; return its extents, or raise a clear error.

    >>> from accy import spec, f32
    >>> s = Signature(("token", "dim"), ("key", "dim"), ("key", "dim"))
    >>> check(s, spec(f32, token=2, dim=4), spec(f32, key=3, dim=4), spec(f32, key=3, dim=4))
    Shape(batch=(), tokens=2, keys=3, dim=4, dtype=accy.f32)
    >>> check(s, spec(f32, token=2, dim=4), spec(f32, key=3, dim=5), spec(f32, key=3, dim=5))
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    accy.errors.AxisError: nn.attention: axis 'dim' has extent 4 on the query ... 5 on the key ...
    """
    q_axis, k_axis, d_axis = signature.query_axis, signature.key_axis, signature.dim_axis
    if len({q_axis, k_axis, d_axis}) != 3:
        raise AxisError(
            f"nn.attention: query_axis {q_axis!r}, key_axis {k_axis!r} and dim_axis {d_axis!r} "
            "must be three different axes"
        )
    _require("the query", query, (q_axis, d_axis), f"{q_axis!r} and {d_axis!r}")
    _require("the key", key, (k_axis, d_axis), f"{k_axis!r} and {d_axis!r}")
    _require("the value", value, (k_axis, d_axis), f"{k_axis!r} and {d_axis!r}")
    operands = {"query": query, "key": key, "value": value}
    for name, t in operands.items():
        other = k_axis if name == "query" else q_axis
        if t.has(other):
            raise AxisError(
                f"nn.attention: the {name} {t} has the axis {other!r}, which must be only on "
                f"the {'key and value' if name == 'query' else 'query'}"
            )
        if t.dtype != query.dtype:
            raise DTypeError(
                f"nn.attention: the {name} is {t}, but the query is {query}; query, key, value "
                "(and bias) must have one dtype (convert them first)"
            )
    if not query.dtype.is_float:
        raise DTypeError(f"nn.attention: the query is {query}; attention needs a float dtype")
    batch = tuple(a for a in query.axes if a not in (q_axis, d_axis))
    for name in ("key", "value"):
        t = operands[name]
        theirs = {a for a in t.axes if a not in (k_axis, d_axis)}
        if theirs != set(batch):
            raise AxisError(
                f"nn.attention: the shared (batch) axes must be the same on query, key and "
                f"value, but the query {query} has ({', '.join(batch) or 'none'}) and the "
                f"{name} {t} has ({', '.join(sorted(theirs)) or 'none'})"
            )
    _same_extents(operands, (d_axis, *batch))
    _same_extents({"key": key, "value": value}, (k_axis,))
    tokens, keys = query.extent(q_axis), key.extent(k_axis)
    if signature.causal and tokens != keys:
        raise AxisError(
            f"nn.attention: causal=True masks keys after each query position, so the query axis "
            f"{q_axis!r} ({tokens}) and the key axis {k_axis!r} ({keys}) need equal extents"
        )
    if bias is not None:
        _check_bias(bias, query, {**query.shape, **key.shape}, (q_axis, k_axis, *batch), d_axis)
    return Shape(
        tuple((a, query.extent(a)) for a in batch),
        tokens,
        keys,
        query.extent(d_axis),
        query.dtype,
    )


def _same_extents(operands: dict[str, TensorType], axes: tuple[str, ...]) -> None:
    (first_name, first), *rest = operands.items()
    for axis in axes:
        for name, t in rest:
            if t.extent(axis) != first.extent(axis):
                raise AxisError(
                    f"nn.attention: axis {axis!r} has extent {first.extent(axis)} on the "
                    f"{first_name} {first} but {t.extent(axis)} on the {name} {t}"
                )


def _check_bias(
    bias: TensorType, query: TensorType, extents: dict, allowed: tuple[str, ...], dim: str
) -> None:
    if bias.dtype != query.dtype:
        raise DTypeError(
            f"nn.attention: the bias is {bias}, but the query is {query}; they need one dtype"
        )
    for axis in bias.axes:
        if axis not in allowed:
            why = " (the dim axis is contracted)" if axis == dim else ""
            raise AxisError(
                f"nn.attention: the bias {bias} has axis {axis!r}{why}; a bias may only have "
                f"the axes of the scores: {', '.join(allowed)}"
            )
        if bias.extent(axis) != extents[axis]:
            raise AxisError(
                f"nn.attention: axis {axis!r} has extent {bias.extent(axis)} on the bias "
                f"{bias} but {extents[axis]} on the query/key"
            )


LSE_SLOTS_16 = 8
"""Entries of the forward's result after the output in bf16/f16: the logsumexp as two 16-bit
numbers whose sum is it (hi = lse rounded, lo = the rest rounded: about 16 (bf16) or 22 (f16)
bits of it, as cuDNN's f32 Stats would lose too much in one 16-bit number), then zeros, so that
a row is a multiple of 16 bytes when the dim extent is a multiple of 8 (cuDNN's kernels then
write the output in place, rows strided by dim + 8)."""


def is_16_bit(dtype: DType) -> bool:
    """Whether the records of `dtype` operands keep 16-bit results (bf16, f16).

    >>> is_16_bit(bf16), is_16_bit(f32)
    (True, False)
    """
    return dtype in (bf16, f16)


def lse_slots(dtype: DType) -> int:
    """Entries after the output in the forward's result: 1 (the logsumexp) in f32/f64,
    `LSE_SLOTS_16` ([hi | lo | zeros]) in bf16/f16.

    >>> lse_slots(f32), lse_slots(bf16)
    (1, 8)
    """
    return LSE_SLOTS_16 if is_16_bit(dtype) else 1


def packed_type(signature: Signature, shape: Shape) -> TensorType:
    """The forward record's result: {batch..., query_axis, dim_axis: dim + slots}, in the
    operands' dtype: the output in the first `dim` entries of the dim axis, the row's
    logsumexp after it (`lse_slots`: one entry in f32/f64; [hi | lo | zeros] in bf16/f16, hi +
    lo the logsumexp). A custom call has one result, so the two share it."""
    slots = lse_slots(shape.dtype)
    return TensorType(
        shape.dtype,
        (
            *shape.batch,
            (signature.query_axis, shape.tokens),
            (signature.dim_axis, shape.dim + slots),
        ),
    )


def backward_type(signature: Signature, shape: Shape) -> TensorType:
    """The backward record's result: {batch..., query_axis: tokens + 2 keys, dim_axis: dim}, in
    the operands' dtype: rows [0, tokens) hold the query's gradient, the `keys` rows after them
    the key's, then the value's. One result for all three, as a custom call has one, and one
    backward kernel (cuDNN's) writes them in place."""
    return TensorType(
        shape.dtype,
        (
            *shape.batch,
            (signature.query_axis, shape.tokens + 2 * shape.keys),
            (signature.dim_axis, shape.dim),
        ),
    )


IMPLEMENTATIONS = (None, "fused", "composition")


def reject_options(causal: object, scale: object, implementation: object = None) -> None:
    """Clear errors for options of the wrong kind.

    >>> reject_options(True, None, "flash")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    accy.errors.TypeRuleError: nn.attention: implementation must be None, ... got 'flash'
    """
    if implementation not in IMPLEMENTATIONS:
        raise TypeRuleError(
            'nn.attention: implementation must be None, "fused" or "composition", got '
            f"{implementation!r}"
        )
    if not isinstance(causal, bool):
        raise TypeRuleError(f"nn.attention: causal must be True or False, got {causal!r}")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale)
    ):
        raise TypeRuleError(f"nn.attention: scale must be a finite number or None, got {scale!r}")
