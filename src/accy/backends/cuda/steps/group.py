"""CUDA for a group step: several flat steps over the same elements as one kernel, or, where
one kernel would hold more lane values a thread than registers allow, one kernel per set of
members that share no work (`independent_parts`)."""

from __future__ import annotations

from dataclasses import replace

from ....codegen.c.expressions import EMITTERS, Body, Flat
from ....core.types import TensorType
from ..context import StepCode, StepContext, launches
from ..reductions import Accumulator, choose_cut
from ..schedule import Level, Schedule
from ..vectors import LANE_BYTES, MIN_VECTOR_ELEMENTS, LaneBody, lane_divisor
from .common import elementwise_kernel, step_access, step_lane_width, step_streams, store_at
from .reduce import initial_values, reduction


def _member_values(ctx: StepContext, body: Body, r: str) -> list[str]:
    """Every member at flat position `r`: loops stored (where the plan keeps them), the
    reductions' elements returned."""
    values = []
    for member in ctx.step.members:
        op = member.op
        if member.kind == "loop":
            index = Flat(r, op.type)
            x = EMITTERS[op.kind](body, op, index)
            body.seed(op.results[0], index, x)
            if op.results[0] in ctx.step.writes:
                pointer = body.pointers[op.results[0]]
                body.lines.append(store_at(body, op.type.dtype, pointer, r, x))
        else:
            values.append(body.value(op.operands[0], Flat(r, op.operand_types[0])))
    return values


def _group_element(ctx: StepContext):
    def element(body: Body, r: str):
        if not isinstance(body, LaneBody):
            return body.lines, [_member_values(ctx, body, r)]
        lanes = [_member_values(ctx, body, body.lane(r, k)) for k in range(body.width)]
        return body.lines + body.stores(), lanes

    return element


def independent_parts(ctx: StepContext) -> list[tuple[int, ...]]:
    """The group's members (their positions) in sets that share no work: no member of one set
    reads a value a member of another writes, or a stored value of more than one element that
    a member of another reads (two parameters' AdamW updates are two sets; the scalars they
    share, a step count's bias corrections, are loaded once per thread anyway). Values that
    read no such stored value (a splat constant that simplification made one value for every
    parameter of its shape, `0.9 * m`'s 0.9) are no shared work either: each set computes
    them again for nothing."""
    members = ctx.step.members
    parent = list(range(len(members)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}  # value -> the first member that writes or streams it
    for i, member in enumerate(members):
        streamed = {v for v in member.reads if ctx.plan.program.type_of(v).size > 1}
        produced = _streaming_results(member, streamed)
        operands = {v for op in (*member.fused, member.op) for v in op.operands} - produced
        for v in (operands & set(owner)) | streamed | produced:
            first = owner.setdefault(v, i)
            parent[root(i)] = root(first)
    parts: dict[int, list[int]] = {}
    for i in range(len(members)):
        parts.setdefault(root(i), []).append(i)
    return [tuple(part) for part in parts.values()]


def _streaming_results(member, streamed: set[int]) -> set[int]:
    """The values `member` computes that read (through its fused work) a value in `streamed`,
    its work per element, and its own results (which a later member may read).
    `member.fused` is in program order, producers first."""
    depends = set(streamed)
    for op in member.fused:
        if any(v in depends for v in op.operands):
            depends.update(op.results)
    return (depends - streamed) | set(member.op.results)


def _part_step(ctx: StepContext, part: tuple[int, ...]):
    """The group of members `part` alone: their members, and the step's reads and writes
    that they touch."""
    members = tuple(ctx.step.members[i] for i in part)
    touched = {v for m in members for v in (*m.reads, *m.writes)}
    return replace(
        ctx.step,
        members=members,
        reads=tuple(v for v in ctx.step.reads if v in touched),
        writes=tuple(v for v in ctx.step.writes if v in touched),
    )


def _overloaded(ctx: StepContext) -> bool:
    """Whether the group's lanes of its streams would hold more than `LANE_BYTES` a thread
    even at its fewest lanes (`vectors.lane_width` stops halving at 16 bytes of the widest)."""
    return step_lane_width(ctx) * sum(step_streams(ctx)) > LANE_BYTES


def _flat_loops(ctx: StepContext, size: int) -> StepCode:
    """The kernel of a group of loops, or one kernel per independent part where one kernel
    would be register-bound: GPT-2's AdamW update of a layer's two MLP weights (14 streams,
    118 registers at 4 lanes: two blocks of 256 a multiprocessor) as two updates of one
    weight (64 registers), which the schedule then batches across the layers."""
    parts = independent_parts(ctx)
    if len(parts) > 1 and size >= MIN_VECTOR_ELEMENTS and _overloaded(ctx):
        contexts = [
            replace(ctx, step=_part_step(ctx, part), phase=f".{k}") for k, part in enumerate(parts)
        ]
        return part_launches(contexts, [_elementwise_loops(part, size) for part in contexts])
    return launches(_elementwise_loops(ctx, size))


def part_launches(contexts: list[StepContext], kernels: list) -> StepCode:
    """Code launching each part's (kernel, grid); at the top level each launch gets the
    access of its part alone (`steps.step_access`), not the whole group's, so that
    `batch_launches` sees them independent and launches the parts of one kernel (every
    parameter of one shape in an AdamW group) as one."""
    codes = [launches(kernel) for kernel in kernels]

    def schedule_parts(level: Level, schedule: Schedule) -> None:
        for ctx, code in zip(contexts, codes, strict=True):
            start = len(schedule.actions)
            code(level, schedule)
            if schedule.depth == 1:  # the code of a top-level step
                access = step_access(ctx, level)
                schedule.accesses += [access] * (len(schedule.actions) - start)

    return schedule_parts


def _elementwise_loops(ctx: StepContext, size: int):
    """The (kernel, grid) of the group's loops, all of them members without reductions."""
    first = ctx.step.members[0]

    def make(body: Body, index, position: str) -> None:
        _member_values(ctx, body, position)

    return elementwise_kernel(ctx, TensorType(first.op.type.dtype, (("n", size),)), make)


def emit_group(ctx: StepContext) -> StepCode:
    """Several flat steps over the same elements as one loop (see `accy.lower.grouping`)."""
    members = ctx.step.members
    first = members[0]
    size = first.op.type.size if first.kind == "loop" else first.op.operand_types[0].size
    reductions = [m.op for m in members if m.kind == "reduce"]
    if not reductions:
        return _flat_loops(ctx, size)
    accumulators = [
        Accumulator(f"acc{j}", op.attrs["op"], op.type.dtype) for j, op in enumerate(reductions)
    ]

    initial = initial_values(ctx, reductions)

    outputs = [op.results[0] for op in reductions]
    width = lane_divisor(step_lane_width(ctx), size)
    if size < MIN_VECTOR_ELEMENTS:
        width = 1
    cut = choose_cut(1, size, True, width=width)
    return reduction(ctx, cut, _group_element(ctx), lambda o: [], accumulators, initial, outputs)
