"""The lowering plan of a program: steps (fused loops and library calls) and where buffers live.

`build_plan(program)` runs fusion (`fusion.decide`), makes every operand of BLAS, custom kernels
and scan bodies a buffer they can read directly (a strided view where possible, a copy where
not), orders the steps, and places intermediates in one workspace by liveness
(`buffers.place`). Code generators walk `plan.steps` and ask the plan where each value is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ..config import config
from ..core import Operation, Program
from ..core.types import HALF_FLOATS, TensorType, bf16, f32, f64
from . import fusion
from .buffers import Lifetime, place, reads_in_place
from .contraction import Gemm, gemm_layout
from .expand import expand_compositions
from .gemm_epilogues import fuse_bias_epilogues, fuse_gelu_epilogues
from .grouping import (
    FlatCheck,
    consecutive_groups,
    loops_raised_to_siblings,
    reduction_chains,
    reduction_epilogues,
    same_footprint,
    sibling_reductions,
)
from .pooling import needs_accumulator
from .reduction import reduce_layout
from .remat import convert_inside_scans, rematerialize_stored
from .split_gemms import split_widened_gemms
from .target import CPU, Target
from .views import StridedView, view_of_stored, view_through

STEP_KINDS = {
    "reduce": "reduce",
    "dot_general": "dot",
    "scatter_add": "scatter",
    "scatter": "scatter",
    "sort": "sort",
    "conv": "conv",
    "reduce_window": "pool",
    "select_and_gather_add": "pool",
    "select_and_scatter_add": "pool",
    "custom_call": "custom_call",
    "scan": "scan",
    "cond": "cond",
    "while_loop": "while",
}
BLAS_DTYPES = (f32, f64)


@dataclass(frozen=True)
class Slot:
    """Where a stored value lives: `input` or `output` number `index`, or the workspace at byte
    offset `index`."""

    storage: str
    index: int
    type: TensorType

    def __str__(self) -> str:
        if self.storage == "workspace":
            return f"workspace+{self.index}"
        return f"{self.storage} {self.index}"


@dataclass(frozen=True)
class Scratch:
    """Workspace that one step uses while it runs (a scan's carries, an accumulator)."""

    name: str
    nbytes: int


@dataclass(frozen=True)
class Step:
    """One loop nest or library call. `writes` are the values it stores; `reads` the stored
    values it loads; `fused` the operations it computes inline without storing them. A group's
    `members` share one flat loop, a `reductions` step's (row reductions) one loop nest. A scan's
    `body` and a cond's or while_loop's `branches` (true, false; or condition, body) are plans
    of their own, run on the step's buffers. A row reduction's `epilogue` are flat elementwise
    loops over its results, computed where each result is stored (`grouping.reduction_epilogues`);
    its `writes` then hold only the values some other step or the caller reads. A `chain` step's
    `members` are its phases (`reduce` or `reductions` steps with their epilogues), each walking
    every row after the one before (`grouping.reduction_chains`)."""

    kind: str
    op: Operation | None
    writes: tuple[int, ...]
    reads: tuple[int, ...]
    fused: tuple[Operation, ...] = ()
    scratch: tuple[Scratch, ...] = ()
    body: Plan | None = None
    output: int | None = None
    detail: object = None
    members: tuple[Step, ...] = ()
    branches: tuple[Plan, ...] = ()
    epilogue: tuple[Step, ...] = ()


@dataclass(frozen=True)
class Plan:
    """The plan of one program (see `build_plan`): its steps in order, the slot of every stored
    value, the strided views over stored buffers, and the workspace size."""

    program: Program
    steps: tuple[Step, ...]
    slots: Mapping[int, Slot]
    output_slots: tuple[Slot, ...]
    views: Mapping[int, StridedView]
    producers: Mapping[int, Operation]
    scratch_offsets: Mapping[tuple[int, str], int] = field(default_factory=dict)
    workspace_bytes: int = 0
    # Values that share a buffer with another value of the same step (a result written in place
    # of an input it reads element for element): their pointers may not be `restrict`.
    in_place: frozenset[int] = frozenset()

    def is_stored(self, value: int) -> bool:
        return value in self.slots

    def view(self, value: int) -> StridedView | None:
        """The strided view of `value` over a stored buffer, if it is one."""
        return self.views.get(value)

    def producer(self, value: int) -> Operation:
        return self.producers[value]

    def scratch_offset(self, step: int, name: str) -> int:
        return self.scratch_offsets[(step, name)]


def build_plan(program: Program, target: Target = CPU) -> Plan:
    """Plan `program` for `target`: which work is fused into which loop, and where every buffer
    lives. Kinds the target runs as compositions are expanded first (`target.keep` says which
    it runs whole, on operands in which layout: `expand.py`), and on a target that asks for it
    f32 contractions of bf16 values become bf16 ones (`split_gemms.py`) and cheap values read long
    after they were made are computed again there instead of kept (`remat.py`).

    >>> import accy
    >>> from accy.lower import build_plan
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, lane=4)], lambda b, a: (a[0] * 2.0).exp())
    >>> [step.kind for step in build_plan(p).steps]
    ['loop']
    """
    program = expand_compositions(program, target.keep)
    if target.splits_widened_gemms:
        program = split_widened_gemms(program)
    if target.converts_inside_scans and config.lower_convert_inside_scans:
        program = convert_inside_scans(program, target.rematerialize_min_bytes)
    if target.rematerialize_after:
        program = rematerialize_stored(program, target)
    decisions = fusion.decide(program, target.recomputes_transcendentals, target.stores_bias_sums)
    views = _views_for_buffer_consumers(decisions)
    steps = _merge_siblings(_hoist_reductions(_steps(decisions, views, target)))
    check = FlatCheck(decisions.producer, decisions.is_stored, program.type_of, views)
    steps, in_epilogues = _attach_epilogues(program, steps, check, target.epilogue_excludes)
    if target.chains_reductions:
        steps = _chain_reductions(steps, check, target)
    if target.clusters_loops:
        steps = _cluster_loops(steps, check)
    if target.fuses_gemm_epilogues:
        outputs = frozenset(program.outputs)
        producers, is_stored = decisions.producer, decisions.is_stored
        steps = fuse_bias_epilogues(steps, producers, is_stored, outputs, Scratch)
        steps = fuse_gelu_epilogues(steps, producers, is_stored, outputs)
    steps, internal = _group(program, steps, check)
    internal |= in_epilogues
    views = {v: view for v, view in views.items() if view.base not in internal}
    slots, outputs = _slots(program, steps)
    offsets, workspace, reuses = _place_workspace(program, steps, slots)
    for key, offset in offsets.items():
        if isinstance(key, int):
            slots[key] = Slot("workspace", offset, program.type_of(key))
    scratch = {key: offset for key, offset in offsets.items() if isinstance(key, tuple)}
    shared = frozenset(reuses) | frozenset(reuses.values())
    producers = decisions.producer
    return Plan(program, tuple(steps), slots, outputs, views, producers, scratch, workspace, shared)


# views ---------------------------------------------------------------------------------------


def _compute_views(decisions: fusion.Fusion) -> dict[int, StridedView]:
    views: dict[int, StridedView] = {}
    for op in decisions.program.operations:
        for value in op.results:
            if decisions.is_stored(value):
                views[value] = view_of_stored(value, decisions.program.type_of(value))
            elif op.operands:
                view = view_through(op, views.get(op.operands[0]))
                if view is not None:
                    views[value] = view
    return views


def _contiguous_operands(op: Operation, views) -> list[bool]:
    return [
        views.get(v) is not None and views[v].is_contiguous(t)
        for v, t in zip(op.operands, op.operand_types, strict=True)
    ]


def _viewed_operands(op: Operation, views) -> list[bool]:
    # A GEMM packs an operand whose strides BLAS cannot take, so any view will do.
    return [v in views for v in op.operands]


BUFFER_RULES: dict[str, Callable[[Operation, dict], list[bool]]] = {
    "dot_general": _viewed_operands,
    "custom_call": _contiguous_operands,
    "conv": _contiguous_operands,
    "scan": _contiguous_operands,
    "cond": _contiguous_operands,
    "while_loop": _contiguous_operands,
}


def _views_for_buffer_consumers(decisions: fusion.Fusion) -> dict[int, StridedView]:
    """Store the operands of BLAS, kernels and scans that no view can serve; return the views."""
    while True:
        views = _compute_views(decisions)
        changed = False
        for op in decisions.program.operations:
            if op.kind not in BUFFER_RULES or decisions.decision[op.results[0]] == fusion.DEAD:
                continue
            for value, usable in zip(op.operands, BUFFER_RULES[op.kind](op, views), strict=True):
                if not usable and not decisions.is_stored(value):
                    decisions.store(value)
                    changed = True
        if not changed:
            return views


# steps ---------------------------------------------------------------------------------------


def _reads_and_fused(decisions: fusion.Fusion, op: Operation):
    reads: dict[int, None] = {}
    fused: dict[int, Operation] = {}
    pending = list(op.operands)
    while pending:
        value = pending.pop()
        if decisions.is_stored(value):
            reads[value] = None
            continue
        inner = decisions.producer[value]
        if inner.results[0] not in fused:
            fused[inner.results[0]] = inner
            pending.extend(inner.operands)
    ordered = sorted(fused.values(), key=lambda o: decisions.position[o.results[0]])
    return tuple(sorted(reads)), tuple(ordered)


def _steps(decisions: fusion.Fusion, views, target: Target) -> list[Step]:
    program = decisions.program
    steps = []
    for op in program.operations:
        if op.kind == "parameter" or decisions.decision[op.results[0]] != fusion.STORED:
            continue
        reads, fused = _reads_and_fused(decisions, op)
        kind = STEP_KINDS.get(op.kind, "loop")
        inner = replace(target, stores_bias_sums=False)  # a body's or branch's (`Target`)
        body = build_plan(op.attrs["body"], inner) if kind == "scan" else None
        branches = tuple(build_plan(op.attrs[name], inner) for name in BRANCHES.get(kind, ()))
        detail = DETAILS[kind](op, views) if kind in DETAILS else None
        scratch = _scratch(kind, op, body, detail, branches, target)
        steps.append(
            Step(
                kind, op, op.results, reads, fused, scratch, body, detail=detail, branches=branches
            )
        )
    first_output: dict[int, int] = {}
    for position, value in enumerate(program.outputs):
        if value in first_output or decisions.decision[value] == fusion.INPUT:
            steps.append(Step("copy", None, (), (value,), output=position))
        else:
            first_output[value] = position
    return steps


def _hoist_reductions(steps: list[Step]) -> list[Step]:
    """`steps` with each reduction moved up to just after the last step it reads from.

    A reduction's result is smaller than what it reads, so running it as early as it can only
    frees memory sooner. Program order can put one far from its input: GPT-2's loss reads the
    logit of each label after the whole backward pass, which kept the 0.8 GB of bf16 logits
    alive through it. Nothing a reduction writes is read before its old place, so moving it up
    keeps every dependence.
    """
    # Sort keys: step i keeps (i, 0, i); a reduction takes (k, 1, i), right after the key
    # (k, ...) of the last step it reads from, before step k + 1 and after any reduction moved
    # there earlier. One pass and a sort: linear-time lowering of long programs stays so.
    keys: list[tuple[int, int, int]] = []
    writer_key: dict[int, tuple[int, int, int]] = {}
    for index, step in enumerate(steps):
        key = (index, 0, index)
        if step.kind == "reduce":
            last = max((writer_key[v] for v in step.reads if v in writer_key), default=(-1,))
            key = (last[0], 1, index)
        keys.append(key)
        for value in step.writes:
            writer_key[value] = key
    order = sorted(range(len(steps)), key=keys.__getitem__)
    return [steps[i] for i in order]


def _reductions_step(members: list[Step]) -> Step:
    """One `reductions` step for row reductions over the same rows: one loop nest, one
    accumulator per member (`grouping.sibling_reductions`). Its `detail` is the first
    member's `ReduceLayout` (the members' differ at most in dtype)."""
    fused: dict[int, Operation] = {}
    for member in members:
        fused.update((op.results[0], op) for op in member.fused)
    return Step(
        "reductions",
        None,
        tuple(v for member in members for v in member.writes),
        tuple(sorted({v for member in members for v in member.reads})),
        tuple(fused.values()),
        detail=members[0].detail,
        members=tuple(members),
    )


def _merge_siblings(steps: list[Step]) -> list[Step]:
    """`steps` with each set of `sibling_reductions` as one step at the place of its first."""
    sets = [((), tuple(members)) for members in sibling_reductions(steps)]
    return _merged_at_first(steps, sets, _reductions_step)


def _merged_at_first(steps: list[Step], sets, make) -> list[Step]:
    """`steps` with each of `sets`, (steps to run just before, members) as indices into
    `steps`, made one step `make(members)` at the place of its first member, the steps before
    it just ahead; every step so placed is gone from where it was."""
    first = {members[0]: (ahead, members) for ahead, members in sets}
    moved = {i for ahead, members in sets for i in (*members[1:], *ahead)}
    merged = []
    for index, step in enumerate(steps):
        if index in first:
            ahead, members = first[index]
            merged += [steps[i] for i in ahead]
            merged.append(make([steps[i] for i in members]))
        elif index not in moved:
            merged.append(step)
    return merged


def _group_step(program: Program, members: list[Step], readers: dict[int, set[int]], indices):
    """One step for `members`; also the values that live only inside its loop."""
    written = [v for member in members for v in member.writes]
    outputs = set(program.outputs)
    internal = {v for v in written if v not in outputs and readers.get(v, set()) <= set(indices)}
    reads = {v for member in members for v in member.reads} - set(written)
    fused = tuple(op for member in members for op in (*member.fused, member.op))
    kept = tuple(v for v in written if v not in internal)
    return Step("group", None, kept, tuple(sorted(reads)), fused, members=tuple(members)), internal


def _readers(steps: list[Step]) -> dict[int, set[int]]:
    """Value -> indices of the steps that read it."""
    readers: dict[int, set[int]] = {}
    for index, step in enumerate(steps):
        for value in step.reads:
            readers.setdefault(value, set()).add(index)
    return readers


def _with_epilogue(program: Program, host: Step, loops: list[Step], outside: set[int]) -> Step:
    """Row reduction `host` computing `loops` where it stores each result; it writes only the
    values in `outside` (read by another step) or the program's outputs."""
    written = [*host.writes, *(v for loop in loops for v in loop.writes)]
    outputs = set(program.outputs)
    kept = tuple(v for v in written if v in outputs or v in outside)
    reads = {v for step in (host, *loops) for v in step.reads} - set(written)
    return replace(host, writes=kept, reads=tuple(sorted(reads)), epilogue=tuple(loops))


def _attach_epilogues(program: Program, steps: list[Step], check: FlatCheck, excludes):
    """`steps` with the `grouping.reduction_epilogues` of each row reduction moved into it
    (and the steps that run ahead of it moved there); also the values that no longer need a
    buffer (read only inside their reduction step)."""
    epilogues = reduction_epilogues(steps, check, excludes)
    if not epilogues:
        return steps, set()
    readers = _readers(steps)
    moved = {i for e in epilogues.values() for i in (*e.members, *e.ahead)}
    merged, internal = [], set()
    for index, step in enumerate(steps):
        if index in moved:
            continue
        if index in epilogues:
            epilogue = epilogues[index]
            merged += [steps[i] for i in epilogue.ahead]
            here = {index, *epilogue.members}
            loops = [steps[i] for i in epilogue.members]
            written = [*step.writes, *(v for loop in loops for v in loop.writes)]
            outside = {v for v in written if not readers.get(v, set()) <= here}
            step = _with_epilogue(program, step, loops, outside)
            internal |= set(written) - set(step.writes)
        merged.append(step)
    return merged, internal


def _chain_step(phases: list[Step]) -> Step:
    """One `chain` step for row reductions over the same rows, each reading earlier ones'
    results only at its own row (`grouping.reduction_chains`): each row is walked once per
    phase, one after the other. It writes what its phases write (a later phase reads an earlier
    one's results from their buffers) and reads what they read from other steps; its `detail`
    is the first phase's `ReduceLayout`."""
    written = {v for phase in phases for v in phase.writes}
    return Step(
        "chain",
        None,
        tuple(v for phase in phases for v in phase.writes),
        tuple(sorted({v for phase in phases for v in phase.reads} - written)),
        detail=phases[0].detail,
        members=tuple(phases),
    )


def _chain_reductions(steps: list[Step], check: FlatCheck, target: Target) -> list[Step]:
    """`steps` with each of `grouping.reduction_chains` as one step at the place of its first
    phase, the steps that run ahead of it just before."""
    chains = reduction_chains(
        steps, check, target.epilogue_excludes, ends_in_place=target.chains_end_in_place
    )
    return _merged_at_first(steps, [(c.ahead, c.phases) for c in chains], _chain_step)


CLUSTER_WINDOW = 24
"""How many steps ahead `_cluster_loops` looks for a flat loop to run next to another."""


def _cluster_loops(steps: list[Step], check: FlatCheck) -> list[Step]:
    """`steps` reordered so that flat loops over the same elements run one after another where
    what lies between allows it, for `_group` to make them one pass: a loop (or a run of
    them) moves down to just before the next such loop within `CLUSTER_WINDOW` steps, taking
    the steps in between that read its results (directly or through each other) along after
    that loop, unless that loop reads what they write. SwiGLU's backward computes silu(g) * u
    for the down projection's weight gradient, then, after the GEMM giving its gradient dp,
    dp * silu(g) and dp * u * silu'(g): one pass over g, u and dp instead of three. Then each
    loop moves up next to the last such loop before it where its reads allow
    (`grouping.loops_raised_to_siblings`: AdamW's updates join their moments)."""
    steps = list(steps)
    index = 0
    while index < len(steps):
        domain = _loop_domain(steps[index], check)
        if domain is None:
            index += 1
            continue
        end = index + 1  # the run [index, end) of loops over `domain`
        while end < len(steps) and _loop_domain(steps[end], check) == domain:
            end += 1
        moved = _joined(steps, index, end, domain, check)
        if moved is None:
            index = end
        else:
            steps = moved
    return loops_raised_to_siblings(steps, check, CLUSTER_WINDOW)


def _loop_domain(step: Step, check: FlatCheck) -> int | None:
    return check.domain(step) if step.kind == "loop" else None


def _joined(steps: list[Step], start: int, end: int, domain: int, check: FlatCheck):
    """`steps` with the run of loops [start, end) moved to just before the next loop over
    `domain` (within `CLUSTER_WINDOW`), the steps in between that depend on the run moved after
    that loop; None if there is no such loop or it depends on them."""
    waiting = {v for step in steps[start:end] for v in step.writes}  # the run's, then after's
    kept, after, after_writes = [], [], set()
    for position in range(end, min(len(steps), end + CLUSTER_WINDOW)):
        step = steps[position]
        if _loop_domain(step, check) == domain:
            if after_writes & set(step.reads):
                return None  # it reads a result of a step that must wait for the run
            run = steps[start:end]
            return [*steps[:start], *kept, *run, step, *after, *steps[position + 1 :]]
        if waiting & set(step.reads):
            after.append(step)
            waiting |= set(step.writes)
            after_writes |= set(step.writes)
        else:
            kept.append(step)
    return None


def _group(program: Program, steps: list[Step], check: FlatCheck):
    """Merge runs of flat steps over the same elements into group steps (see `grouping`), the
    scalar loops that ran between members just ahead of them."""
    groups = consecutive_groups(steps, check)
    readers = _readers(steps)
    first = {members[0]: (ahead, members) for ahead, members in groups}
    moved = {index for ahead, members in groups for index in (*members[1:], *ahead)}
    merged, internal = [], set()
    for index, step in enumerate(steps):
        if index in first:
            ahead, indices = first[index]
            merged += [steps[i] for i in ahead]
            group, inside = _group_step(program, [steps[i] for i in indices], readers, indices)
            merged.append(group)
            internal |= inside
        elif index not in moved:
            merged.append(step)
    return merged, internal


def _scan_scratch(op: Operation, body: Plan) -> tuple[Scratch, ...]:
    num_consts, num_carry = op.attrs["num_consts"], op.attrs["num_carry"]
    carries = op.operand_types[num_consts : num_consts + num_carry]
    xs = op.operand_types[num_consts + num_carry :]
    scratch = [Scratch("body", body.workspace_bytes)]
    scratch += [Scratch(f"carry{i}", t.nbytes) for i, t in enumerate(carries)]
    scratch += [
        Scratch(f"x{i}", t.nbytes // max(t.extent(op.attrs["axis"]), 1))
        for i, t in enumerate(xs)
        if t.position(op.attrs["axis"]) != 0
    ]
    return tuple(scratch)


BRANCHES = {"cond": ("true_body", "false_body"), "while": ("cond_body", "body")}
"""The sub-programs of a cond or while step, in the order of `Step.branches`."""


def _branch_scratch(op: Operation, branches: tuple[Plan, ...]) -> tuple[Scratch, ...]:
    """A cond runs one branch and a while_loop its condition then its body, one at a time: one
    workspace for the larger. A while_loop also needs its carries' partners (the body writes
    the next carries while it reads the current ones) and the byte its condition writes."""
    scratch = [Scratch("body", max(plan.workspace_bytes for plan in branches))]
    if op.kind == "while_loop":
        carries = op.operand_types[op.attrs["num_consts"] :]
        scratch += [Scratch(f"carry{i}", t.nbytes) for i, t in enumerate(carries)]
        scratch.append(Scratch("predicate", 1))
    return tuple(scratch)


def _gemm_scratch(op: Operation, gemm: Gemm) -> tuple[Scratch, ...]:
    operands = zip(("lhs", "rhs"), (gemm.lhs, gemm.rhs), op.operand_types, strict=True)
    return tuple(Scratch(name, t.nbytes) for name, matrix, t in operands if matrix.packed)


def _half_gemm_scratch(op: Operation) -> tuple[Scratch, ...]:
    """A GEMM of 16-bit floats on a target that computes it in float32 BLAS: room for both
    operands as float32 (converted once, as they are packed) and for a float32 result that is
    rounded to a 16-bit result. (A GPU's GEMM reads them as they are and packs in their own
    dtype where it must: `_gemm_scratch`; GPT-2's tied-embedding gradient needed 1.6 GB more at
    the step's peak when the GPU was given this room too.)"""
    scratch = [
        Scratch(name, t.size * 4) for name, t in zip(("lhs", "rhs"), op.operand_types, strict=True)
    ]
    if op.type.dtype in HALF_FLOATS:
        scratch.append(Scratch("result", op.type.size * 4))
    return tuple(scratch)


def is_half_gemm(op: Operation) -> bool:
    """Whether a dot_general multiplies 16-bit floats (into a 16-bit float or an f32 result),
    which both backends run as a GEMM computing in float32."""
    return op.operand_types[0].dtype in HALF_FLOATS and op.type.dtype in (*HALF_FLOATS, f32)


def _scratch(
    kind: str,
    op: Operation,
    body: Plan | None,
    detail,
    branches: tuple[Plan, ...],
    target: Target,
) -> tuple[Scratch, ...]:
    if kind == "scan":
        return _scan_scratch(op, body)
    if kind == "sort":  # the CPU's merge sort: keys in their compute type, two index arrays
        size = op.operand_types[0].size
        return tuple(Scratch(name, size * 8) for name in ("keys", "order", "spare"))
    if branches:
        return _branch_scratch(op, branches)
    if kind == "dot" and is_half_gemm(op) and target.half_gemms_in_float32:
        return _half_gemm_scratch(op)
    if kind == "dot" and (op.type.dtype in BLAS_DTYPES or is_half_gemm(op)):
        return _gemm_scratch(op, detail)
    if kind == "conv" and target.conv_scratch is not None:
        return tuple(Scratch(name, nbytes) for name, nbytes in target.conv_scratch(op))
    if kind == "pool" and needs_accumulator(op):  # a 16-bit scatter's f32 sums
        return (Scratch("accumulator", op.type.size * 4),)
    if kind == "reduce" and detail.needs_accumulator or kind == "scatter" and op.type.dtype == bf16:
        return (Scratch("accumulator", op.type.size * 4),)
    return ()


DETAILS = {
    "dot": lambda op, views: gemm_layout(op, *(views[v] for v in op.operands)),
    "reduce": lambda op, views: reduce_layout(op),
}


# buffers -------------------------------------------------------------------------------------


def _slots(program: Program, steps: list[Step]) -> tuple[dict[int, Slot], tuple[Slot, ...]]:
    slots: dict[int, Slot] = {}
    for index, value in enumerate(program.parameters):
        slots[value] = Slot("input", index, program.type_of(value))
    outputs = []
    for position, value in enumerate(program.outputs):
        slot = Slot("output", position, program.type_of(value))
        outputs.append(slot)
        slots.setdefault(value, slot)
    return slots, tuple(outputs)


def _place_workspace(program: Program, steps: list[Step], slots: dict[int, Slot]):
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    lifetimes = []
    for index, step in enumerate(steps):
        for value in step.writes:
            first.setdefault(value, index)
            last.setdefault(value, index)
        for value in step.reads:
            last[value] = index
        lifetimes += [Lifetime((index, s.name), s.nbytes, index, index) for s in step.scratch]
    reuses = _in_place_results(program, steps, slots, last)
    ends = dict(last)
    for value, source in reuses.items():  # a chain of reuses ends where its last value does
        root = _root(source, reuses)
        ends[root] = max(ends[root], last[value])
    for value, start in first.items():
        if value not in slots and value not in reuses:
            lifetimes.append(Lifetime(value, program.type_of(value).nbytes, start, ends[value]))
    offsets, workspace = place(lifetimes, len(steps))
    for value, source in reuses.items():
        offsets[value] = offsets[_root(source, reuses)]
    return offsets, workspace, reuses


def _in_place_results(
    program: Program, steps: list[Step], slots: dict[int, Slot], last: dict[int, int]
) -> dict[int, int]:
    """Results written over an intermediate of the same size that their step reads for the
    last time, element for element (`buffers.reads_in_place`, the test donation uses): value ->
    the value whose buffer it takes. GPT-2's logits gradient takes the logits' 0.8 GB. A
    chain's last phase, a loop, may too: `grouping.reduction_chains` ends a chain with such a
    loop only where the earlier phases read what it may take at their own row alone."""
    reuses: dict[int, int] = {}
    taken: set[int] = set()
    for index, step in enumerate(steps):
        if step.kind == "chain" and step.members[-1].kind == "loop":
            step = step.members[-1]
        if step.kind not in ("loop", "group"):
            continue
        for value in step.writes:
            if value in slots:
                continue
            t = program.type_of(value)
            for source in step.reads:
                if (
                    source in slots
                    or source in taken
                    or last.get(source) != index
                    or not same_footprint(program.type_of(source), t)
                    or not reads_in_place(step, source, value, t.named_extents)
                ):
                    continue
                reuses[value] = source
                taken.add(source)
                break
    return reuses


def _root(value: int, reuses: dict[int, int]) -> int:
    while value in reuses:
        value = reuses[value]
    return value
