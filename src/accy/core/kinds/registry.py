"""The closed set of operation kinds and the table of their rules.

Each kind has one `Rule`: its type rule (`infer`), its reference evaluation over NumPy
(`evaluate`), its JVP rule (`jvp`) and, for kinds that can be linear in their tangent operands,
its transpose rule (`transpose`). Transformations look rules up in `RULES`; no pass switches
over kinds.

Rule signatures:

- `infer(operand_types, attrs) -> TensorType | tuple[TensorType, ...]`; raises a
  `TypeRuleError` subclass with a message that names the operation and shows the operands.
- `evaluate(attrs, arrays, evaluator) -> ndarray | tuple[ndarray, ...]`.
- `jvp(emit, op, primals, tangents, outputs) -> tangent(s)`; `emit` builds operations, a
  tangent is a traced value or `Zero`. Not called when every tangent is `Zero`.
- `transpose(emit, op, cotangent, operands) -> list` of one cotangent (or `None`) per operand;
  an operand that is linear is given as `Linear(type)`, any other as its traced value.
- `batch(emit, op, operands, batched, ctx) -> result(s)` (vmap): `batched[i]` says whether
  operand i carries the batch axis `ctx.name` (extent `ctx.extent`), always first in its
  layout; the results must carry it first too. Not called when no operand is batched; every
  kind with operands has one (custom_call's asks its record, else loops over the examples).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import AxisError, DTypeError, TypeRuleError
from ..types import TensorType


@dataclass(frozen=True)
class Zero:
    """A symbolic zero tangent or cotangent: no operation is emitted for it."""

    type: TensorType


@dataclass(frozen=True)
class Linear:
    """Marks an operand that a transpose rule receives as the unknown (linear) input."""

    type: TensorType


@dataclass(frozen=True)
class Rule:
    kind: str
    infer: Callable[..., Any]
    evaluate: Callable[..., Any]
    jvp: Callable[..., Any] | None = None
    transpose: Callable[..., Any] | None = None
    arity: int | None = None
    batch: Callable[..., Any] | None = None
    multiple_results: bool = False
    # For parameter, constant, iota and custom_call the result type is an attribute ("type"):
    # the printer shows it once, after the colon.
    result_type_is_attr: bool = False


@dataclass(frozen=True)
class BatchContext:
    """What a batching rule needs beyond its operands: the batch axis, and a way to batch a
    nested program (a scan's body) with the given parameters batched: `batch_program(body,
    flags)` (every output batched) or `batch_program(body, flags, outputs)` (the outputs that
    `outputs` marks; the others stay unbatched), and `outputs_batched(body, flags)`, which of
    its outputs depend on the batched parameters."""

    name: str
    extent: int
    batch_program: Callable[..., Any]
    outputs_batched: Callable[..., list[bool]] | None = None


@dataclass(frozen=True)
class BatchedResults:
    """What a batching rule returns when only some of its results are batched: the results,
    and for each whether it carries the batch axis (first)."""

    values: tuple
    batched: tuple[bool, ...]


def batch_type(t: TensorType, ctx: BatchContext) -> TensorType:
    """`t` with the batch axis first."""
    return t.with_axes(((ctx.name, ctx.extent), *t.named_extents))


def batched_operand(e, x, batched: bool, ctx: BatchContext):
    """`x` with the batch axis first: repeated along it when `x` is not batched."""
    return x if batched else e.broadcast_to(x, batch_type(x.ty, ctx))


def batch_first(e, x, ctx: BatchContext):
    """`x` (which has the batch axis somewhere) laid out with the batch axis first."""
    return e.transpose(x, (ctx.name, *(a for a in x.ty.axes if a != ctx.name)))


def batch_same_kind(e, op, operands, batched, ctx: BatchContext):
    """The batching rule of kinds that act on each element alike (elementwise kinds): make
    every operand batched, then the same operation."""
    operands = [batched_operand(e, x, b, ctx) for x, b in zip(operands, batched, strict=True)]
    return e.emit(op.kind, operands, op.attrs)


def zero_tangent(e, op, primals, tangents, outputs) -> Zero:
    """The JVP rule of kinds whose result does not depend smoothly on their operands
    (constants, comparisons, bit casts, integer results): a symbolic zero."""
    return Zero(op.type)


RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    RULES[rule.kind] = rule
    return rule


def rule_for(kind: str) -> Rule:
    if kind not in RULES:
        raise TypeRuleError(f"unknown operation kind {kind!r}; the kinds are {', '.join(RULES)}")
    return RULES[kind]


def describe(types: tuple[TensorType, ...] | list[TensorType]) -> str:
    """Operand types for an error message: 'operand 0: f32[a=2], operand 1: f32[b=3]'."""
    return ", ".join(f"operand {i}: {t}" for i, t in enumerate(types))


def check_arity(kind: str, types, expected: int) -> None:
    if len(types) != expected:
        raise TypeRuleError(
            f"{kind} takes {expected} operand{'s' if expected != 1 else ''}, "
            f"got {len(types)} ({describe(types) or 'none'})"
        )


def check_same_dtype(kind: str, types) -> None:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        raise DTypeError(
            f"{kind}: operands have different dtypes ({describe(types)}); accy does not "
            f"promote dtypes silently, convert one operand with .convert(dtype)"
        )


def check_float(kind: str, t: TensorType) -> None:
    if not t.dtype.is_float:
        raise DTypeError(f"{kind} needs a floating-point operand, got {t}; convert it first")


def check_has_axes(kind: str, t: TensorType, axes, role: str = "operand") -> None:
    for axis in axes:
        if not t.has(axis):
            raise AxisError(
                f"{kind}: axis {axis!r} is not on the {role} {t}; "
                f"its axes are {', '.join(t.axes) or '(none, it is a scalar)'}"
            )


def check_scalar(kind: str, t: TensorType, role: str) -> None:
    if t.rank != 0:
        raise AxisError(f"{kind}: the {role} must be a scalar (rank 0), got {t}")


def attr(kind: str, attrs, name: str):
    if name not in attrs:
        raise TypeRuleError(f"{kind} needs the attribute {name!r}; it has {sorted(attrs)}")
    return attrs[name]
