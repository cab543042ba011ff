"""CUDA for a reduce step: one pass, or two with partial values in scratch (see `reductions`
for how threads share the work)."""

from __future__ import annotations

from dataclasses import replace

from ....codegen.c.dialect import CUDA
from ....codegen.c.expressions import EMITTERS, Body, Flat, NotFlat, linear
from ....core.types import f32
from ....errors import AccyError
from ....lower.views import row_major
from ..columns import ColumnKernel, ColumnLoop, choose_column_cut, column_lines
from ..context import StepCode, StepContext, launches, nothing
from ..kernels import COUNTERS, axis_names, compute_bytes, decompose
from ..reductions import (
    Accumulator,
    Cut,
    Finish,
    OnlineSum,
    RowPass,
    Vectors,
    chain_cut,
    chain_lines,
    choose_cut,
    reduction_lines,
)
from ..vectors import MIN_VECTOR_ELEMENTS, LaneBody, lane_divisor
from .common import elementwise_kernel, innermost, rounded, step_lane_width, store, store_at
from .loop import emit_loop


def initial_value(ctx: StepContext, pointers, op) -> tuple[list[str], str]:
    """(statements, C operand) of reduction `op`'s initial value (its second operand)."""
    body = ctx.body(pointers)
    x = body.value(op.operands[1], ())
    return body.lines, x


def initial_values(ctx: StepContext, ops):
    """A function of the kernel's pointers giving (statements, C operands) of the initial
    values of reductions `ops`, in order."""

    def initial(pointers) -> tuple[list[str], list[str]]:
        lines, values = [], []
        for op in ops:
            head, x = initial_value(ctx, pointers, op)
            lines += head
            values.append(x)
        return lines, values

    return initial


def _partials(ctx: StepContext, accumulators, cut: Cut) -> list[tuple[str, int]]:
    """(C declaration of the pointer, scratch offset) of each accumulator's partial values."""
    parts = []
    for j, a in enumerate(accumulators):
        offset = ctx.scratch(cut.groups * compute_bytes(a.dtype))
        declaration = f"{a.compute} *__restrict__ part{j} = ({a.compute} *)(scratch + {offset});"
        parts.append((declaration, offset))
    return parts


def _final(ctx: StepContext, pointers, outputs: list[int], dtypes) -> Finish:
    """Store each final value (result `o`) where the plan keeps it; with an epilogue, as a
    rounded temporary `result{j}` first, and after the last one the epilogue's loops."""
    if not ctx.step.epilogue:

        def finish(j: int, value: str) -> list[str]:
            return [store(dtypes[j], pointers[outputs[j]], "o", rounded(dtypes[j], value))]

        return finish

    def finish_with_epilogue(j: int, value: str) -> list[str]:
        compute = CUDA.c_type(dtypes[j]).compute
        lines = [f"const {compute} result{j} = {rounded(dtypes[j], value)};"]
        if outputs[j] in ctx.step.writes:
            lines.append(store(dtypes[j], pointers[outputs[j]], "o", f"result{j}"))
        if j == len(outputs) - 1:
            lines += epilogue_lines(ctx, pointers, outputs)
        return lines

    return finish_with_epilogue


def epilogue_lines(ctx: StepContext, pointers, outputs: list[int]) -> list[str]:
    """The step's epilogue loops at result `o`, reading result `j` from `result{j}` (the value
    a load of the stored result gives); each loop's result stored where the plan keeps it."""
    body = ctx.body(pointers)
    results = {value: f"result{j}" for j, value in enumerate(outputs)}

    def store_kept(value: int, x: str) -> None:
        if value in ctx.step.writes:
            dtype = ctx.plan.program.type_of(value).dtype
            body.lines.append(store(dtype, pointers[value], "o", x))

    body.epilogue(results, ctx.step.epilogue, "o", store_kept)
    return body.lines


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
        lambda r: ([], [values]),
        accumulators,
        initials,
        _final(ctx, pointers, outputs, [a.dtype for a in accumulators]),
    )
    return ctx.kernel(pointers, lines, "(combine)"), second.grid


def reduction(ctx, cut, element, kept, accumulators, initial, outputs) -> StepCode:
    """One pass, or two with partial values in scratch; `initial(pointers)` gives statements
    and the initial values, `element(body, r)` the statements and each lane's elements from
    counter r on (one lane in a plain `Body`, `body.width` in a `LaneBody`). With
    `cut.width > 1` each thread takes that many elements at a time where loads allow."""
    pointers = ctx.pointers()
    body = ctx.body(pointers)
    final = cut.chunks == 1
    head, initials = initial(pointers) if final else ([], None)
    parts = [] if final else _partials(ctx, accumulators, cut)
    finish = (
        _final(ctx, pointers, outputs, [a.dtype for a in accumulators]) if final else _partial(cut)
    )
    scalar = element(body, "r")
    cut, vectors = _lane_vectors(ctx, pointers, cut, element)
    lines = head + [declaration for declaration, _ in parts]
    lines += reduction_lines(cut, kept, lambda r: scalar, accumulators, initials, finish, vectors)
    kernels = [(ctx.kernel(pointers, lines), cut.grid)]
    if not final:
        kernels.append(_second_pass(ctx, cut, accumulators, parts, initial, outputs))
    return launches(*kernels)


def _fill_initial(ctx: StepContext) -> StepCode:
    """A reduction over no elements: every result is the initial value."""
    op = ctx.step.op

    def make(body: Body, index, position: str) -> None:
        x = body.value(op.operands[1], ())
        pointer = body.pointers[op.results[0]]
        body.lines.append(
            store_at(body, op.type.dtype, pointer, position, rounded(op.type.dtype, x))
        )

    return launches(elementwise_kernel(ctx, op.type, make))


def _reduce_element(ctx: StepContext, ops, flat: bool):
    """(element, kept) of `reduction` for reductions `ops` over the same rows (one, or a
    `reductions` step's members): each lane's elements at chunk counter r, one per reduction;
    the kept indices."""
    layout = ctx.step.detail
    x_type = layout.input
    at_row, kept = _row_indices(layout)

    def element(body: Body, r: str):
        width = body.width if isinstance(body, LaneBody) else 1
        if flat:
            counters = [body.lane(r, k) for k in range(width)] if width > 1 else [r]
            values = [[body.value(op.operands[0], Flat(c, x_type)) for op in ops] for c in counters]
            return body.lines, values
        head, indices = at_row(body, r)
        values = [[body.value(op.operands[0], at) for op in ops] for at in indices]
        return head + body.lines, values

    return element, kept


def reduction_width(ctx: StepContext, extents, size: int) -> int:
    """Elements a thread of a reduction over `extents` (of an input of `size` elements) takes
    at a time: a vector's worth of the buffers it reads, dividing the innermost reduced
    extent; 1 for small inputs."""
    p = innermost(extents)
    if p is None or size < MIN_VECTOR_ELEMENTS:
        return 1
    return lane_divisor(step_lane_width(ctx), extents[p])


def _columns(ctx: StepContext, outputs: int, length: int, initial) -> StepCode:
    """A reduction that keeps the innermost axis (`columns`: a bias gradient, a sum over the
    batch) as one kernel (`accy.backends.cuda.columns`): each thread `width` adjacent results,
    one vector load per row where the buffers allow it (`width` is 1 where no load would be a
    vector, or the input is small)."""
    op, layout = ctx.step.op, ctx.step.detail
    x_type = layout.input
    kept_extents = tuple(x_type.extents[p] for p in layout.kept)
    reduced_extents = tuple(x_type.extents[p] for p in layout.reduced)
    q = innermost(kept_extents)
    reduced = axis_names(x_type, "r", layout.reduced)
    kept = axis_names(x_type, "k", layout.kept)
    position = layout.kept[q]
    pointers = ctx.pointers()

    def loop(body: LaneBody) -> ColumnLoop:
        index = [""] * x_type.rank
        for p, name in zip((*layout.reduced, *layout.kept), (*reduced, *kept), strict=True):
            index[p] = name
        head = decompose("r", reduced_extents, reduced)
        values = []
        for k in range(body.width):
            at = index[:position] + [body.lane(kept[q], k)] + index[position + 1 :]
            values.append(body.value(op.operands[0], tuple(at)))
        statements = head + body.lines
        statements = body.pruned(statements) if body.vectors else statements
        return ColumnLoop(statements, values, body.aligned_condition())

    width = lane_divisor(step_lane_width(ctx), kept_extents[q])
    vector = None
    if width > 1 and x_type.size >= MIN_VECTOR_ELEMENTS:
        vector_body = LaneBody(ctx.module, ctx.plan, pointers, width)
        vector = loop(vector_body)
        if not vector_body.vectorized:
            vector = None
    if vector is None:
        width = 1
    scalar = loop(LaneBody(ctx.module, ctx.plan, pointers, width, vectors=False))
    cut = choose_column_cut(outputs, length, width, COUNTERS)
    accumulator = Accumulator("acc", op.attrs["op"], op.type.dtype)
    head, initials = initial(pointers)
    result = pointers[op.results[0]]
    partials = counters = ""
    if cut.chunks > 1:
        offset = ctx.scratch(cut.chunks * outputs * compute_bytes(op.type.dtype))
        partials = f"(({accumulator.compute} *)(scratch + {offset}))"
        counters = ctx.module.counters()

    def first(o: str) -> list[str]:
        return [f"const int64_t {o}_first = {o} * {width};"] + decompose(
            f"{o}_first", kept_extents, kept
        )

    def final(column: str, value: str) -> list[str]:
        return [store(op.type.dtype, result, column, rounded(op.type.dtype, value))]

    kernel = ColumnKernel(accumulator, first, head, initials[0], final, partials, counters)
    lines = column_lines(cut, kernel, scalar, vector)
    return launches((ctx.kernel(pointers, lines, "(columns)"), cut.grid))


def emit_reduce(ctx: StepContext) -> StepCode:
    """A reduction of any axes: see `reductions` for how threads share the work. A
    `reductions` step (row reductions over the same rows, `accy.lower.grouping`) is one
    kernel with an accumulator per member, each with its own reducer and dtype."""
    layout = ctx.step.detail
    ops = [m.op for m in ctx.step.members] or [ctx.step.op]
    outputs = ops[0].type.size
    if outputs == 0:
        return nothing
    length = layout.input.size // outputs
    if length == 0:
        return _fill_initial(ctx)

    initial = initial_values(ctx, ops)

    if layout.strategy == "columns":
        return _columns(ctx, outputs, length, initial)
    reduced_extents = tuple(layout.input.extents[p] for p in layout.reduced)
    width = reduction_width(ctx, reduced_extents, layout.input.size)
    cut = choose_cut(outputs, length, layout.strategy == "rows", width=width)
    names = ["acc"] if len(ops) == 1 else [f"acc{j}" for j in range(len(ops))]
    accumulators = [
        Accumulator(name, op.attrs["op"], op.type.dtype)
        for name, op in zip(names, ops, strict=True)
    ]
    results = [op.results[0] for op in ops]
    for flat in (True, False) if outputs == 1 else (False,):
        element, kept = _reduce_element(ctx, ops, flat)
        try:
            return reduction(ctx, cut, element, kept, accumulators, initial, results)
        except NotFlat:
            continue
    raise AccyError("internal: no kernel for a reduction")


def _phase_ops(step) -> list:
    return [m.op for m in step.members] or [step.op]


def _lane_vectors(ctx: StepContext, pointers, cut: Cut, element) -> tuple[Cut, Vectors | None]:
    """(the cut, the vector form of a row's element) where `cut.width` elements a thread can
    be loaded at a time; else the cut one element wide, and None."""
    if cut.width > 1:
        lanes = LaneBody(ctx.module, ctx.plan, pointers, cut.width)
        statements, values = element(lanes, "r")
        if lanes.vectorized:
            vector = (lanes.pruned(statements), values)
            return cut, Vectors(lambda r: vector, lanes.aligned_condition())
    return replace(cut, width=1), None


def _row_pass(ctx: StepContext, pointers, cut: Cut, prefix: str) -> tuple[list[str], RowPass]:
    """(statements before the kernel's loop, the pass) of row reduction step `ctx.step` (a
    chain's phase: a `reduce` or `reductions` step with its epilogue) in a kernel with
    `pointers`, one chunk per row, its accumulators named with `prefix`."""
    ops = _phase_ops(ctx.step)
    accumulators = [
        Accumulator(f"{prefix}acc{j}", op.attrs["op"], op.type.dtype) for j, op in enumerate(ops)
    ]
    head, initials = initial_values(ctx, ops)(pointers)
    finish = _final(ctx, pointers, [op.results[0] for op in ops], [op.type.dtype for op in ops])
    element, kept = _reduce_element(ctx, ops, False)
    scalar = element(ctx.body(pointers), "r")
    cut, vectors = _lane_vectors(ctx, pointers, cut, element)
    return head, RowPass(cut, kept, lambda r: scalar, accumulators, initials, finish, vectors)


def _loop_pass(ctx: StepContext, pointers, cut: Cut, layout) -> RowPass:
    """The pass of loop `ctx.step` (a chain's phase over the rows of `layout`) in a kernel
    with `pointers`: each of the row's threads computes and stores `cut.width` adjacent
    elements at a time (one vector store where the buffers allow), else one."""
    op = ctx.step.op
    strides = row_major(op.type.extents)
    pointer = pointers[op.results[0]]
    element, kept = _row_indices(layout)

    def compute(body: Body, r: str):
        head, indices = element(body, r)
        for at in indices:
            x = EMITTERS[op.kind](body, op, at)
            if isinstance(body, LaneBody):
                body.lines.append(body.store_element(op.type.dtype, pointer, at, strides, x))
            else:
                body.lines.append(store(op.type.dtype, pointer, linear(at, op.type.extents), x))
        if isinstance(body, LaneBody):
            return head + body.lines + body.stores(), []
        return head + body.lines, []

    scalar = compute(ctx.body(pointers), "r")
    cut, vectors = _lane_vectors(ctx, pointers, cut, compute)
    return RowPass(cut, kept, lambda r: scalar, [], [], lambda j, value: [], vectors)


def _row_indices(layout):
    """(element, kept) for a loop over the rows of `layout`: `element(body, r)` gives the
    statements and the index of each lane's element at counter r of the row; `kept(o)` the
    row's index statements."""
    x_type = layout.input
    reduced = axis_names(x_type, "r", layout.reduced)
    kept = axis_names(x_type, "k", layout.kept)
    extents = tuple(x_type.extents[p] for p in layout.reduced)

    def element(body: Body, r: str):
        width = body.width if isinstance(body, LaneBody) else 1
        index = [""] * x_type.rank
        for p, name in zip(layout.reduced, reduced, strict=True):
            index[p] = name
        for p, name in zip(layout.kept, kept, strict=True):
            index[p] = name
        head = decompose(r, extents, reduced)
        indices = [tuple(index)]
        if width > 1:
            p = layout.reduced[innermost(extents)]
            indices = [
                tuple(index[:p] + [body.lane(index[p], k)] + index[p + 1 :]) for k in range(width)
            ]
        return head, indices

    kept_extents = tuple(x_type.extents[p] for p in layout.kept)
    return element, lambda o: decompose(o, kept_extents, kept)


def _phase_cut(ctx: StepContext, layout, outputs: int, length: int) -> Cut | None:
    """The `chain_cut` of a chain's phase `ctx.step` over the rows of `layout` (its width
    follows its buffers)."""
    reduced_extents = tuple(layout.input.extents[p] for p in layout.reduced)
    width = reduction_width(ctx, reduced_extents, layout.input.size)
    return chain_cut(outputs, length, width)


def emit_chain(ctx: StepContext) -> StepCode:
    """A `chain` step (`accy.lower.grouping.reduction_chains`): one kernel in which the
    threads of each row run each phase's pass over the row in turn, storing its results and
    meeting at a barrier before the next pass, which reads the row again from L2 (a block's
    row of 50304 bf16 logits is 100 KB) and the earlier results where they were stored. Its
    grid is the first phase's (capping it to keep the rows in flight within half the L2 made
    GPT-2's cross-entropy slower, 0.62 against 0.46 ms). Where few rows leave the GPU idle
    (`chain_cut`:
    rows then split into chunks that a second kernel combines) each phase runs as its own
    reduction, in order."""
    phases = [replace(ctx, step=phase, phase=f".{k}") for k, phase in enumerate(ctx.step.members)]
    layout = ctx.step.detail
    outputs = _phase_ops(ctx.step.members[0])[0].type.size
    length = layout.input.size // outputs
    cuts = [_phase_cut(phase, layout, outputs, length) for phase in phases]
    if None not in cuts:  # every pass walks a row with as many lanes (their widths may differ)
        lanes = min(cut.lanes for cut in cuts)
        cuts = [replace(cut, lanes=lanes) for cut in cuts]
    if length == 0 or None in cuts:
        codes = [(emit_loop if p.step.kind == "loop" else emit_reduce)(p) for p in phases]
        ctx.scratch_used = max(phase.scratch_used for phase in phases)

        def schedule_phases(level, schedule) -> None:
            for code in codes:
                code(level, schedule)

        return schedule_phases
    pointers = ctx.pointers()
    heads, passes = [], []
    folded = _softmax_sum_of(phases)
    for k, (phase, cut) in enumerate(zip(phases, cuts, strict=True)):
        if phase.step.kind == "loop":
            passes.append(_loop_pass(phase, pointers, cut, layout))
            continue
        if folded is not None and k == 1:
            continue  # summed in the max's pass
        head, row = _row_pass(phase, pointers, cut, f"p{k}_")
        if folded is not None and k == 0:
            more, online = _online_sum(phases[1], pointers, folded)
            head += more
            row = replace(row, online=online)
        heads += head
        passes.append(row)
    kernel = ctx.kernel(pointers, heads + chain_lines(passes), "(chain)")
    return launches((kernel, cuts[0].grid))


# What may stand between the sum's exp(x - max) and the max it reads: the max broadcast along
# the row (and reshaped), its gradient stopped.
_MAX_READS = frozenset({"broadcast_in_dim", "reshape"})


def _softmax_sum_of(phases: list[StepContext]) -> int | None:
    """Which member of the chain's first phase is the max whose `sum(exp(x - max))` over each
    row the second phase computes (x being the values the max reduced: the cross-entropy's
    and the softmax's denominator), or None. That sum is then added in the max's pass, each
    thread's relative to its running max (`reductions.OnlineSum`): one read of each row
    instead of two. f32 maxes and float sums only (`accy_softmax_expf`)."""
    if len(phases) < 2 or phases[1].step.kind != "reduce":
        return None
    first, second = _phase_ops(phases[0].step), phases[1].step
    if second.op.attrs["op"] != "sum" or CUDA.c_type(second.op.type.dtype).compute != "float":
        return None
    producers = {r: op for op in second.fused for r in op.results}
    exp = producers.get(second.op.operands[0])
    if exp is None or exp.kind != "unary" or exp.attrs.get("op") != "exp":
        return None
    difference = producers.get(exp.operands[0])
    if difference is None or difference.kind != "sub":
        return None
    x, peak = difference.operands
    while peak in producers and (
        producers[peak].kind in _MAX_READS or producers[peak].attrs.get("op") == "stop_gradient"
    ):
        peak = producers[peak].operands[0]
    for j, op in enumerate(first):
        # An f32 max is stored as it is: the sum's pass would read the very value.
        if op.attrs["op"] == "max" and op.type.dtype == f32 and op.results[0] == peak:
            return j if op.operands[0] == x else None
    return None


def _online_sum(second: StepContext, pointers, of: int) -> tuple[list[str], OnlineSum]:
    """(statements before the kernel's loop, the running sum) of the chain's second phase
    folded into its first (`_softmax_sum_of`): its initial value and its stores (with its
    epilogue) as its own pass would make them."""
    op = second.step.op
    head, (initial,) = initial_values(second, [op])(pointers)
    finish = _final(second, pointers, [op.results[0]], [op.type.dtype])
    return head, OnlineSum("p1_sum", of, initial, lambda value: finish(0, value))
