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
broadcast (of a conversion of) the parameter.

GELU (`accy.nn.gelu_tanh`, the unary op `gelu_tanh`) after a dense layer with a bias is two
more epilogues (`fuse_gelu_epilogues`). Fusion stores the pre-activation `x.contract(w) + b`
there (`accy.lower.fusion.decide`'s `stores_bias_sums`: the forward GELU, the backward's
derivative and any recomputation read it), so the GEMM writes it with its bias epilogue; then

- `gelu_aux_bias`: a loop that computes only `gelu_tanh` of that stored sum is done by the same
  GEMM, which writes both the sum (cuBLASLt's "aux" output) and the GELU (its result);
- `dgelu`: a loop that multiplies a GEMM's product (which nothing else reads) by
  `gelu_tanh_slope` of a stored value of the product's type, the GELU's backward, is done by
  that GEMM reading the stored value as its aux input.

The bias gradient is left to its own column sum: cuBLASLt's `DGELU_BGRAD` took 226 us on the
H200 at GPT-2's fc shape against 57 us for the plain GEMM and 80 for `DGELU`
(`bench/results/gpt2-h200-bf16.md`).
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


def is_bias_sum(op: Operation, producers: dict[int, Operation]) -> bool:
    """Whether `op` adds a vector broadcast along its leading axes to a GEMM's product of
    16-bit floats (of its type): what the GEMM's bias epilogue can compute. Fusion stores such
    a sum where several steps read it (`accy.lower.fusion.decide`'s `stores_bias_sums`)."""
    if op.kind != "add" or len(op.operands) != 2 or op.type.dtype.name not in HALF_DTYPES:
        return False
    made = [producers.get(v) for v in op.operands]
    products = [p for p in made if p is not None and p.kind == "dot_general" and p.type == op.type]
    broadcasts = [p for p in made if p is not None and p.kind == "broadcast_in_dim"]
    if len(products) != 1 or len(broadcasts) != 1:
        return False
    vector = broadcasts[0].operand_types[0].axes
    return len(vector) > 0 and op.type.axes[-len(vector) :] == vector


@dataclass(frozen=True)
class GemmEpilogue:
    """What a dot step's epilogue does: `name` is "bias", "gelu_aux_bias" or "dgelu" (the
    cuBLASLt epilogue); `bias` the bias it adds (None for dgelu); `aux` the stored value it
    writes (gelu_aux_bias: the biased product, the GELU's input) or reads (dgelu: the GELU's
    input), else None; `result` the value the GEMM itself writes."""

    name: str
    bias: BiasEpilogue | None
    aux: int | None
    result: int


def bias_epilogue(step, producers: dict[int, Operation]) -> BiasEpilogue | None:
    """The bias a dot step's epilogue adds, or None when it has none (or not one that
    `fuse_bias_epilogues` makes)."""
    if step.kind != "dot" or not 1 <= len(step.epilogue) <= 2:
        return None
    return _bias_of(step.op, step.epilogue[0], producers)


def gemm_epilogue(step, producers: dict[int, Operation]) -> GemmEpilogue | None:
    """The epilogue of a dot step (`fuse_bias_epilogues`, `fuse_gelu_epilogues`), or None."""
    if step.kind != "dot" or not step.epilogue:
        return None
    bias = bias_epilogue(step, producers)
    if bias is not None and len(step.epilogue) == 1:
        return GemmEpilogue("bias", bias, None, bias.result)
    if bias is not None:
        return GemmEpilogue("gelu_aux_bias", bias, bias.result, step.epilogue[1].writes[0])
    aux = _slope_input(step.epilogue[0], step.op.results[0], producers)
    if aux is None:
        return None
    return GemmEpilogue("dgelu", None, aux, step.epilogue[0].writes[0])


def fuse_gelu_epilogues(
    steps: list,
    producers: dict[int, Operation],
    is_stored: Callable[[int], bool],
    outputs: frozenset[int],
) -> list:
    """`steps` with each GELU loop that qualifies (see the module doc) moved into the GEMM
    before it: the forward's into a bias GEMM (`fuse_bias_epilogues` first) that writes the
    GELU's input, the backward's into the GEMM whose product it scales."""
    readers = _reader_counts(steps)
    writers = {
        value: i for i, step in enumerate(steps) if step.kind == "dot" for value in step.writes
    }
    fused: dict[int, object] = {}
    dropped: set[int] = set()
    for i, step in enumerate(steps):
        if step.kind != "loop" or len(step.writes) != 1 or step.epilogue:
            continue
        made = _gelu_forward(step, writers, steps, producers)
        if made is None:
            made = _gelu_backward(step, writers, steps, producers, is_stored, readers, outputs)
        if made is None or made[0] in fused:
            continue
        fused[made[0]] = made[1]
        dropped.add(i)
    return [fused.get(i, s) for i, s in enumerate(steps) if i not in dropped]


def _gelu_forward(loop, writers: dict[int, int], steps: list, producers) -> tuple | None:
    """(the bias GEMM's position, it with `loop` as its second epilogue) where `loop` is
    `gelu_tanh` of the sum that GEMM stores and nothing else."""
    op = loop.op
    if op.kind != "unary" or op.attrs["op"] != "gelu_tanh" or loop.fused:
        return None
    at = writers.get(op.operands[0])
    dot = None if at is None else steps[at]
    if dot is None or len(dot.epilogue) != 1 or bias_epilogue(dot, producers) is None:
        return None
    writes = (*dot.writes, *loop.writes)
    return at, replace(dot, writes=writes, epilogue=(*dot.epilogue, loop))


def _gelu_backward(
    loop, writers, steps: list, producers, is_stored, readers, outputs
) -> tuple | None:
    """(the GEMM's position, it with `loop` as its epilogue) where `loop` multiplies that
    plain GEMM's product, read by nothing else, by `gelu_tanh_slope` of a stored value."""
    product = next((v for v in loop.op.operands if v in writers), None)
    if product is None or product in outputs or readers.get(product, 0) != 1:
        return None
    at = writers[product]
    dot = steps[at]
    if dot.epilogue or not _plain_gemm(dot) or dot.writes != (product,):
        return None
    aux = _slope_input(loop, product, producers)
    if aux is None or not is_stored(aux) or not _written_before(aux, at, steps):
        return None
    reads = tuple(dict.fromkeys((*dot.reads, aux)))
    return at, replace(dot, writes=loop.writes, reads=reads, fused=loop.fused, epilogue=(loop,))


def _written_before(value: int, at: int, steps: list) -> bool:
    """Whether no step from position `at` on writes `value` (the GEMM at `at` may read it)."""
    return not any(value in step.writes for step in steps[at:])


def _slope_input(loop, product: int, producers) -> int | None:
    """The value whose `gelu_tanh_slope` `loop` multiplies `product` by (its whole work), or
    None."""
    op = loop.op
    if op is None or op.kind != "mul" or len(op.operands) != 2 or product not in op.operands:
        return None
    others = [v for v in op.operands if v != product]
    slope = producers.get(others[0]) if len(others) == 1 else None
    if slope is None or slope.kind != "unary" or slope.attrs["op"] != "gelu_tanh_slope":
        return None
    if tuple(loop.fused) != (slope,) or slope.operand_types[0] != op.type:
        return None
    return slope.operands[0]


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
