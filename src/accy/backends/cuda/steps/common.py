"""What several CUDA step emitters share: elementwise kernels, stores, copies, staging.

Imports no step module, so that every step module may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ....codegen.c.dialect import CUDA
from ....codegen.c.expressions import Body, Flat, Index, NotFlat
from ....core.types import TensorType
from ....errors import AccyError
from ....lower.buffers import ALIGNMENT
from ....lower.plan import Plan
from ..context import StepContext, level_address
from ..kernels import Kernel, LevelPointer, axis_names, blocks_for, decompose, grid_stride, indent
from ..schedule import BARRIER, SCRATCH, WORKSPACE, Access, Address, Level, Range
from ..vectors import (
    MAX_VECTOR_LINES,
    MIN_VECTOR_ELEMENTS,
    VECTOR_BYTES,
    LaneBody,
    lane_divisor,
    lane_width,
)


def store(dtype, pointer: str, position: str, x: str) -> str:
    return f"{pointer}[{position}] = {CUDA.c_type(dtype).store.format(x=x)};"


def rounded(dtype, x: str) -> str:
    return CUDA.c_type(dtype).round.format(x=x)


def elementwise(ctx: StepContext, size: int, make) -> Kernel:
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


def store_at(body: Body, dtype, pointer: str, position: str, x: str) -> str:
    """The statement storing `x` at flat `position` of `pointer` (into a lane's register array
    in a `LaneBody`, which writes it out in one vector store)."""
    if isinstance(body, LaneBody):
        return body.store(dtype, pointer, position, x)
    return store(dtype, pointer, position, x)


def step_lane_width(ctx: StepContext) -> int:
    """The step's lanes per thread (`vectors.lane_width`): from the bytes per element of every
    buffer it reads or writes; its streams are those of at least half the largest buffer's
    elements (smaller ones, a row's statistics or a scalar, are loaded once per thread, not
    once per lane)."""
    values = (*ctx.step.writes, *ctx.step.reads)
    return lane_width([ctx.itemsize(v) for v in values], step_streams(ctx))


def step_streams(ctx: StepContext) -> list[int]:
    """The itemsizes of the step's streams: the buffers it reads or writes of at least half
    the largest one's elements."""
    values = (*ctx.step.writes, *ctx.step.reads)
    sizes = [ctx.plan.program.type_of(v).size for v in values]
    largest = max(sizes, default=0)
    return [ctx.itemsize(v) for v, n in zip(values, sizes, strict=True) if 2 * n >= largest]


def innermost(extents) -> int | None:
    """The position of the last axis of more than one element (None: a single element)."""
    significant = [p for p, n in enumerate(extents) if n != 1]
    return significant[-1] if significant else None


def lane_indices(body: LaneBody, t: TensorType, flat: bool, counter: str):
    """(head statements, index of each lane, flat position of each lane) for `body.width`
    lanes starting at element `counter` of `t` (a multiple of the width, which divides the
    innermost extent when not flat)."""
    positions = [body.lane(counter, k) for k in range(body.width)]
    if flat:
        return [], [Flat(name, t) for name in positions], positions
    names = axis_names(t, counter)
    head = decompose(counter, t.extents, names)
    p = innermost(t.extents)
    indices = [names[:p] + (body.lane(names[p], k),) + names[p + 1 :] for k in range(body.width)]
    return head, indices, positions


Make = Callable[[Body, Index, str], None]  # (body, index, flat position) -> appends statements


def elementwise_kernel(
    ctx: StepContext, t: TensorType, make: Make, what: str = "", prologue: Sequence[str] = ()
) -> tuple[Kernel, int]:
    """A grid-stride kernel over the elements of `t` and its grid; `make(body, index,
    position)` appends to `body.lines` the statements for one element (storing through
    `store_at`). Several adjacent elements per thread with vector loads and stores where the
    accesses allow it (`accy.backends.cuda.vectors`), the scalar loop for the rest, for
    misaligned buffers and for every other loop. `prologue` (declarations the statements use)
    comes first; `what` says what the kernel is in its comment.
    """
    size = t.size
    for flat in (True, False) if size > 1 else (False,):
        pointers = ctx.pointers()
        try:
            scalar = _scalar_statements(ctx, pointers, t, flat, make)
            vector = _vector_loop(ctx, pointers, t, flat, make, len(scalar))
        except NotFlat:
            continue
        if vector is None:
            lines = [*prologue, grid_stride("i", size), *indent(scalar), "}"]
            return ctx.kernel(pointers, lines, what), blocks_for(size)
        lines, width = vector
        # The scalar loop takes what the vectors leave: a tail, or everything when misaligned.
        lines = [*prologue, *lines, grid_stride("i", size, first="vector_end"), *indent(scalar)]
        return ctx.kernel(pointers, [*lines, "}"], what), blocks_for(size // width)
    raise AccyError("internal: no loop for an elementwise step")


def _scalar_statements(ctx, pointers, t: TensorType, flat: bool, make: Make) -> list[str]:
    body = ctx.body(pointers)
    index, head = element_index(body, t, flat)
    make(body, index, "i")
    return head + body.lines


def _vector_loop(ctx, pointers, t: TensorType, flat: bool, make: Make, scalar_lines: int):
    """(statements, lanes) of the vector loop over the first whole vectors of `t`, or None
    where no access would be a vector."""
    width = step_lane_width(ctx)
    if not flat:
        p = innermost(t.extents)
        width = 1 if p is None else lane_divisor(width, t.extents[p])
    while width > 1 and width * scalar_lines > MAX_VECTOR_LINES:
        width //= 2
    if width == 1 or t.size < MIN_VECTOR_ELEMENTS:
        return None
    body = LaneBody(ctx.module, ctx.plan, pointers, width)
    head, indices, positions = lane_indices(body, t, flat, "i")
    for index, position in zip(indices, positions, strict=True):
        make(body, index, position)
    if not body.vectorized:
        return None
    vectors = t.size // width
    lines = [
        f"const bool vectorized = {body.aligned_condition()};",
        f"const int64_t vector_end = vectorized ? {vectors * width}LL : 0LL;",
        grid_stride("q", f"vector_end / {width}"),
        f"  const int64_t i = q * {width};",
        *indent(body.pruned(head + body.lines + body.stores())),
        "}",
    ]
    return lines, width


def element_index(body: Body, t, flat: bool, counter: str = "i", prefix: str = "i"):
    """(index, statements) of element `counter` of type `t`: flat, or one name per axis."""
    if flat:
        return Flat(counter, t), []
    names = axis_names(t, prefix)
    return names, decompose(counter, t.extents, names)


STORAGE_BYTES = {"float": 4, "double": 8, "uint16_t": 2, "accy_half": 2, "uint8_t": 1}
STORAGE_BYTES |= {"int32_t": 4, "int64_t": 8}


def copy_kernel(ctx: StepContext, source: str, target: str, storage: str, count: int) -> Kernel:
    """A kernel copying `count` elements of `storage` from C address `source` to `target`,
    16 bytes at a time where both addresses allow it.

    The grid of `blocks_for(count)` that callers launch it on is enough for either loop."""
    return ctx.declare_kernel(copy_lines(source, target, storage, count), f"step {ctx.index}: copy")


def copy_lines(source: str, target: str, storage: str, count: int) -> list[str]:
    """The statements of `copy_kernel`."""
    per = VECTOR_BYTES // STORAGE_BYTES[storage]
    vector = f"accy_vector<{storage}, {per}>"
    return [
        f"const {storage} *__restrict__ source = (const {storage} *)({source});",
        f"{storage} *__restrict__ target = ({storage} *)({target});",
        "const bool vectorized = (((size_t)source | (size_t)target) & 15) == 0;",
        f"const int64_t vector_end = vectorized ? {count // per * per}LL : 0LL;",
        grid_stride("q", f"vector_end / {per}"),
        f"  *({vector} *)(target + q * {per}) = *(const {vector} *)(source + q * {per});",
        "}",
        grid_stride("i", count, first="vector_end"),
        "  target[i] = source[i];",
        "}",
    ]


@dataclass
class Staging:
    """Operands and a result that may live in the invocation's buffers, whose addresses move
    from call to call, routed through scratch so that a library call or a custom kernel
    captured in the graph sees fixed addresses: `copies_in` run before it, `copies_out` after.

    Whether a value moves is known per level: a scan's body is staged for every iteration,
    but an unrolled iteration's slice of a stacked buffer in the workspace (a layer's weights
    in bf16, its saved activations) has a fixed address, which the call then reads or writes
    in place. Only a value whose address at the level is fixed and aligned as scratch is
    (`ALIGNMENT`; a smaller value, as its elements) skips its copy."""

    operands: dict[int, int] = field(default_factory=dict)  # value -> its copy's scratch offset
    result: int | None = None  # the result's byte offset in scratch, if it may move
    copies_in: list[tuple[int, Kernel, int]] = field(default_factory=list)  # (value, ...)
    copies_out: list[tuple[Kernel, int]] = field(default_factory=list)

    def address(self, ctx: StepContext, level: Level, value: int) -> Address:
        """Where the call reads operand `value` when the plan runs at `level`."""
        if value in self.operands and _moving(ctx, level, value):
            return Address(SCRATCH, self.operands[value])
        return ctx.view_address(level, value)

    def result_address(self, ctx: StepContext, level: Level) -> Address:
        """Where the call writes the step's result when the plan runs at `level`: in place
        only where no operand shares its bytes there (an in-place scan's output slice is its
        input's), as the call reads its operands while it writes."""
        result = stored_result(ctx)
        if self.result is not None and _moving(ctx, level, result, whole=True):
            return Address(SCRATCH, self.result)
        return ctx.slot_address(level, result)

    def copies_before(self, ctx: StepContext, level: Level) -> list[tuple[Kernel, int]]:
        """The copies into scratch that the call needs at `level`."""
        return [
            (kernel, grid) for value, kernel, grid in self.copies_in if _moving(ctx, level, value)
        ]

    def copies_after(self, ctx: StepContext, level: Level) -> list[tuple[Kernel, int]]:
        """The copies out of scratch that the call needs at `level`."""
        if self.copies_out and self.result_address(ctx, level).source == SCRATCH:
            return self.copies_out
        return []


def _moving(ctx: StepContext, level: Level, value: int, whole: bool = False) -> bool:
    """Whether the call must reach `value` (its view; `whole`: its slot, a result) at `level`
    through a copy in scratch: its address there moves from call to call, is not known on the
    host, is less aligned than scratch, or (a result) shares bytes with an operand."""
    at = _host_address(ctx, level, value, whole)
    if at is None or not at.fixed or at.offset % _alignment(ctx, value, whole):
        return True
    return whole and _shares_bytes(ctx, level, value, at)


def _alignment(ctx: StepContext, value: int, whole: bool) -> int:
    """The alignment a call may expect of `value`: scratch's (`ALIGNMENT`), or its element
    size for a value smaller than that (a scalar: an FP8 GEMM's amax, a layer's slice of a
    stacked vector of them, is read as one float)."""
    itemsize = ctx.itemsize(value)
    nbytes = ctx.plan.program.type_of(value).nbytes if whole else _span(ctx, value) * itemsize
    return ALIGNMENT if nbytes >= ALIGNMENT else itemsize


def _host_address(ctx: StepContext, level: Level, value: int, whole: bool) -> Address | None:
    """`value`'s address at `level` (its view's; `whole`: its slot's), or None where the host
    does not know it: in a WHILE node's body, whose table the device rewrites (no `entries`)."""
    slot = ctx.plan.slots[value if whole else ctx.view(value).base]
    if slot.storage != "workspace" and not level.entries:
        return None
    return ctx.slot_address(level, value) if whole else ctx.view_address(level, value)


def _shares_bytes(ctx: StepContext, level: Level, result: int, at: Address) -> bool:
    """Whether `result`'s bytes at `at` may overlap an operand's at `level`."""
    end = at.offset + ctx.plan.program.type_of(result).nbytes
    for value in ctx.step.op.operands:
        other = _host_address(ctx, level, value, whole=False)
        if other is None:
            return True
        other_end = other.offset + _span(ctx, value) * ctx.itemsize(value)
        if other.source == at.source and other.offset < end and at.offset < other_end:
            return True
    return False


def _staged_once(ctx: StepContext, value: int, staging: Staging) -> int:
    """The scratch offset (negative: below the scratch region) of the program's one copy of
    `value`'s span; `staging` gets the copy kernel if this step is the first to need it."""
    view, span, storage = ctx.view(value), _span(ctx, value), ctx.storage(value)
    key = (view.base, view.offset, span, storage)
    nbytes = span * ctx.itemsize(value)
    below = ctx.module.staged_inputs.get(key)
    if below is None:
        below = ctx.module.staged_inputs[key] = ctx.module.reserve_below_scratch(nbytes)
        copy = _staging_copy(ctx, value, below, span)
        staging.copies_in.append((value, copy, blocks_for(span)))
    # Every step that reads the copy counts as writing it, so `batch_launches` keeps them in
    # plan order after the step that makes it.
    ctx.staged_ranges.append((SCRATCH, -below, -below + nbytes))
    return -below


def _staging_copy(ctx: StepContext, value: int, below: int, span: int) -> Kernel:
    """A copy of `value`'s span to `below` bytes below scratch, as a kernel that reads both
    addresses from its launch's table: one kernel serves the copies of every layer's weight."""
    view = ctx.view(value)
    slot = ctx.plan.slots[view.base]
    entry = slot.index + (len(ctx.plan.program.parameters) if slot.storage == "output" else 0)
    offset = view.offset * ctx.itemsize(view.base)
    source = f"((char *)io[0] + {offset})" if offset else "((char *)io[0])"
    lines = copy_lines(source, "((char *)io[1])", ctx.storage(value), span)
    name = ctx.module.kernel(lines, f"step {ctx.index}: copy (staging)")
    return Kernel(name, (LevelPointer(True, entry), Address(SCRATCH, -below)))


def moves(ctx: StepContext, value: int) -> bool:
    """Whether stored `value` lives in the invocation's buffers (its address moves)."""
    return ctx.plan.slots[value].storage != "workspace"


def _span(ctx: StepContext, value: int) -> int:
    """Elements from the first to the last element of `value`'s view, inclusive."""
    t = ctx.plan.program.type_of(value)
    strides = ctx.view(value).strides
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.extents, strides, strict=True))


def stored_result(ctx: StepContext) -> int:
    """The value a library step's call writes: its op's result, or for a dot step with an
    epilogue (`accy.lower.gemm_epilogues`) its first loop's result, which takes its place (the
    biased product under a GELU, which a fused GEMM writes as its aux output)."""
    if ctx.step.kind == "dot" and ctx.step.epilogue:
        return ctx.step.epilogue[0].writes[0]
    return ctx.step.op.results[0]


def stage_moving_buffers(ctx: StepContext, operands) -> Staging:
    """Copy kernels that route `operands` (values read as whole buffers) and the step's result
    through scratch, those of them whose addresses move; an operand's view keeps its layout.

    In the program's own plan (scheduled once, in order) an operand's copy is made once, by
    the first step that needs it, into a place of its own below the scratch region, and later
    steps read that copy (an input read by a forward and a backward library step, as fused
    attention's q, k and v, is copied once per call, not twice)."""
    staging = Staging()
    for value in operands:
        if value in staging.operands or not moves(ctx, ctx.view(value).base):
            continue
        if ctx.own_plan:
            staging.operands[value] = _staged_once(ctx, value, staging)
            continue
        span = _span(ctx, value)
        offset = staging.operands[value] = ctx.scratch(span * ctx.itemsize(value))
        source, storage = ctx.view_expression(value), ctx.storage(value)
        kernel = copy_kernel(ctx, source, f"scratch + {offset}", storage, span)
        staging.copies_in.append((value, kernel, blocks_for(span)))
    op = ctx.step.op
    result = stored_result(ctx)
    if moves(ctx, result):
        staging.result = ctx.scratch(op.type.nbytes)
        source, target = f"scratch + {staging.result}", ctx.slot_expression(result)
        kernel = copy_kernel(ctx, source, target, ctx.storage(result), op.type.size)
        staging.copies_out.append((kernel, blocks_for(op.type.size)))
    return staging


# Steps whose memory is their plan step's reads, writes and scratch (and the shared scratch
# region, when they reserve some); the others (scans, conds, custom calls, copies) are barriers.
KNOWN_ACCESS = frozenset(
    {"loop", "group", "reduce", "reductions", "chain", "scatter", "dot", "sort"}
)


def step_access(ctx: StepContext, level: Level) -> Access:
    """The bytes `ctx`'s step reads and writes when its plan runs at `level`: its stored
    values, its planned scratch, and the shared scratch region when it uses any (every step
    that does starts at its offset 0, so any two of them overlap)."""
    if ctx.step.kind not in KNOWN_ACCESS:
        return BARRIER
    reads = [_value_range(ctx.plan, level, v) for v in ctx.step.reads]
    writes = [_value_range(ctx.plan, level, v) for v in ctx.step.writes]
    if None in reads or None in writes:
        return BARRIER
    for scratch in ctx.step.scratch:
        start = level.ws + ctx.workspace_scratch(scratch.name)
        writes.append((WORKSPACE, start, start + scratch.nbytes))
    if ctx.scratch_used:
        writes.append((SCRATCH, 0, ctx.scratch_used))
    writes += ctx.staged_ranges
    return Access(tuple(reads), tuple(writes))


def _value_range(plan: Plan, level: Level, value: int) -> Range | None:
    """The bytes of the buffer that holds `value` (its own, or the one it is a view of)."""
    slot = plan.slots.get(value)
    if slot is None:
        view = plan.view(value)
        slot = None if view is None else plan.slots.get(view.base)
    if slot is None:
        return None
    address = level_address(plan, level, slot)
    return (address.source, address.offset, address.offset + slot.type.nbytes)
