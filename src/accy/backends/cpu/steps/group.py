"""Several flat steps over the same elements as one loop (see `accy.lower.grouping`)."""

from __future__ import annotations

from dataclasses import dataclass

from ....codegen.c import templates
from ....codegen.c.dialect import GCC
from ....codegen.c.expressions import EMITTERS, Body, Flat
from ....codegen.c.loops import PARALLEL_FOR, SIMD, nest
from ....lower.plan import Step
from ..loops import worth_threads
from .context import CHUNKS, StepContext, store_element
from .reduce import identity


@dataclass(frozen=True)
class GroupReduction:
    """A reduction inside a group's loop: its C variable, reducer, dtype, init and result."""

    name: str
    reducer: str
    dtype: object
    init: str
    output: str


def _group_member(ctx: StepContext, body: Body, member: Step, accumulators: list) -> None:
    op = member.op
    if member.kind == "loop":
        index = Flat("i", op.type)
        x = EMITTERS[op.kind](body, op, index)
        body.seed(op.results[0], index, x)
        if op.results[0] in ctx.pointers:
            body.lines.append(store_element(op.type.dtype, ctx.pointers[op.results[0]], "i", x))
        return
    init_body = ctx.body()
    init = init_body.value(op.operands[1], ())
    name = ctx.unit.fresh("acc")
    compute = GCC.c_type(op.type.dtype).compute
    ctx.prologue += init_body.lines + [f"const {compute} {name}_init = {init};"]
    x = body.value(op.operands[0], Flat("i", op.operand_types[0]))
    combined = templates.binary(
        templates.REDUCERS[op.attrs["op"]], GCC.c_type(op.type.dtype), name, x
    )
    body.lines.append(f"{name} = {combined};")
    accumulators.append(
        GroupReduction(
            name, op.attrs["op"], op.type.dtype, f"{name}_init", ctx.pointers[op.results[0]]
        )
    )


def _chunked_loop(size: int, inner: list[str], accumulators: list, parallel: bool) -> list[str]:
    """A flat loop cut into fixed chunks, each with its own partial results; the partials are
    combined in chunk order, so the sum is the same on any number of threads."""
    declare = [f"{GCC.c_type(a.dtype).compute} {a.name}_part[{CHUNKS}];" for a in accumulators]
    start = [
        f"{GCC.c_type(a.dtype).compute} {a.name} = {identity(a.reducer, a.dtype)};"
        for a in accumulators
    ]
    simd = None
    if all(a.reducer in ("sum", "prod") for a in accumulators):
        clauses = " ".join(
            f"reduction({'+' if a.reducer == 'sum' else '*'}:{a.name})" for a in accumulators
        )
        simd = f"#pragma omp simd {clauses}"
    bounds = {"i": (f"c * {size}LL / {CHUNKS}", f"(c + 1) * {size}LL / {CHUNKS}")}
    chunk = start + nest([("i", size)], inner, inner_pragma=simd, bounds=bounds)
    chunk += [f"{a.name}_part[c] = {a.name};" for a in accumulators]
    lines = declare + nest([("c", CHUNKS)], chunk, PARALLEL_FOR if parallel else None)
    for a in accumulators:
        ctype = GCC.c_type(a.dtype)
        combined = templates.binary(
            templates.REDUCERS[a.reducer], ctype, a.name, f"{a.name}_part[c]"
        )
        lines += [
            f"{ctype.compute} {a.name} = {a.init};",
            f"for (int64_t c = 0; c < {CHUNKS}; ++c) {a.name} = {combined};",
            store_element(a.dtype, a.output, "0", ctype.round.format(x=a.name)),
        ]
    return lines


def emit_group(ctx: StepContext) -> list[str]:
    """Several flat steps over the same elements as one loop (see `accy.lower.grouping`)."""
    ctx.value_pointers()
    first = ctx.step.members[0]
    size = first.op.type.size if first.kind == "loop" else first.op.operand_types[0].size
    body = ctx.body()
    accumulators: list[GroupReduction] = []
    for member in ctx.step.members:
        _group_member(ctx, body, member, accumulators)
    parallel = worth_threads(size, ctx.step.fused)
    if accumulators:
        return ctx.prologue + _chunked_loop(size, body.lines, accumulators, parallel)
    return nest([("i", size)], body.lines, PARALLEL_FOR if parallel else None, SIMD)
