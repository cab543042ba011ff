"""Reductions, in the loop order the plan chose (`accy.lower.reduction`).

A reduction to one element that is worth threads is cut into `CHUNKS` fixed chunks whose partial
results are combined in chunk order: the same sum on any number of threads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ....codegen.c import templates
from ....codegen.c.dialect import GCC
from ....codegen.c.expressions import EMITTERS, linear
from ....codegen.c.literals import highest, lowest
from ....codegen.c.loops import PARALLEL_FOR, nest
from ..loops import axis_index, axis_loops, coalesced, worth_threads
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
EXTREMES = {"max": "max", "min": "min"}  # OpenMP's reductions, which may drop a NaN


def _simd(reducers: list[str], variables: list[str]) -> str | None:
    """OpenMP's simd clause for accumulators `variables`, if every reducer has one (the row
    reductions' max and min have theirs through `_row_pass`'s NaN flags)."""
    if not all(r in SIMD_REDUCTIONS for r in reducers):
        return None
    clauses = " ".join(
        f"reduction({SIMD_REDUCTIONS[r]}:{v})" for r, v in zip(reducers, variables, strict=True)
    )
    return f"#pragma omp simd {clauses}"


def _row_simd(ops, names: list[str]) -> str | None:
    """The simd clause of row reductions `ops` (accumulators `names`): sums and products, and
    max and min, whose float accumulators are kept with a flag `{name}_nan` (`_extreme_lines`)
    since OpenMP's max and min combine the lanes without NaN."""
    clauses = []
    for op, name in zip(ops, names, strict=True):
        reducer = op.attrs["op"]
        if reducer in SIMD_REDUCTIONS:
            clauses.append(f"reduction({SIMD_REDUCTIONS[reducer]}:{name})")
        elif reducer in EXTREMES:
            clauses.append(f"reduction({EXTREMES[reducer]}:{name})")
            if GCC.c_type(op.type.dtype).family == "float":
                clauses.append(f"reduction(|:{name}_nan)")
        else:
            return None
    return f"#pragma omp simd {' '.join(clauses)}"


def _extreme_lines(op, name: str, x: str) -> tuple[list[str], list[str], list[str]]:
    """For a float max or min in vector lanes: the NaN flag's declaration, its update from
    element `x`, and the fix after the row (a NaN seen makes the result NaN, as the serial
    loop's comparison keeps it)."""
    ctype = GCC.c_type(op.type.dtype)
    if op.attrs["op"] not in EXTREMES or ctype.family != "float":
        return [], [], []
    nan = '__builtin_nan("")' if ctype.compute == "double" else '__builtin_nanf("")'
    return (
        [f"int {name}_nan = 0;"],
        [f"{name}_nan |= {x} != {x};"],
        [f"if ({name}_nan) {name} = {nan};"],
    )


@dataclass(frozen=True)
class RowNest:
    """The pieces of one pass of row reductions over their rows: statements `before` the loop
    nest (initial values), the loops over the kept and the reduced axes, the accumulators'
    declarations (`starts`), what the inner loop runs per element (`element`), what corrects
    the accumulators after it (`fixes`: a vectorized max's NaN) and the stores, and whether
    the nest is worth threads."""

    before: list[str]
    kept_loops: list
    reduced_loops: list
    starts: list[str]
    element: list[str]
    fixes: list[str]
    stores: list[str]
    simd: str | None
    large: bool

    @property
    def per_row(self) -> list[str]:
        """What runs once per row: the accumulators' loop over it, then the stores."""
        inner = nest(self.reduced_loops, self.element, inner_pragma=self.simd)
        return self.starts + inner + self.fixes + self.stores


def _row_pass(ctx: StepContext, prefix: str = "") -> RowNest:
    """The `RowNest` of row reductions `ctx.step` (one, or a `reductions` step's members over
    the same rows): one accumulator per reduction (named with `prefix`), updated by an inner
    loop over the reduced axes."""
    ops = [m.op for m in ctx.step.members] or [ctx.step.op]
    layout = ctx.step.detail
    x_type = layout.input
    kept_loops = axis_loops(x_type, positions=layout.kept)
    reduced_loops = axis_loops(x_type, positions=layout.reduced)
    index = axis_index(x_type)
    out_position = linear(tuple(index[p] for p in layout.kept), ops[0].type.extents)
    names = ["acc"] if len(ops) == 1 else [f"acc{j}" for j in range(len(ops))]
    names = [prefix + name for name in names]
    lines, starts, combines, fixes, stores = [], [], [], [], []
    body = ctx.body()
    for name, op in zip(names, ops, strict=True):
        ctype = GCC.c_type(op.type.dtype)
        init_body = ctx.body()
        init = init_body.value(op.operands[1], ())
        lines += init_body.lines + [f"const {ctype.compute} {name}_init = {init};"]
        starts.append(f"{ctype.compute} {name} = {name}_init;")
        x = body.value(op.operands[0], index)
        reduced = templates.binary(templates.REDUCERS[op.attrs["op"]], ctype, name, x)
        combines.append(f"{name} = {reduced};")
        flag, update, fix = _extreme_lines(op, name, x)
        starts += flag
        combines += update
        fixes += fix
        stores += _store_result(ctx, op, name, out_position)
    stores += _epilogue(ctx, ops, names, out_position)
    simd = _row_simd(ops, names)
    large = worth_threads(x_type.size, ctx.step.fused)
    element = body.lines + combines
    return RowNest(lines, kept_loops, reduced_loops, starts, element, fixes, stores, simd, large)


def _loop_pass(ctx: StepContext, layout) -> RowNest:
    """The `RowNest` of loop `ctx.step`, a chain's phase over the rows of `layout`: each
    element of the row computed and stored."""
    op = ctx.step.op
    index = axis_index(op.type)
    body = ctx.body()
    x = EMITTERS[op.kind](body, op, index)
    pointer = ctx.pointers[op.results[0]]
    stored = store_element(op.type.dtype, pointer, linear(index, op.type.extents), x)
    kept_loops = axis_loops(op.type, positions=layout.kept)
    reduced_loops = axis_loops(op.type, positions=layout.reduced)
    large = worth_threads(op.type.size, ctx.step.fused)
    return RowNest([], kept_loops, reduced_loops, [], body.lines + [stored], [], [], None, large)


def _reduce_rows(ctx: StepContext) -> list[str]:
    """Row reductions (one, or a `reductions` step's members over the same rows): one loop
    nest per result element, the inner loop over the reduced axes updating one accumulator per
    reduction."""
    ctx.value_pointers()
    ops = [m.op for m in ctx.step.members] or [ctx.step.op]
    row = _row_pass(ctx)
    if len(ops) == 1 and not row.kept_loops and row.large and _worth_chunks(row.reduced_loops):
        reducer, dtype = ops[0].attrs["op"], ops[0].type.dtype
        compute = GCC.c_type(dtype).compute
        flags, _, _ = _extreme_lines(ops[0], "acc", "")
        return row.before + _chunked_full_reduction(
            row.reduced_loops, row.element, reducer, dtype, compute, row.stores[0], flags
        )
    return row.before + nest(row.kept_loops, row.per_row, _outer(row))


def _outer(row: RowNest) -> str | None:
    """The pragma of a row pass's outermost kept loop: threads over its rows when large."""
    return PARALLEL_FOR if row.kept_loops and row.large and row.kept_loops[0][1] > 1 else None


def emit_chain(ctx: StepContext) -> list[str]:
    """A `chain` step (`accy.lower.grouping.reduction_chains`): one loop nest over the rows
    that runs each phase's pass over the row in turn, so that a later phase reads the row
    while it is still in cache, and reads an earlier phase's results where it just stored
    them."""
    ctx.value_pointers()
    passes = [
        _loop_pass(replace(ctx, step=phase), ctx.step.detail)
        if phase.kind == "loop"
        else _row_pass(replace(ctx, step=phase), prefix=f"p{k}_")
        for k, phase in enumerate(ctx.step.members)
    ]
    before = [line for row in passes for line in row.before]
    per_row = [line for row in passes for line in ("{", *("  " + s for s in row.per_row), "}")]
    large = any(row.large for row in passes)
    return before + nest(passes[0].kept_loops, per_row, _outer(replace(passes[0], large=large)))


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


def _chunked_full_reduction(loops, inner, reducer, dtype, compute, store, flags=()) -> list[str]:
    """A reduction to one element over threads: fixed chunks of the outermost loop, each with
    its own partial result (and `flags`, declarations the element's statements update: a max's
    NaN flag, which the chunks' serial comparisons do not need), combined in chunk order."""
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
        *("  " + line for line in flags),
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
