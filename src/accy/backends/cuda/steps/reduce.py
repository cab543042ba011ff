"""CUDA for a reduce step: one pass, or two with partial values in scratch (see `reductions`
for how threads share the work)."""

from __future__ import annotations

from ....codegen.c.expressions import Body, Flat, NotFlat
from ....errors import AccyError
from ..context import StepCode, StepContext, launches, nothing
from ..kernels import axis_names, blocks_for, compute_bytes, decompose
from ..reductions import Accumulator, Cut, Finish, choose_cut, reduction_lines
from .common import elementwise, rounded, store


def initial_value(ctx: StepContext, pointers, op) -> tuple[list[str], str]:
    """(statements, C operand) of reduction `op`'s initial value (its second operand)."""
    body = ctx.body(pointers)
    x = body.value(op.operands[1], ())
    return body.lines, x


def _partials(ctx: StepContext, accumulators, cut: Cut) -> list[tuple[str, int]]:
    """(C declaration of the pointer, scratch offset) of each accumulator's partial values."""
    parts = []
    for j, a in enumerate(accumulators):
        offset = ctx.scratch(cut.groups * compute_bytes(a.dtype))
        declaration = f"{a.compute} *__restrict__ part{j} = ({a.compute} *)(scratch + {offset});"
        parts.append((declaration, offset))
    return parts


def _final(outputs: list[str], dtypes) -> Finish:
    def finish(j: int, value: str) -> list[str]:
        return [store(dtypes[j], outputs[j], "o", rounded(dtypes[j], value))]

    return finish


def _partial(cut: Cut) -> Finish:
    def finish(j: int, value: str) -> list[str]:
        return [f"part{j}[o * {cut.chunks}LL + g] = {value};"]

    return finish


def _second_pass(ctx, cut: Cut, accumulators, parts, initial, outputs) -> tuple[str, int]:
    """The kernel that combines each result's partial values, in chunk order."""
    second = choose_cut(cut.outputs, cut.chunks, True, split=False)
    pointers = ctx.pointers()
    head, initials = initial(pointers)
    values = [f"part{j}[o * {cut.chunks}LL + r]" for j in range(len(accumulators))]
    lines = head + [declaration for declaration, _ in parts]
    lines += reduction_lines(
        second,
        lambda o: [],
        lambda r: ([], values),
        accumulators,
        initials,
        _final([pointers[v] for v in outputs], [a.dtype for a in accumulators]),
    )
    return ctx.kernel(pointers, lines, "(combine)"), second.grid


def reduction(ctx, cut, element, kept, accumulators, initial, outputs) -> StepCode:
    """One pass, or two with partial values in scratch; `initial(pointers)` gives statements
    and the initial values, `element(body, r)` the statements and elements at counter r."""
    pointers = ctx.pointers()
    body = ctx.body(pointers)
    final = cut.chunks == 1
    head, initials = initial(pointers) if final else ([], None)
    parts = [] if final else _partials(ctx, accumulators, cut)
    finish = (
        _final([pointers[v] for v in outputs], [a.dtype for a in accumulators])
        if final
        else _partial(cut)
    )
    lines = head + [declaration for declaration, _ in parts]
    lines += reduction_lines(cut, kept, lambda r: element(body, r), accumulators, initials, finish)
    kernels = [(ctx.kernel(pointers, lines), cut.grid)]
    if not final:
        kernels.append(_second_pass(ctx, cut, accumulators, parts, initial, outputs))
    return launches(*kernels)


def _fill_initial(ctx: StepContext) -> StepCode:
    """A reduction over no elements: every result is the initial value."""
    op = ctx.step.op

    def make(body: Body, flat: bool) -> list[str]:
        x = body.value(op.operands[1], ())
        pointer = body.pointers[op.results[0]]
        return body.lines + [store(op.type.dtype, pointer, "i", rounded(op.type.dtype, x))]

    return launches((elementwise(ctx, op.type.size, make), blocks_for(op.type.size)))


def _reduce_element(ctx: StepContext, flat: bool):
    op, layout = ctx.step.op, ctx.step.detail
    x_type = layout.input
    reduced = axis_names(x_type, "r", layout.reduced)
    kept = axis_names(x_type, "k", layout.kept)

    def element(body: Body, r: str):
        if flat:
            return body.lines, [body.value(op.operands[0], Flat(r, x_type))]
        index = [""] * x_type.rank
        for p, name in zip(layout.reduced, reduced, strict=True):
            index[p] = name
        for p, name in zip(layout.kept, kept, strict=True):
            index[p] = name
        extents = tuple(x_type.extents[p] for p in layout.reduced)
        head = decompose(r, extents, reduced)
        x = body.value(op.operands[0], tuple(index))
        return head + body.lines, [x]

    kept_extents = tuple(x_type.extents[p] for p in layout.kept)
    return element, lambda o: decompose(o, kept_extents, kept)


def emit_reduce(ctx: StepContext) -> StepCode:
    """A reduction of any axes: see `reductions` for how threads share the work."""
    op, layout = ctx.step.op, ctx.step.detail
    outputs = op.type.size
    if outputs == 0:
        return nothing
    length = layout.input.size // outputs
    if length == 0:
        return _fill_initial(ctx)
    cut = choose_cut(outputs, length, layout.strategy == "rows")
    accumulators = [Accumulator("acc", op.attrs["op"], op.type.dtype)]

    def initial(pointers):
        lines, x = initial_value(ctx, pointers, op)
        return lines, [x]

    for flat in (True, False) if outputs == 1 else (False,):
        element, kept = _reduce_element(ctx, flat)
        try:
            return reduction(ctx, cut, element, kept, accumulators, initial, list(op.results))
        except NotFlat:
            continue
    raise AccyError("internal: no kernel for a reduction")
