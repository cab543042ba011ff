"""GEMM epilogues: a flat loop that adds a bias to a GEMM's result, moved into the GEMM's step.

On a target that asks for it (`Target.fuses_gemm_epilogues`: the GPU, whose cuBLASLt adds a
bias vector where the GEMM stores its tile, `CUBLASLT_EPILOGUE_BIAS`), a `loop` step that
computes exactly `dot + broadcast(bias)` becomes the dot step's `epilogue`, when

- the dot is one GEMM (no batch axes) of 16-bit floats into the same dtype, and the loop's
  result has the dot result's type (same axes, same order, same dtype);
- the bias is a stored vector, or a conversion of one to the result's dtype, broadcast along
  the result's leading axes: its axes are the result's last axes, which are the right operand's
  free axes (the GEMM's n), in the same order, so that its elements are one per column of the
  row-major product;
- nothing else reads the dot's result (no other step, not the caller): it is never stored.

The fused step writes the loop's result and reads what both read but the product; its
`epilogue` is the loop step, which says what to add (`bias_epilogue`). A backend that cannot
run the fused GEMM runs the GEMM into the result's buffer and then the addition in place,
which reads each product once, as the loop did.

Matching on the plan rather than in the model code finds the bias of every dense layer after
autodiff and mixed precision, where `x.contract(w) + b` is a `dot_general` and an `add` of a
broadcast (of a conversion of) the parameter. GELU after a dense layer is not fused here: in a
training step the product is read again by the backward pass (the pre-activation is computed
again there from it), so the forward GEMM would have to store it anyway; and cuBLASLt's
`DGELU_BGRAD` (bias gradient in the dgrad GEMM) took 226 us on the H200 at GPT-2's fc shape
against 57 us for the plain GEMM (`bench/results/gpt2-h200-bf16.md`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..core import Operation

HALF_DTYPES = ("bf16", "f16")


@dataclass(frozen=True)
class BiasEpilogue:
    """What a dot step's epilogue adds: `vector` (a stored value, or a value computed from one
    by a conversion that the step computes inline) broadcast to `broadcast`, the value added to
    the product, and `result`, the sum the step stores."""

    vector: int
    stored: int
    broadcast: int
    result: int


def bias_epilogue(step, producers: dict[int, Operation]) -> BiasEpilogue | None:
    """The bias a dot step's epilogue adds, or None when it has none (or not one that
    `fuse_bias_epilogues` makes)."""
    if step.kind != "dot" or len(step.epilogue) != 1:
        return None
    return _bias_of(step.op, step.epilogue[0], producers)


def fuse_bias_epilogues(
    steps: list,
    producers: dict[int, Operation],
    is_stored: Callable[[int], bool],
    outputs: frozenset[int],
    scratch: Callable[[str, int], Any],
) -> list:
    """`steps` with each bias-adding loop that qualifies (see the module doc) moved into the
    dot step it follows, as its epilogue; `scratch(name, nbytes)` makes the plan's record of
    the step's scratch for the converted bias."""
    readers = _reader_counts(steps)
    by_value = {step.writes[0]: i for i, step in enumerate(steps) if step.kind == "dot"}
    fused: dict[int, object] = {}
    dropped: set[int] = set()
    for i, step in enumerate(steps):
        if step.kind != "loop" or len(step.writes) != 1 or step.epilogue:
            continue
        product = _product_of(step, by_value)
        if product is None or product in outputs or readers.get(product, 0) != 1:
            continue
        at = by_value[product]
        dot = steps[at]
        if at in fused or not _plain_gemm(dot) or _bias_of(dot.op, step, producers) is None:
            continue
        if not _bias_is_stored(_bias_of(dot.op, step, producers), is_stored):
            continue
        fused[at] = _fused_step(dot, step, producers, scratch)
        dropped.add(i)
    return [fused.get(i, s) for i, s in enumerate(steps) if i not in dropped]


def _reader_counts(steps: list) -> dict[int, int]:
    counts: dict[int, int] = {}
    for step in _flattened(steps):
        for value in set(step.reads):
            counts[value] = counts.get(value, 0) + 1
    return counts


def _flattened(steps):
    for step in steps:
        yield step
        yield from _flattened(step.members)
        yield from _flattened(step.epilogue)


def _product_of(loop, dots: dict[int, int]) -> int | None:
    """The dot result the loop adds to, if its op is an addition of one."""
    op = loop.op
    if op is None or op.kind != "add" or len(op.operands) != 2:
        return None
    products = [v for v in op.operands if v in dots]
    return products[0] if len(products) == 1 else None


def _plain_gemm(dot) -> bool:
    op, layout = dot.op, dot.detail
    if op is None or layout is None or layout.batch_extents:
        return False
    dtypes = {t.dtype.name for t in op.operand_types} | {op.type.dtype.name}
    return len(dtypes) == 1 and dtypes <= set(HALF_DTYPES) and min(layout.m, layout.n) > 0


def _bias_of(dot: Operation, loop, producers: dict[int, Operation]) -> BiasEpilogue | None:
    add = loop.op
    if add is None or add.kind != "add" or add.type != dot.type:
        return None
    others = [v for v in add.operands if v != dot.results[0]]
    if len(others) != 1:
        return None
    broadcast = producers.get(others[0])
    if broadcast is None or broadcast.kind != "broadcast_in_dim" or broadcast not in loop.fused:
        return None
    vector = broadcast.operands[0]
    vector_type = broadcast.operand_types[0]
    result_axes = dot.type.axes
    free = len(vector_type.axes)
    if free == 0 or result_axes[-free:] != vector_type.axes:
        return None
    if vector_type.dtype != dot.type.dtype or math.prod(vector_type.extents) != _columns(dot):
        return None
    stored = vector
    conversion = producers.get(vector)
    if conversion is not None and conversion in loop.fused:
        if conversion.kind != "convert":
            return None
        stored = conversion.operands[0]
    if set(loop.fused) - {broadcast, conversion}:
        return None
    return BiasEpilogue(vector, stored, others[0], add.results[0])


def _columns(dot: Operation) -> int:
    """The GEMM's n: the extent of the right operand's free axes (the result's last ones)."""
    lhs, rhs = dot.operand_types
    contracted = set(lhs.axes) & set(rhs.axes)
    return math.prod(rhs.extent(a) for a in rhs.axes if a not in contracted)


def _bias_is_stored(bias: BiasEpilogue | None, is_stored) -> bool:
    return bias is not None and is_stored(bias.stored)


def _fused_step(dot, loop, producers: dict[int, Operation], make_scratch):
    bias = _bias_of(dot.op, loop, producers)
    reads = tuple(dict.fromkeys((*dot.reads, *(v for v in loop.reads if v != dot.writes[0]))))
    vector = producers[bias.broadcast].operand_types[0]
    scratch = (*dot.scratch, make_scratch("bias", vector.nbytes))
    return replace(
        dot, writes=loop.writes, reads=reads, fused=loop.fused, scratch=scratch, epilogue=(loop,)
    )
