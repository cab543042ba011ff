"""CUDA for each kind of plan step, looked up in `STEP_EMITTERS`.

Elementwise work is a grid-stride loop whose counter is the element's flat position; values are
computed by the CPU backend's expression code (`Body`), so fused producers, views, gathers and
padding mean the same on both backends. Reductions go through `reductions`, contractions through
cuBLAS (`contraction`), scans through `scan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...codegen.c.expressions import EMITTERS, Body, Flat, NotFlat, linear
from ...codegen.c.types import c_type
from ...core.types import bf16, bool_, f16, f32, f64, i32, i64, u8
from ...errors import AccyError
from ...lower.plan import Plan, Step
from .context import StepCode, StepContext, launches, nothing
from .kernels import Module, axis_names, blocks_for, compute_bytes, decompose, grid_stride
from .reductions import Accumulator, Cut, Finish, choose_cut, reduction_lines
from .schedule import SCRATCH, Address, External, Launch, Level, Schedule


def indent(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]


def store(dtype, pointer: str, position: str, x: str) -> str:
    return f"{pointer}[{position}] = {c_type(dtype).store.format(x=x)};"


def rounded(dtype, x: str) -> str:
    return c_type(dtype).round.format(x=x)


def elementwise(ctx: StepContext, size: int, make) -> str:
    """A grid-stride kernel over `size` elements; `make(body, flat)` returns the statements
    for element `i`, flat (one counter) when every access allows it, else per axis."""
    for flat in (True, False) if size > 1 else (False,):
        pointers = ctx.pointers()
        body = ctx.body(pointers)
        try:
            statements = make(body, flat)
        except NotFlat:
            continue
        lines = [grid_stride("i", size), *indent(statements), "}"]
        return ctx.kernel(pointers, lines)
    raise AccyError("internal: no loop for an elementwise step")


def element_index(body: Body, t, flat: bool, counter: str = "i", prefix: str = "i"):
    """(index, statements) of element `counter` of type `t`: flat, or one name per axis."""
    if flat:
        return Flat(counter, t), []
    names = axis_names(t, prefix)
    return names, decompose(counter, t.extents, names)


# loop ----------------------------------------------------------------------------------------


def emit_loop(ctx: StepContext) -> StepCode:
    """An elementwise kernel over the result, every fused producer computed inline."""
    op = ctx.step.op
    t = op.type
    if t.size == 0:
        return nothing

    def make(body: Body, flat: bool) -> list[str]:
        index, head = element_index(body, t, flat)
        x = EMITTERS[op.kind](body, op, index)
        pointer = body.pointers[op.results[0]]
        return head + body.lines + [store(t.dtype, pointer, "i", x)]

    return launches((elementwise(ctx, t.size, make), blocks_for(t.size)))


# reduce --------------------------------------------------------------------------------------


def _initial(ctx: StepContext, pointers, op) -> tuple[list[str], str]:
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
        lines, x = _initial(ctx, pointers, op)
        return lines, [x]

    for flat in (True, False) if outputs == 1 else (False,):
        element, kept = _reduce_element(ctx, flat)
        try:
            return reduction(ctx, cut, element, kept, accumulators, initial, list(op.results))
        except NotFlat:
            continue
    raise AccyError("internal: no kernel for a reduction")


# groups of flat steps ------------------------------------------------------------------------


def _group_element(ctx: StepContext):
    def element(body: Body, r: str):
        values = []
        for member in ctx.step.members:
            op = member.op
            if member.kind == "loop":
                index = Flat(r, op.type)
                x = EMITTERS[op.kind](body, op, index)
                body.seed(op.results[0], index, x)
                if op.results[0] in ctx.step.writes:
                    body.lines.append(store(op.type.dtype, body.pointers[op.results[0]], r, x))
            else:
                values.append(body.value(op.operands[0], Flat(r, op.operand_types[0])))
        return body.lines, values

    return element


def emit_group(ctx: StepContext) -> StepCode:
    """Several flat steps over the same elements as one loop (see `accy.lower.grouping`)."""
    members = ctx.step.members
    first = members[0]
    size = first.op.type.size if first.kind == "loop" else first.op.operand_types[0].size
    reductions = [m.op for m in members if m.kind == "reduce"]
    element = _group_element(ctx)
    if not reductions:

        def make(body: Body, flat: bool) -> list[str]:
            return element(body, "i")[0]

        return launches((elementwise(ctx, size, make), blocks_for(size)))
    accumulators = [
        Accumulator(f"acc{j}", op.attrs["op"], op.type.dtype) for j, op in enumerate(reductions)
    ]

    def initial(pointers):
        lines, values = [], []
        for op in reductions:
            head, x = _initial(ctx, pointers, op)
            lines += head
            values.append(x)
        return lines, values

    outputs = [op.results[0] for op in reductions]
    cut = choose_cut(1, size, True)
    return reduction(ctx, cut, element, lambda o: [], accumulators, initial, outputs)


# scatter_add ---------------------------------------------------------------------------------

ATOMIC_ADD = {
    f32: "atomicAdd(&{at}, {x});",
    f64: "atomicAdd(&{at}, {x});",
    i32: "atomicAdd((int *)&{at}, (int){x});",
    i64: "atomicAdd((unsigned long long *)&{at}, (unsigned long long){x});",
    u8: "accy_atomic_add_u8(&{at}, (uint8_t){x});",
    bool_: "accy_atomic_or_u8(&{at}, (uint8_t)({x} != 0));",
}
ORDERED = (f16, bf16)  # rounded after every addition: added in index order, as NumPy does


def _scatter_target(ctx: StepContext, pointers) -> tuple[str, list[str], str, str]:
    """(pointer name, declarations, load template, store template) of what updates add into:
    the result, or for bf16 a float32 accumulator that is rounded once at the end."""
    op = ctx.step.op
    if op.type.dtype != bf16:
        ctype = c_type(op.type.dtype)
        return pointers[op.results[0]], [], ctype.load, ctype.store
    offset = ctx.workspace_scratch("accumulator")
    declaration = f"float *__restrict__ sum = (float *)(ws + {offset});"
    return "sum", [declaration], "{x}", "{x}"


def _scatter_copy(ctx: StepContext) -> str:
    """The kernel that copies the operand into the scatter's target."""
    op = ctx.step.op
    t = op.type

    def make(body: Body, flat: bool) -> list[str]:
        target, declarations, _, store_template = _scatter_target(ctx, body.pointers)
        index, head = element_index(body, t, flat)
        x = body.value(op.operands[0], index)
        return declarations + head + body.lines + [f"{target}[i] = {store_template.format(x=x)};"]

    return elementwise(ctx, t.size, make)


def _scatter_row(ctx: StepContext, body: Body, index: tuple[str, ...]) -> str:
    """The flat position in the result where the update at `index` goes (its row clamped)."""
    op = ctx.step.op
    result, indices = op.type, op.operand_types[1]
    position = result.position(op.attrs["axis"])
    extent = result.extents[position]
    row = body.value(op.operands[1], index[position : position + indices.rank])
    clamped = body.index_temp(f"ACCY_CPU_CLAMP((int64_t){row}, {extent - 1})")
    at = index[:position] + (clamped,) + index[position + indices.rank :]
    return linear(at, result.extents)


def _scatter_atomic(ctx: StepContext) -> tuple[str, int]:
    """One thread per update, added with an atomic operation (integers add exactly in any
    order; f32 and f64 sums may differ in the last bits from run to run)."""
    op = ctx.step.op
    updates = op.operand_types[2]
    pointers = ctx.pointers()
    body = ctx.body(pointers)
    names = axis_names(updates, "u")
    head = decompose("i", updates.extents, names)
    at = _scatter_row(ctx, body, names)
    update = body.value(op.operands[2], names)
    target = pointers[op.results[0]]
    atomic = ATOMIC_ADD[op.type.dtype].format(at=f"{target}[{at}]", x=update)
    lines = [grid_stride("i", updates.size), *indent(head + body.lines + [atomic]), "}"]
    return ctx.kernel(pointers, lines, "(add)"), blocks_for(updates.size)


def _scatter_ordered(ctx: StepContext) -> tuple[str, int]:
    """One thread per column (the non-index axes of the updates), walking the indices in
    order: 16-bit results round after every addition, so the order must be NumPy's."""
    op = ctx.step.op
    result, indices, updates = op.type, op.operand_types[1], op.operand_types[2]
    position = result.position(op.attrs["axis"])
    index_positions = range(position, position + indices.rank)
    columns = [p for p in range(updates.rank) if p not in index_positions]
    pointers = ctx.pointers()
    body = ctx.body(pointers)
    target, declarations, load, store_template = _scatter_target(ctx, pointers)
    names = axis_names(updates, "u")
    column_extents = tuple(updates.extents[p] for p in columns)
    head = decompose("c", column_extents, tuple(names[p] for p in columns))
    inner = decompose("t", indices.extents, tuple(names[p] for p in index_positions))
    at = _scatter_row(ctx, body, names)
    update = body.value(op.operands[2], names)
    element = f"{target}[{at}]"
    total = f"{load.format(x=element)} + {update}"
    if op.type.dtype != bf16:
        total = rounded(op.type.dtype, total)
    add = f"{element} = {store_template.format(x=total)};"
    count = max(1, updates.size // max(indices.size, 1))
    loop = [f"for (int64_t t = 0; t < {indices.size}LL; ++t) {{", *indent(inner + body.lines)]
    lines = declarations + [grid_stride("c", count), *indent(head + loop + ["  " + add, "}"]), "}"]
    return ctx.kernel(pointers, lines, "(ordered add)"), blocks_for(count)


def _scatter_round(ctx: StepContext) -> tuple[str, int]:
    """bf16: the float32 sums rounded once into the result."""
    op = ctx.step.op
    pointers = ctx.pointers()
    offset = ctx.workspace_scratch("accumulator")
    out = pointers[op.results[0]]
    lines = [
        f"const float *__restrict__ sum = (const float *)(ws + {offset});",
        grid_stride("i", op.type.size),
        "  " + store(bf16, out, "i", "sum[i]"),
        "}",
    ]
    return ctx.kernel(pointers, lines, "(round)"), blocks_for(op.type.size)


def emit_scatter(ctx: StepContext) -> StepCode:
    """Copy the operand into the result, then add each update at its (clamped) row."""
    op = ctx.step.op
    result, updates = op.type, op.operand_types[2]
    if result.size == 0:
        return nothing
    kernels = [(_scatter_copy(ctx), blocks_for(result.size))]
    if updates.size:
        ordered = result.dtype in ORDERED
        kernels.append(_scatter_ordered(ctx) if ordered else _scatter_atomic(ctx))
    if result.dtype == bf16:
        kernels.append(_scatter_round(ctx))
    return launches(*kernels)


# copies, custom calls ------------------------------------------------------------------------


def copy_kernel(ctx: StepContext, source: str, target: str, storage: str, count: int) -> str:
    """A kernel copying `count` elements of `storage` from C address `source` to `target`."""
    lines = [
        f"const {storage} *__restrict__ source = (const {storage} *)({source});",
        f"{storage} *__restrict__ target = ({storage} *)({target});",
        grid_stride("i", count),
        "  target[i] = source[i];",
        "}",
    ]
    return ctx.module.kernel(lines, f"step {ctx.index}: copy")


def emit_copy(ctx: StepContext) -> StepCode:
    """An output that is an input or another output: a copy."""
    (value,) = ctx.step.reads
    t = ctx.plan.program.type_of(value)
    if t.size == 0:
        return nothing
    output = len(ctx.plan.program.parameters) + ctx.step.output
    source = ctx.slot_expression(value)
    kernel = copy_kernel(ctx, source, f"(char *)io[{output}]", ctx.storage(value), t.size)
    return launches((kernel, blocks_for(t.size)))


@dataclass
class Staging:
    """Operands and a result that live in the invocation's buffers, whose addresses move from
    call to call, routed through scratch so that a library call or a custom kernel captured in
    the graph sees fixed addresses: `copies_in` run before it, `copies_out` after."""

    operands: dict[int, int] = field(default_factory=dict)  # value -> its copy's scratch offset
    result: int | None = None  # the result's byte offset in scratch, if it moves
    copies_in: list[tuple[str, int]] = field(default_factory=list)
    copies_out: list[tuple[str, int]] = field(default_factory=list)

    def address(self, ctx: StepContext, level: Level, value: int) -> Address:
        """Where the call reads operand `value` when the plan runs at `level`."""
        if value in self.operands:
            return Address(SCRATCH, self.operands[value])
        return ctx.view_address(level, value)

    def result_address(self, ctx: StepContext, level: Level) -> Address:
        """Where the call writes the step's result when the plan runs at `level`."""
        if self.result is not None:
            return Address(SCRATCH, self.result)
        return ctx.slot_address(level, ctx.step.op.results[0])


def _moves(ctx: StepContext, value: int) -> bool:
    """Whether stored `value` lives in the invocation's buffers (its address moves)."""
    return ctx.plan.slots[value].storage != "workspace"


def _span(ctx: StepContext, value: int) -> int:
    """Elements from the first to the last element of `value`'s view, inclusive."""
    t = ctx.plan.program.type_of(value)
    strides = ctx.view(value).strides
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.extents, strides, strict=True))


def stage_moving_buffers(ctx: StepContext, operands) -> Staging:
    """Copy kernels that route `operands` (values read as whole buffers) and the step's result
    through scratch, those of them whose addresses move; an operand's view keeps its layout."""
    staging = Staging()
    for value in operands:
        if value in staging.operands or not _moves(ctx, ctx.view(value).base):
            continue
        span = _span(ctx, value)
        offset = staging.operands[value] = ctx.scratch(span * ctx.itemsize(value))
        source, storage = ctx.view_expression(value), ctx.storage(value)
        kernel = copy_kernel(ctx, source, f"scratch + {offset}", storage, span)
        staging.copies_in.append((kernel, blocks_for(span)))
    op = ctx.step.op
    result = op.results[0]
    if _moves(ctx, result):
        staging.result = ctx.scratch(op.type.nbytes)
        source, target = f"scratch + {staging.result}", ctx.slot_expression(result)
        kernel = copy_kernel(ctx, source, target, ctx.storage(result), op.type.size)
        staging.copies_out.append((kernel, blocks_for(op.type.size)))
    return staging


def _kernel_call(ctx: StepContext):
    """The registered CUDA kernel of a custom_call, checked against the call's types."""
    op = ctx.step.op
    target, version = op.attrs["target"], op.attrs["version"]
    registry = ctx.module.registry
    call = None if registry is None else registry.lookup(target, version)
    if call is None:
        raise AccyError(
            f"custom_call {target!r} version {version} has no kernel to link to: pass a "
            f"registry that has it as FragmentCompilerOptions(kernel_call_registry=...)"
        )
    call.check_call(op.operand_types, op.type)
    if call.ptx is None or call.grid is None:
        raise AccyError(
            f"custom_call {target!r} version {version}: kernel {call.symbol} was built as "
            f"{call.format!r}; the CUDA backend needs format='cuda_ptx' (PTX and a schedule)"
        )
    ctx.module.externals[call.kernel_name] = call
    return call


def emit_custom_call(ctx: StepContext) -> StepCode:
    """The kernel the registry links to the target, launched on its own grid. Its pointers are
    fixed in the graph, so operands and a result that live in the invocation's buffers pass
    through scratch (copied in before, out after)."""
    op = ctx.step.op
    call = _kernel_call(ctx)
    staging = stage_moving_buffers(ctx, op.operands)

    def schedule_call(level: Level, schedule: Schedule) -> None:
        launches(*staging.copies_in)(level, schedule)
        operands = iter(op.operands)
        arguments = [
            staging.result_address(ctx, level)
            if name == "dst"
            else staging.address(ctx, level, next(operands))
            for name, _ in call.parameters
        ]
        schedule.add(External(call.kernel_name, call.grid, call.block, tuple(arguments)))
        launches(*staging.copies_out)(level, schedule)

    return schedule_call


def _emit_dot(ctx: StepContext) -> StepCode:
    from .contraction import emit_dot

    return emit_dot(ctx)


def _emit_scan(ctx: StepContext) -> StepCode:
    from .scan import emit_scan

    return emit_scan(ctx)


STEP_EMITTERS = {
    "loop": emit_loop,
    "reduce": emit_reduce,
    "group": emit_group,
    "scatter": emit_scatter,
    "dot": _emit_dot,
    "custom_call": emit_custom_call,
    "copy": emit_copy,
    "scan": _emit_scan,
}


def emit_plan(module: Module, plan: Plan) -> StepCode:
    """The kernels of every step of `plan` (written once per plan), and the code that
    schedules them in order."""
    if id(plan) not in module.plan_code:
        codes = [
            STEP_EMITTERS[step.kind](StepContext(module, plan, index, step))
            for index, step in enumerate(plan.steps)
        ]

        def schedule_plan(level: Level, schedule: Schedule) -> None:
            for code in codes:
                code(level, schedule)

        module.plan_code[id(plan)] = (plan, schedule_plan)
    return module.plan_code[id(plan)][1]


__all__ = ["STEP_EMITTERS", "Launch", "Step", "emit_plan"]
