"""Batching (vmap over a Program): run a program on many examples at once along a new axis.

`batch(program, name, extent, batched)` returns a Program whose parameters `batched[i]` have
the new axis `name` (extent `extent`) first, and whose outputs all have it first. Each operation
is rewritten by its kind's batching rule (`Rule.batch`, in `accy.core.kinds`), so nothing is
traced again: a gradient program batches into per-example gradients.

>>> import accy
>>> p = accy.trace.define("dot", [accy.spec(accy.f32, k=2)] * 2,
...                       lambda b, a: a[0].contract(a[1], "k"))
>>> print(batch(p, "example", 3, [True, False]).output_types[0])
f32[example=3]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core import Operation, Program
from ..core.builder import Builder
from ..core.kinds.registry import (
    BatchContext,
    BatchedResults,
    batch_type,
    batched_operand,
    rule_for,
)
from ..core.walk import run
from ..errors import AccyError, AxisError


class _Batch:
    """Semantics over (value, batched) pairs that emits the batched program into a Builder."""

    def __init__(
        self,
        builder: Builder,
        ctx: BatchContext,
        batched: Sequence[bool],
        outputs: Sequence[bool] | None = None,
    ):
        self.builder = builder
        self.ctx = ctx
        self.batched = list(batched)
        self.outputs = None if outputs is None else list(outputs)  # None: every one batched

    def bind(self, op: Operation, args: list[tuple[Any, bool]]) -> Any:
        e, ctx = self.builder, self.ctx
        if op.kind == "parameter":
            index = op.attrs["index"]
            mapped = self.batched[index]
            t = batch_type(op.type, ctx) if mapped else op.type
            return e.parameter(t, index), mapped
        values = [value for value, _ in args]
        flags = [mapped for _, mapped in args]
        rule = rule_for(op.kind)
        if not any(flags):
            results = e.emit(op.kind, values, op.attrs)
        elif rule.batch is None:
            raise AccyError(
                f"vmap: {op.kind} {dict(op.attrs).get('target', '')} has no batching rule; "
                "it cannot be mapped over an axis (call it once per example instead)"
            )
        else:
            results = rule.batch(e, op, values, flags, ctx)
        if isinstance(results, BatchedResults):  # only some results batched
            return tuple(zip(results.values, results.batched, strict=True))
        mapped = any(flags)
        if isinstance(results, tuple):
            return tuple((r, mapped) for r in results)
        return results, mapped

    def finish(self, outputs: list[tuple[Any, bool]]) -> Program:
        wanted = self.outputs or [True] * len(outputs)
        values = []
        for (v, mapped), want in zip(outputs, wanted, strict=True):
            if mapped and not want:
                raise AccyError("vmap: internal: an output to keep unbatched depends on the axis")
            values.append(batched_operand(self.builder, v, mapped, self.ctx) if want else v)
        return self.builder.build(values)


class _Flags(_Batch):
    """The batching walk, keeping only which outputs come out batched."""

    def finish(self, outputs: list[tuple[Any, bool]]) -> list[bool]:
        return [mapped for _, mapped in outputs]


def _check_fresh(program: Program, name: str) -> None:
    for t in program.value_types:
        if t.has(name):
            raise AxisError(
                f"vmap over {name!r}: the function already has an axis named {name!r} (on a "
                f"value of type {t}); map over an axis name the function does not use"
            )


def _context(name: str, extent: int) -> BatchContext:
    return BatchContext(
        name,
        extent,
        lambda body, flags, outputs=None: batch(body, name, extent, flags, outputs),
        lambda body, flags: batched_outputs(body, name, extent, flags),
    )


def _check_flags(program: Program, batched: Sequence[bool]) -> None:
    if len(batched) != len(program.parameters):
        raise AccyError(
            f"vmap: {len(batched)} batched flags for the {len(program.parameters)} parameters of "
            f"{program.name!r}"
        )


def batch(
    program: Program,
    name: str,
    extent: int,
    batched: Sequence[bool],
    outputs: Sequence[bool] | None = None,
) -> Program:
    """`program` mapped over a new axis `name` of `extent`, added first to the parameters that
    `batched` marks and to every output, or to the outputs that `outputs` marks (the others
    must not depend on the batched parameters: see `batched_outputs`); see the module
    docstring."""
    _check_flags(program, batched)
    _check_fresh(program, name)
    try:
        return run(program, _Batch(Builder(program.name), _context(name, extent), batched, outputs))
    except AxisError as error:
        raise AxisError(f"vmap over {name!r}: {error}") from None


def batched_outputs(
    program: Program, name: str, extent: int, batched: Sequence[bool]
) -> list[bool]:
    """Which outputs of `program` come out batched when the parameters `batched` marks are.

    >>> import accy
    >>> p = accy.trace.define("f", [accy.spec(accy.f32)] * 2, lambda b, a: (a[0] * 2.0, a[1]))
    >>> batched_outputs(p, "example", 3, [False, True])
    [False, True]
    """
    _check_flags(program, batched)
    try:
        return run(program, _Flags(Builder(program.name), _context(name, extent), batched))
    except AxisError as error:
        raise AxisError(f"vmap over {name!r}: {error}") from None


__all__ = ["batch", "batched_outputs"]
