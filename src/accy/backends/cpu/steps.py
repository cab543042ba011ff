"""C for each kind of plan step: one static function per step, looked up in `STEP_EMITTERS`.

A step function takes one `restrict` pointer per buffer it touches (the plan never lets a step
write a buffer it reads, and the boundary refuses overlapping user buffers), which lets the
compiler vectorize without alias checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import AccyError
from ...lower.contraction import Gemm, MatrixOperand
from ...lower.plan import BLAS_DTYPES, Plan, Step
from ...ops.contraction import dimensions, free_dimensions
from ...types import TensorType, bf16, f32
from . import templates
from .dtypes import c_type, highest, lowest
from .expressions import EMITTERS, Body, Flat, NotFlat, Unit, linear, offset_expression
from .loops import PARALLEL_FOR, SIMD, axis_index, axis_loops, nest, worth_threads

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
PARALLEL_GEMM_MNK = 1 << 23  # batch * m * n * k from which a GEMM is shared among threads
CHUNKS = 8  # fixed, so that a parallel reduction adds in the same order on any thread count


@dataclass
class StepContext:
    """What a step emitter works with; `parameter` declares the step function's pointers."""

    unit: Unit
    plan: Plan
    index: int
    step: Step
    slot_pointer: Callable[[int], str]
    scratch_pointer: Callable[[str], str]
    output_pointer: Callable[[int], str]
    params: list[tuple[str, str]] = field(default_factory=list)
    pointers: dict[int, str] = field(default_factory=dict)
    prologue: list[str] = field(default_factory=list)

    def parameter(self, ctype: str, name: str, argument: str, writable: bool) -> str:
        const = "" if writable else "const "
        self.params.append((f"{const}{ctype} *restrict {name}", argument))
        return name

    def value_pointers(self) -> None:
        for value in self.step.writes:
            storage = c_type(self.plan.program.type_of(value).dtype).storage
            self.pointers[value] = self.parameter(
                storage, f"v{value}", self.slot_pointer(value), True
            )
        for value in self.step.reads:
            storage = c_type(self.plan.program.type_of(value).dtype).storage
            self.pointers[value] = self.parameter(
                storage, f"v{value}", self.slot_pointer(value), False
            )

    def scratch(self, ctype: str, name: str) -> str:
        return self.parameter(ctype, f"s_{name}", self.scratch_pointer(name), True)

    def body(self) -> Body:
        return Body(self.unit, self.plan, self.pointers)


def _store(dtype, pointer: str, position: str, x: str) -> str:
    return f"{pointer}[{position}] = {c_type(dtype).store.format(x=x)};"


def _root_loop(ctx: StepContext, flat: bool) -> list[str]:
    op = ctx.step.op
    t = op.type
    body = ctx.body()
    index = Flat("i", t) if flat else axis_index(t)
    x = EMITTERS[op.kind](body, op, index)
    position = "i" if flat else linear(index, t.extents)
    loops = [("i", t.size)] if flat else axis_loops(t)
    pragma = PARALLEL_FOR if loops and worth_threads(t.size, ctx.step.fused + (op,)) else None
    store = _store(t.dtype, ctx.pointers[op.results[0]], position, x)
    return nest(loops, body.lines + [store], pragma, SIMD)


def emit_loop(ctx: StepContext) -> list[str]:
    """An elementwise loop over the result, with every fused producer computed inline."""
    ctx.value_pointers()
    if ctx.step.op.type.size > 1:
        try:
            return _root_loop(ctx, flat=True)
        except NotFlat:
            pass
    return _root_loop(ctx, flat=False)


# reduce --------------------------------------------------------------------------------------


def _reduce_setup(ctx: StepContext):
    ctx.value_pointers()
    op = ctx.step.op
    init_body = ctx.body()
    init = init_body.value(op.operands[1], ())
    compute = c_type(op.type.dtype).compute
    return op, init_body.lines + [f"const {compute} init = {init};"], compute


def _identity(reducer: str, dtype) -> str:
    return {"sum": "0", "prod": "1", "max": lowest(dtype), "min": highest(dtype)}[reducer]


def _simd(reducer: str, variable: str = "acc") -> str | None:
    symbol = {"sum": "+", "prod": "*"}.get(reducer)
    return f"#pragma omp simd reduction({symbol}:{variable})" if symbol else None


def _reduce_rows(ctx: StepContext) -> list[str]:
    op, lines, compute = _reduce_setup(ctx)
    layout = ctx.step.detail
    x_type, dtype, reducer = layout.input, op.type.dtype, op.attrs["op"]
    kept_loops = axis_loops(x_type, positions=layout.kept)
    reduced_loops = axis_loops(x_type, positions=layout.reduced)
    index = axis_index(x_type)
    out_position = linear(tuple(index[p] for p in layout.kept), op.type.extents)
    body = ctx.body()
    x = body.value(op.operands[0], index)
    combine = f"acc = {templates.binary(templates.REDUCERS[reducer], c_type(dtype), 'acc', x)};"
    store = _store(
        dtype, ctx.pointers[op.results[0]], out_position, c_type(dtype).round.format(x="acc")
    )
    large = worth_threads(x_type.size, ctx.step.fused)
    if not kept_loops and large and reduced_loops and reduced_loops[0][1] >= 2 * CHUNKS:
        return lines + _chunked_full_reduction(
            reduced_loops, body.lines + [combine], reducer, dtype, compute, store
        )
    inner = nest(reduced_loops, body.lines + [combine], inner_pragma=_simd(reducer))
    per_output = [f"{compute} acc = init;"] + inner + [store]
    outer = PARALLEL_FOR if kept_loops and large and kept_loops[0][1] > 1 else None
    return lines + nest(kept_loops, per_output, outer)


def _chunked_full_reduction(loops, inner, reducer, dtype, compute, store) -> list[str]:
    """A reduction to one element over threads: fixed chunks of the outermost loop, each with
    its own partial result, combined in chunk order."""
    counter, extent = loops[0]
    bounds = {counter: (f"c * {extent}LL / {CHUNKS}", f"(c + 1) * {extent}LL / {CHUNKS}")}
    chunk = nest(loops, inner, inner_pragma=_simd(reducer), bounds=bounds)
    combine_parts = templates.binary(templates.REDUCERS[reducer], c_type(dtype), "acc", "part[c]")
    return [
        f"{compute} part[{CHUNKS}];",
        PARALLEL_FOR,
        f"for (int64_t c = 0; c < {CHUNKS}; ++c) {{",
        f"  {compute} acc = {_identity(reducer, dtype)};",
        *("  " + line for line in chunk),
        "  part[c] = acc;",
        "}",
        f"{compute} acc = init;",
        f"for (int64_t c = 0; c < {CHUNKS}; ++c) acc = {combine_parts};",
        store,
    ]


def _reduce_columns(ctx: StepContext) -> list[str]:
    op, lines, compute = _reduce_setup(ctx)
    layout = ctx.step.detail
    x_type, dtype, reducer = layout.input, op.type.dtype, op.attrs["op"]
    ctype = c_type(dtype)
    out = ctx.pointers[op.results[0]]
    if layout.needs_accumulator:
        accumulator, load, store = ctx.scratch("float", "accumulator"), "{x}", "{x}"
    else:
        accumulator, load, store = out, ctype.load, ctype.store
    n = op.type.size
    lines += [f"for (int64_t o = 0; o < {n}; ++o) {accumulator}[o] = {store.format(x='init')};"]
    index = axis_index(x_type)
    position = linear(tuple(index[p] for p in layout.kept), op.type.extents)
    body = ctx.body()
    x = body.value(op.operands[0], index)
    current = load.format(x=f"{accumulator}[{position}]")
    combined = templates.binary(templates.REDUCERS[reducer], ctype, current, x)
    update = f"{accumulator}[{position}] = {store.format(x=combined)};"
    lines += nest(axis_loops(x_type), body.lines + [update])
    if layout.needs_accumulator:
        rounded = ctype.round.format(x=f"{accumulator}[o]")
        lines.append(f"for (int64_t o = 0; o < {n}; ++o) {_store(dtype, out, 'o', rounded)}")
    return lines


def emit_reduce(ctx: StepContext) -> list[str]:
    """A reduction in the loop order the plan chose (`accy.lower.reduction`)."""
    return (_reduce_rows if ctx.step.detail.strategy == "rows" else _reduce_columns)(ctx)


# groups of flat steps ------------------------------------------------------------------------


@dataclass(frozen=True)
class Accumulator:
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
            body.lines.append(_store(op.type.dtype, ctx.pointers[op.results[0]], "i", x))
        return
    init_body = ctx.body()
    init = init_body.value(op.operands[1], ())
    name = ctx.unit.fresh("acc")
    compute = c_type(op.type.dtype).compute
    ctx.prologue += init_body.lines + [f"const {compute} {name}_init = {init};"]
    x = body.value(op.operands[0], Flat("i", op.operand_types[0]))
    combined = templates.binary(templates.REDUCERS[op.attrs["op"]], c_type(op.type.dtype), name, x)
    body.lines.append(f"{name} = {combined};")
    accumulators.append(
        Accumulator(
            name, op.attrs["op"], op.type.dtype, f"{name}_init", ctx.pointers[op.results[0]]
        )
    )


def _chunked_loop(size: int, inner: list[str], accumulators: list, parallel: bool) -> list[str]:
    """A flat loop cut into fixed chunks, each with its own partial results; the partials are
    combined in chunk order, so the sum is the same on any number of threads."""
    declare = [f"{c_type(a.dtype).compute} {a.name}_part[{CHUNKS}];" for a in accumulators]
    start = [
        f"{c_type(a.dtype).compute} {a.name} = {_identity(a.reducer, a.dtype)};"
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
        ctype = c_type(a.dtype)
        combined = templates.binary(
            templates.REDUCERS[a.reducer], ctype, a.name, f"{a.name}_part[c]"
        )
        lines += [
            f"{ctype.compute} {a.name} = {a.init};",
            f"for (int64_t c = 0; c < {CHUNKS}; ++c) {a.name} = {combined};",
            _store(a.dtype, a.output, "0", ctype.round.format(x=a.name)),
        ]
    return lines


def emit_group(ctx: StepContext) -> list[str]:
    """Several flat steps over the same elements as one loop (see `accy.lower.grouping`)."""
    ctx.value_pointers()
    first = ctx.step.members[0]
    size = first.op.type.size if first.kind == "loop" else first.op.operand_types[0].size
    body = ctx.body()
    accumulators: list[Accumulator] = []
    for member in ctx.step.members:
        _group_member(ctx, body, member, accumulators)
    parallel = worth_threads(size, ctx.step.fused)
    if accumulators:
        return ctx.prologue + _chunked_loop(size, body.lines, accumulators, parallel)
    return nest([("i", size)], body.lines, PARALLEL_FOR if parallel else None, SIMD)


# scatter_add ---------------------------------------------------------------------------------


def _copy_operand_into(ctx: StepContext, out: str, t: TensorType, store: str) -> list[str]:
    op = ctx.step.op
    for flat in (True, False):
        body = ctx.body()
        index = Flat("i", t) if flat else axis_index(t)
        try:
            x = body.value(op.operands[0], index)
        except NotFlat:
            continue
        loops = [("i", t.size)] if flat else axis_loops(t)
        position = "i" if flat else linear(index, t.extents)
        return nest(loops, body.lines + [f"{out}[{position}] = {store.format(x=x)};"])
    raise AccyError("internal: no loop for the scatter operand")


def emit_scatter(ctx: StepContext) -> list[str]:
    """Copy the operand into the result, then add each update at its (clamped) row.

    bf16 results are summed in a float32 scratch array and rounded once at the end, as the
    reference evaluator (which holds bf16 in float32) does; f16 rounds after every addition,
    as NumPy's float16 `add.at` does.
    """
    ctx.value_pointers()
    op = ctx.step.op
    result, indices, updates = op.type, op.operand_types[1], op.operand_types[2]
    ctype = c_type(result.dtype)
    out = ctx.pointers[op.results[0]]
    if result.dtype == bf16:
        target, load, store, rounded = ctx.scratch("float", "accumulator"), "{x}", "{x}", "{x}"
    else:
        target, load, store, rounded = out, ctype.load, ctype.store, ctype.round
    lines = _copy_operand_into(ctx, target, result, store)
    position = result.position(op.attrs["axis"])
    extent = result.extents[position]
    if extent and updates.size:
        body = ctx.body()
        index = axis_index(updates, "u")
        row = body.value(op.operands[1], index[position : position + indices.rank])
        clamped = body.index_temp(f"ACCY_CPU_CLAMP((int64_t){row}, {extent - 1})")
        update = body.value(op.operands[2], index)
        at = index[:position] + (clamped,) + index[position + indices.rank :]
        element = f"{target}[{linear(at, result.extents)}]"
        total = rounded.format(x=f"{load.format(x=element)} + {update}")
        body.lines.append(f"{element} = {store.format(x=total)};")
        lines += nest(axis_loops(updates, "u"), body.lines)
    if result.dtype == bf16:
        final = _store(result.dtype, out, "i", f"{target}[i]")
        lines += nest([("i", result.size)], [final])
    return lines


# dot_general ---------------------------------------------------------------------------------


def _pack(ctx: StepContext, value: int, t: TensorType, matrix: MatrixOperand, name: str) -> str:
    """Copy an operand BLAS cannot read as it is into scratch laid out batch, rows, columns."""
    pointer = ctx.scratch(c_type(t.dtype).storage, name)
    body = ctx.body()
    index = axis_index(t, "p")
    x = body.value(value, index)
    packed_position = offset_expression(index, matrix.view.strides)
    loops = [(f"p{q}", t.extents[q]) for q in matrix.order if t.extents[q] != 1]
    ctx.prologue += nest(loops, body.lines + [_store(t.dtype, pointer, packed_position, x)])
    return pointer


def _gemm_operand(ctx, value, t, matrix: MatrixOperand, name) -> tuple[str, int, tuple]:
    if matrix.packed:
        return _pack(ctx, value, t, matrix, name), 0, matrix.batch_strides
    view = ctx.plan.view(value)
    return ctx.pointers[view.base], view.offset, matrix.batch_strides


def _gemm_call(op, gemm: Gemm, m: str, n: str, a: str, b: str, c: str) -> str:
    f32_like = op.type.dtype == f32
    function, one, zero = (
        ("accy_sgemm", "1.0f", "0.0f") if f32_like else ("accy_dgemm", "1.0", "0.0")
    )
    flags = [TRANS if x.transposed else NO_TRANS for x in (gemm.lhs, gemm.rhs)]
    return (
        f"{function}({ROW_MAJOR}, {flags[0]}, {flags[1]}, {m}, {n}, {gemm.k}, {one}, "
        f"{a}, {gemm.lhs.leading}, {b}, {gemm.rhs.leading}, {zero}, {c}, {max(gemm.n, 1)});"
    )


def _split_gemm(op, gemm: Gemm, a: str, b: str, c: str) -> list[str]:
    """One GEMM shared by the threads: each computes a band of rows (or of columns)."""
    if gemm.m >= gemm.n:
        a_band = f"{a} + first" if gemm.lhs.transposed else f"{a} + first * {gemm.lhs.leading}"
        call = _gemm_call(
            op, gemm, "last - first", str(gemm.n), a_band, b, f"{c} + first * {gemm.n}"
        )
        extent = gemm.m
    else:
        b_band = f"{b} + first * {gemm.rhs.leading}" if gemm.rhs.transposed else f"{b} + first"
        call = _gemm_call(op, gemm, str(gemm.m), "last - first", a, b_band, f"{c} + first")
        extent = gemm.n
    return [
        "#pragma omp parallel",
        "{",
        "  const int64_t part = omp_get_thread_num(), parts = omp_get_num_threads();",
        f"  const int64_t first = {extent} * part / parts, last = {extent} * (part + 1) / parts;",
        f"  if (last > first) {call}",
        "}",
    ]


def _emit_gemm(ctx: StepContext, gemm: Gemm) -> list[str]:
    """BLAS GEMMs, run with BLAS's own threads off: large work is shared out by OpenMP, one
    thread pool that waits passively, instead of two pools that fight over the cores."""
    op = ctx.step.op
    lhs_type, rhs_type = op.operand_types
    a, a_offset, a_batch = _gemm_operand(ctx, op.operands[0], lhs_type, gemm.lhs, "lhs")
    b, b_offset, b_batch = _gemm_operand(ctx, op.operands[1], rhs_type, gemm.rhs, "rhs")
    out = f"({c_type(op.type.dtype).storage} *){ctx.pointers[op.results[0]]}"
    count = math.prod(gemm.batch_extents)
    if gemm.m == 0 or gemm.n == 0 or count == 0:
        return []
    if gemm.k == 0:
        return [f"memset({out}, 0, {op.type.nbytes});"]
    large = count * gemm.m * gemm.n * gemm.k >= PARALLEL_GEMM_MNK
    if not gemm.batch_extents:
        a, b = f"{a} + {a_offset}", f"{b} + {b_offset}"
        calls = (
            _split_gemm(op, gemm, a, b, out)
            if large
            else [_gemm_call(op, gemm, str(gemm.m), str(gemm.n), a, b, out)]
        )
    else:
        batch = tuple(
            f"(batch / {math.prod(gemm.batch_extents[k + 1 :])}) % {n}"
            for k, n in enumerate(gemm.batch_extents)
        )
        a_at = offset_expression(batch, a_batch, a_offset)
        b_at = offset_expression(batch, b_batch, b_offset)
        call = _gemm_call(
            op,
            gemm,
            str(gemm.m),
            str(gemm.n),
            f"{a} + {a_at}",
            f"{b} + {b_at}",
            f"{out} + batch * {gemm.m * gemm.n}",
        )
        calls = nest([("batch", count)], [call], PARALLEL_FOR if large else None)
    return [
        *ctx.prologue,
        "const int threads = accy_blas_serial();",
        *calls,
        "accy_blas_restore(threads);",
    ]


def _emit_dot_loops(ctx: StepContext) -> list[str]:
    """dot_general as plain loops: for dtypes BLAS lacks, or where no BLAS was found."""
    op = ctx.step.op
    lc, rc, lb, rb = dimensions(op.attrs)
    lhs_type, rhs_type = op.operand_types
    lf = free_dimensions(lhs_type.rank, lc, lb)
    rf = free_dimensions(rhs_type.rank, rc, rb)
    result_index = axis_index(op.type, "r")
    contract = [f"k{q}" if lhs_type.extents[p] != 1 else "0" for q, p in enumerate(lc)]
    lhs_index = [""] * lhs_type.rank
    rhs_index = [""] * rhs_type.rank
    for q, (l, r) in enumerate(zip(lb, rb, strict=True)):
        lhs_index[l] = rhs_index[r] = result_index[q]
    for q, p in enumerate(lf):
        lhs_index[p] = result_index[len(lb) + q]
    for q, p in enumerate(rf):
        rhs_index[p] = result_index[len(lb) + len(lf) + q]
    for q, (l, r) in enumerate(zip(lc, rc, strict=True)):
        lhs_index[l] = rhs_index[r] = contract[q]
    body = ctx.body()
    a = body.value(op.operands[0], tuple(lhs_index))
    b = body.value(op.operands[1], tuple(rhs_index))
    ctype = c_type(op.type.dtype)
    contract_loops = [
        (f"k{q}", lhs_type.extents[p]) for q, p in enumerate(lc) if lhs_type.extents[p] != 1
    ]
    inner = nest(contract_loops, body.lines + [f"acc = acc + {a} * {b};"])
    store = _store(
        op.type.dtype,
        ctx.pointers[op.results[0]],
        linear(result_index, op.type.extents),
        ctype.round.format(x="acc"),
    )
    return nest(axis_loops(op.type, "r"), [f"{ctype.compute} acc = 0;"] + inner + [store])


def _fits_blas_integers(gemm: Gemm, bits: int) -> bool:
    sizes = (gemm.m, gemm.n, gemm.k, gemm.lhs.leading, gemm.rhs.leading)
    return max(sizes) < 2 ** (bits - 1)


def emit_dot(ctx: StepContext) -> list[str]:
    """A contraction: BLAS for f32 and f64 where a BLAS was found (and its integers are wide
    enough for the sizes), plain loops otherwise."""
    ctx.value_pointers()
    blas, gemm = ctx.unit.blas, ctx.step.detail
    if (
        blas is not None
        and ctx.step.op.type.dtype in BLAS_DTYPES
        and _fits_blas_integers(gemm, blas.integer_bits)
    ):
        return _emit_gemm(ctx, gemm)
    return _emit_dot_loops(ctx)


# custom_call, copy -----------------------------------------------------------------------------


def emit_custom_call(ctx: StepContext) -> list[str]:
    """A call to the kernel the registry links to the target, its `dst` bound to the result."""
    ctx.value_pointers()
    op = ctx.step.op
    kernel = ctx.unit.kernel_for(op)
    operands = iter(op.operands)
    arguments = []
    for name, _ in kernel.parameters:
        if name == "dst":
            arguments.append(f"(void *){ctx.pointers[op.results[0]]}")
        else:
            view = ctx.plan.view(next(operands))
            arguments.append(f"(void *)({ctx.pointers[view.base]} + {view.offset})")
    return [f"{kernel.symbol}({', '.join(arguments)});"]


def emit_copy(ctx: StepContext) -> list[str]:
    """Copy a stored value into an output (an input returned, or a value returned twice)."""
    (value,) = ctx.step.reads
    t = ctx.plan.program.type_of(value)
    source = ctx.parameter("void", "source", ctx.slot_pointer(value), False)
    target = ctx.parameter("void", "target", ctx.output_pointer(ctx.step.output), True)
    return [f"memcpy({target}, {source}, {t.nbytes});"] if t.nbytes else []


# scan ----------------------------------------------------------------------------------------


def _address(ctx: StepContext, value: int) -> str:
    view = ctx.plan.view(value)
    pointer = ctx.pointers[view.base]
    return f"(char *)({pointer} + {view.offset})" if view.offset else f"(char *){pointer}"


def _slice_copy(ctx: StepContext, x: int, t: TensorType, axis: str, target: str) -> list[str]:
    """Copy step `s` of `x` along `axis` into the contiguous scratch `target`."""
    storage = c_type(t.dtype).storage
    position = t.position(axis)
    sliced = t.without([axis])
    index = axis_index(sliced, "q")
    full = index[:position] + ("s",) + index[position:]
    view = ctx.plan.view(x)
    source = f"(({storage} *){ctx.pointers[view.base]})"
    element = f"{source}[{offset_expression(full, view.strides, view.offset)}]"
    copy = f"(({storage} *){target})[{linear(index, sliced.extents)}] = {element};"
    return nest(axis_loops(sliced, "q"), [copy])


def emit_scan(ctx: StepContext) -> list[str]:
    """A C loop over the scanned axis that calls the body's function once per step.

    Carries alternate between the result buffer and a scratch buffer, so that a step never
    writes what it reads; x slices are read in place when the axis is outermost (else copied
    into scratch), and y slices are written in place (the axis is outermost in every y).
    """
    ctx.value_pointers()
    op, attrs = ctx.step.op, ctx.step.op.attrs
    length, axis = attrs["length"], attrs["axis"]
    num_consts, num_carry = attrs["num_consts"], attrs["num_carry"]
    body_function = ctx.unit.write_function(ctx.step.body)
    body_workspace = ctx.scratch("char", "body")
    inits = op.operands[num_consts : num_consts + num_carry]
    carries = list(zip(inits, op.results[:num_carry], strict=True))
    lines, current, following = [], [], []
    for i, (init, result) in enumerate(carries):
        nbytes = ctx.plan.program.type_of(result).nbytes
        partner = ctx.scratch("char", f"carry{i}")
        lines.append(f"memcpy({ctx.pointers[result]}, {_address(ctx, init)}, {nbytes});")
        lines.append(f"char *current{i} = (char *){ctx.pointers[result]}, *next{i} = {partner};")
        current.append(f"current{i}")
        following.append(f"next{i}")
    step_lines = []
    slices = []
    for i, (x, t) in enumerate(
        zip(
            op.operands[num_consts + num_carry :],
            op.operand_types[num_consts + num_carry :],
            strict=True,
        )
    ):
        slice_bytes = t.nbytes // max(length, 1)
        if t.position(axis) == 0:
            slices.append(f"{_address(ctx, x)} + s * {slice_bytes}")
        else:
            target = ctx.scratch("char", f"x{i}")
            step_lines += _slice_copy(ctx, x, t, axis, target)
            slices.append(target)
    ys = [
        f"(char *){ctx.pointers[y]} + s * {ctx.plan.program.type_of(y).nbytes // max(length, 1)}"
        for y in op.results[num_carry:]
    ]
    consts = [_address(ctx, c) for c in op.operands[:num_consts]]
    arguments = consts + current + slices + following + ys
    step_lines.append(f"void *args[] = {{{', '.join(arguments) or '0'}}};")
    step_lines.append(f"{body_function}(args, {body_workspace});")
    for i in range(num_carry):
        step_lines.append(f"{{ char *swap = current{i}; current{i} = next{i}; next{i} = swap; }}")
    counter = f"{length - 1} - it" if attrs["reverse"] else "it"
    lines += nest([("it", length)], [f"const int64_t s = {counter};"] + step_lines)
    for i, (_, result) in enumerate(carries):
        nbytes = ctx.plan.program.type_of(result).nbytes
        pointer = ctx.pointers[result]
        lines.append(
            f"if (current{i} != (char *){pointer}) memcpy({pointer}, current{i}, {nbytes});"
        )
    return lines


STEP_EMITTERS: dict[str, Callable[[StepContext], list[str]]] = {
    "loop": emit_loop,
    "reduce": emit_reduce,
    "scatter": emit_scatter,
    "dot": emit_dot,
    "custom_call": emit_custom_call,
    "copy": emit_copy,
    "scan": emit_scan,
    "group": emit_group,
}
