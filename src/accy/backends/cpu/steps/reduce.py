"""Reductions, in the loop order the plan chose (`accy.lower.reduction`).

A reduction to one element that is worth threads is cut into `CHUNKS` fixed chunks whose partial
results are combined in chunk order: the same sum on any number of threads.
"""

from __future__ import annotations

from ....codegen.c import templates
from ....codegen.c.dialect import GCC
from ....codegen.c.expressions import linear
from ....codegen.c.literals import highest, lowest
from ..loops import PARALLEL_FOR, axis_index, axis_loops, coalesced, nest, worth_threads
from .context import CHUNKS, StepContext, store_element


def _reduce_setup(ctx: StepContext):
    ctx.value_pointers()
    op = ctx.step.op
    init_body = ctx.body()
    init = init_body.value(op.operands[1], ())
    compute = GCC.c_type(op.type.dtype).compute
    return op, init_body.lines + [f"const {compute} init = {init};"], compute


def identity(reducer: str, dtype) -> str:
    """The start of a partial result: 0 for sum, 1 for prod, the extremes for max and min."""
    return {"sum": "0", "prod": "1", "max": lowest(dtype), "min": highest(dtype)}[reducer]


SIMD_REDUCTIONS = {"sum": "+", "prod": "*"}


def _simd(reducers: list[str], variables: list[str]) -> str | None:
    """OpenMP's simd clause for accumulators `variables`, if every reducer has one (max and
    min of floats must keep NaN, which OpenMP's max does not promise)."""
    if not all(r in SIMD_REDUCTIONS for r in reducers):
        return None
    clauses = " ".join(
        f"reduction({SIMD_REDUCTIONS[r]}:{v})" for r, v in zip(reducers, variables, strict=True)
    )
    return f"#pragma omp simd {clauses}"


def _reduce_rows(ctx: StepContext) -> list[str]:
    """Row reductions (one, or a `reductions` step's members over the same rows): one loop
    nest per result element, the inner loop over the reduced axes updating one accumulator per
    reduction."""
    ctx.value_pointers()
    ops = [m.op for m in ctx.step.members] or [ctx.step.op]
    layout = ctx.step.detail
    x_type = layout.input
    kept_loops = axis_loops(x_type, positions=layout.kept)
    reduced_loops = axis_loops(x_type, positions=layout.reduced)
    index = axis_index(x_type)
    out_position = linear(tuple(index[p] for p in layout.kept), ops[0].type.extents)
    names = ["acc"] if len(ops) == 1 else [f"acc{j}" for j in range(len(ops))]
    lines, starts, combines, stores = [], [], [], []
    body = ctx.body()
    for name, op in zip(names, ops, strict=True):
        dtype, ctype = op.type.dtype, GCC.c_type(op.type.dtype)
        init_body = ctx.body()
        init = init_body.value(op.operands[1], ())
        lines += init_body.lines + [f"const {ctype.compute} {name}_init = {init};"]
        starts.append(f"{ctype.compute} {name} = {name}_init;")
        x = body.value(op.operands[0], index)
        reduced = templates.binary(templates.REDUCERS[op.attrs["op"]], ctype, name, x)
        combines.append(f"{name} = {reduced};")
        stores += _store_result(ctx, op, name, out_position)
    stores += _epilogue(ctx, ops, names, out_position)
    large = worth_threads(x_type.size, ctx.step.fused)
    if len(ops) == 1 and not kept_loops and large and _worth_chunks(reduced_loops):
        reducer, dtype = ops[0].attrs["op"], ops[0].type.dtype
        compute = GCC.c_type(dtype).compute
        return lines + _chunked_full_reduction(
            reduced_loops, body.lines + combines, reducer, dtype, compute, stores[0]
        )
    simd = _simd([op.attrs["op"] for op in ops], names)
    inner = nest(reduced_loops, body.lines + combines, inner_pragma=simd)
    outer = PARALLEL_FOR if kept_loops and large and kept_loops[0][1] > 1 else None
    return lines + nest(kept_loops, starts + inner + stores, outer)


def _store_result(ctx: StepContext, op, name: str, position: str) -> list[str]:
    """Store accumulator `name` as `op`'s result (where the plan keeps it); with an epilogue,
    first as a rounded temporary `{name}_result` that the epilogue reads."""
    ctype = GCC.c_type(op.type.dtype)
    pointer = ctx.pointers.get(op.results[0])
    if not ctx.step.epilogue:
        return [store_element(op.type.dtype, pointer, position, ctype.round.format(x=name))]
    lines = [f"const {ctype.compute} {name}_result = {ctype.round.format(x=name)};"]
    if pointer is not None:
        lines.append(store_element(op.type.dtype, pointer, position, f"{name}_result"))
    return lines


def _epilogue(ctx: StepContext, ops, names: list[str], position: str) -> list[str]:
    """The step's epilogue loops at result `position`, reading each result from its rounded
    temporary (the value a load of the stored result gives: the same bits as the loops
    run on their own); each loop's result stored where the plan keeps it."""
    if not ctx.step.epilogue:
        return []
    body = ctx.body()
    body.lines.append(f"const int64_t e = {position};")
    results = {op.results[0]: f"{name}_result" for op, name in zip(ops, names, strict=True)}

    def store(value: int, x: str) -> None:
        if value in ctx.pointers:
            dtype = ctx.plan.program.type_of(value).dtype
            body.lines.append(store_element(dtype, ctx.pointers[value], "e", x))

    body.epilogue(results, ctx.step.epilogue, "e", store)
    return body.lines


def _worth_chunks(reduced_loops) -> bool:
    """Whether a reduction to one element has an outermost loop long enough to cut in chunks."""
    return bool(reduced_loops) and reduced_loops[0][1] >= 2 * CHUNKS


def _chunked_full_reduction(loops, inner, reducer, dtype, compute, store) -> list[str]:
    """A reduction to one element over threads: fixed chunks of the outermost loop, each with
    its own partial result, combined in chunk order."""
    counter, extent = loops[0]
    bounds = {counter: (f"c * {extent}LL / {CHUNKS}", f"(c + 1) * {extent}LL / {CHUNKS}")}
    chunk = nest(loops, inner, inner_pragma=_simd([reducer], ["acc"]), bounds=bounds)
    combine_parts = templates.binary(
        templates.REDUCERS[reducer], GCC.c_type(dtype), "acc", "part[c]"
    )
    return [
        f"{compute} part[{CHUNKS}];",
        PARALLEL_FOR,
        f"for (int64_t c = 0; c < {CHUNKS}; ++c) {{",
        f"  {compute} acc = {identity(reducer, dtype)};",
        *("  " + line for line in chunk),
        "  part[c] = acc;",
        "}",
        f"{compute} acc = acc_init;",
        f"for (int64_t c = 0; c < {CHUNKS}; ++c) acc = {combine_parts};",
        store,
    ]


def _reduce_columns(ctx: StepContext) -> list[str]:
    op, lines, compute = _reduce_setup(ctx)
    layout = ctx.step.detail
    x_type, dtype, reducer = layout.input, op.type.dtype, op.attrs["op"]
    ctype = GCC.c_type(dtype)
    out = ctx.pointers[op.results[0]]
    if layout.needs_accumulator:
        accumulator, load, store = ctx.scratch("float", "accumulator"), "{x}", "{x}"
    else:
        accumulator, load, store = out, ctype.load, ctype.store
    n = op.type.size
    lines += [f"for (int64_t o = 0; o < {n}; ++o) {accumulator}[o] = {store.format(x='init')};"]

    def statements(components: dict[str, str]) -> list[str]:
        index = tuple(components.get(c, c) for c in axis_index(x_type))
        position = linear(tuple(index[p] for p in layout.kept), op.type.extents)
        body = ctx.body()
        x = body.value(op.operands[0], index)
        current = load.format(x=f"{accumulator}[{position}]")
        combined = templates.binary(templates.REDUCERS[reducer], ctype, current, x)
        return body.lines + [f"{accumulator}[{position}] = {store.format(x=combined)};"]

    # Kept axes next to each other (a softmax's batch and head) become one longer loop.
    lines += nest(*coalesced(axis_loops(x_type), statements))
    if layout.needs_accumulator:
        rounded = ctype.round.format(x=f"{accumulator}[o]")
        lines.append(f"for (int64_t o = 0; o < {n}; ++o) {store_element(dtype, out, 'o', rounded)}")
    return lines


def emit_reduce(ctx: StepContext) -> list[str]:
    """A reduction in the loop order the plan chose (`accy.lower.reduction`); a `reductions`
    step (row reductions over the same rows) as one loop nest."""
    return (_reduce_rows if ctx.step.detail.strategy == "rows" else _reduce_columns)(ctx)
