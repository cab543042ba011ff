"""Sibling fusion: consecutive steps that walk the same elements in the same order become one
loop with several results.

A loop over `n` elements, followed by another over `n` elements that reads the first's result
element by element, and by a sum of all `n` elements: three passes over memory, or one. A step
can join a group when it is *flat*: an elementwise loop or a reduction of every axis, whose
stored reads are all at the element's own position (contiguous buffers of as many elements,
reached only through elementwise work, reshapes and broadcasts of scalars), or at that position
plus an offset (a contiguous slice of a stored buffer: a gradient in its all-reduced bucket).
In one flat loop, element `i` of every member is computed in the same iteration, so a member's
result that no later step needs is never stored at all.

A group holds at most `MAX_GROUP_OPERATIONS` operations: C compilers take time quadratic in the
length of one loop body (register allocation), and past a few hundred operations per element
one more pass over memory costs little.

Row reductions that keep some axes are not flat, but two of them over the same rows (the same
input extents, kept and reduced axes, walked in the `rows` order), neither reading the other's
result, can share their loop nest just as well: each row is read once for both accumulators.
Cross-entropy's max and its pick of the label's logit read the [tokens, vocab] logits once
instead of twice (`sibling_reductions`). LayerNorm's backward row sums are a chain (the second
reads the first through the variance's derivative): they cannot share a pass, but the second
can walk each row right after the first, while the row is in cache (`reduction_chains`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field

from ..config import config
from ..core import Operation
from ..core.kinds.elementwise import BINARY

MAX_GROUP_OPERATIONS = 512

SAME_INDEX_KINDS = frozenset(
    {"unary", "add", "sub", "mul", "div", "pow", "max", "min", "compare", "select", "convert"}
    | set(BINARY)
    | {"bitcast_convert"}
)


def _significant(t) -> list[str]:
    return [a for a, n in t.named_extents if n != 1]


def keeps_flat_order(op: Operation) -> bool:
    """Whether a layout operation leaves every element at its row-major position: a reshape, or
    a transpose or broadcast that moves or adds only axes of extent 1."""
    if op.kind == "reshape":
        return True
    if op.kind in ("transpose", "broadcast_in_dim"):
        operand = op.operand_types[0]
        return operand.size == op.type.size and _significant(operand) == _significant(op.type)
    return False


class FlatCheck:
    """Whether a step's inputs can all be read at the element's own flat position (plus a
    constant offset: a contiguous view of a stored buffer, such as a gradient sliced out of a
    data-parallel step's all-reduced bucket, is read at its start plus the position)."""

    def __init__(self, producers: dict[int, Operation], is_stored, type_of, views=None):
        self.producers = producers
        self.is_stored = is_stored
        self.type_of = type_of
        self.views = views or {}

    def readable(self, value: int, size: int, viewed: set[int] | None = None) -> bool:
        """Whether `value` can be read at the flat position of an element of `size` elements.
        Contiguous views count only for a caller that passes `viewed`, which collects their
        buffers (it must keep a view from reading a buffer its own loop is still writing).

        A walk with a stack and a visited set: an expression that reuses a value (`x + x`) is a
        graph, and following each use separately would take time exponential in its depth.
        """
        pending, seen = [value], {value}
        while pending:
            value = pending.pop()
            if self.is_stored(value):
                if self.type_of(value).size != size:  # its own buffer, in row-major order
                    return False
                continue
            op = self.producers[value]
            if op.kind in SAME_INDEX_KINDS or keeps_flat_order(op):
                fresh = [v for v in op.operands if v not in seen]
                seen.update(fresh)
                pending.extend(fresh)
            elif op.kind == "broadcast_in_dim" and op.operand_types[0].rank == 0:
                continue  # a scalar is read once, anywhere
            elif viewed is not None and (base := self._contiguous_view(value)) is not None:
                if self.type_of(value).size != size:
                    return False
                viewed.add(base)
            elif op.kind != "constant":
                return False
        return True

    def _contiguous_view(self, value: int) -> int | None:
        """The buffer `value` is a contiguous view of, if it is one."""
        view = self.views.get(value)
        return view.base if view is not None and view.is_contiguous(self.type_of(value)) else None

    def domain(self, step, viewed: set[int] | None = None) -> int | None:
        """The element count a flat step walks, or None if the step is not flat (`viewed`: as
        for `readable`)."""
        op = step.op
        if step.kind == "loop":
            if op.kind not in SAME_INDEX_KINDS | {"constant"} and not keeps_flat_order(op):
                return None
            size = op.type.size
            operands = op.operands
        elif step.kind == "reduce" and not step.detail.kept and step.detail.strategy == "rows":
            size = op.operand_types[0].size
            operands = op.operands[:1]
        else:
            return None
        if size < 2 or not all(self.readable(v, size, viewed) for v in operands):
            return None
        return size


def consecutive_groups(steps, check: FlatCheck) -> list[tuple[list[int], list[int]]]:
    """Runs of consecutive flat steps with equal element counts, as (steps to run just before,
    members): indices into `steps`.

    A reduction's result is complete only when the loop ends, so a step that reads it starts a
    new group; so does a step that reads a member's result through a view (element i of the
    view may be an element the loop has not reached), and a step that would take the group
    past `MAX_GROUP_OPERATIONS`. A scalar loop between members that reads nothing the group
    writes runs just before the group instead of splitting it: AdamW's step count and bias
    corrections sit between the moments and the parameter update that reads them.
    """
    groups: list[tuple[list[int], list[int]]] = []
    previous, unready, written, operations = None, set(), set(), 0
    passed: list[int] = []  # scalar loops since the group's last member
    for index, step in enumerate(steps):
        viewed: set[int] = set()
        domain = check.domain(step, viewed)
        size = len(step.fused) + 1
        if domain is None and previous is not None and _passable(step, written):
            passed.append(index)
            continue
        if (
            domain is not None
            and domain == previous
            and not unready & set(step.reads)
            and not viewed & written
            and operations + size <= MAX_GROUP_OPERATIONS
        ):
            groups[-1][0].extend(passed)
            groups[-1][1].append(index)
            operations += size
        elif domain is not None:
            groups.append(([], [index]))
            unready, written, operations = set(), set(), size
        if domain is not None:
            written |= set(step.writes)
            if step.kind == "reduce":
                unready |= set(step.writes)
        previous, passed = domain, []
    return [(ahead, members) for ahead, members in groups if len(members) > 1]


def loops_raised_to_siblings(steps, check: FlatCheck, window: int) -> list:
    """`steps` with each flat loop moved up to just after the last flat loop over as many
    elements before it, at most `window` steps before it, where nothing in between writes what
    it reads: for `consecutive_groups` to make them one pass.

    AdamW computes every parameter's moments, then every parameter's update: the update of
    Llama's stacked MLP weights came 12 to 19 steps after their moments, past the moments of
    the other shapes, and ran as a pass of its own that read the moments back (5.1 ms of the
    H200's step for 0.8 B parameters). Raised, it joins their group. A loop only moves up, to
    where everything it reads is written, so every dependence holds; one pass and a sort keep
    planning linear. Sort keys: step i keeps (i,); a raised loop takes its sibling's key plus
    (i,), which sorts after the sibling and before step sibling + 1, after any loop raised to
    that sibling before it."""
    keys: list[tuple[int, ...]] = []
    writer_key: dict[int, tuple[int, ...]] = {}
    last_loop: dict[int, tuple[tuple[int, ...], int]] = {}  # elements -> (key, index)
    for index, step in enumerate(steps):
        key: tuple[int, ...] = (index,)
        domain = check.domain(step) if step.kind == "loop" else None
        if domain is not None:
            sibling = last_loop.get(domain)
            if sibling is not None and index - sibling[1] <= window:
                ready = max((writer_key[v] for v in step.reads if v in writer_key), default=())
                if ready <= sibling[0]:
                    key = (*sibling[0], index)
            last_loop[domain] = (key, index)
        keys.append(key)
        for value in step.writes:
            writer_key[value] = key
    order = sorted(range(len(steps)), key=keys.__getitem__)
    return [steps[i] for i in order]


def _passable(step, written: set[int]) -> bool:
    """Whether `step` is a scalar loop that can run before the open group, whose members wrote
    `written`: it reads none of those."""
    return step.kind == "loop" and step.op.type.size == 1 and not written & set(step.reads)


def _row_key(step) -> tuple | None:
    """What a row reduction must share with a sibling to walk the same loop nest (the extents
    and axis positions of its input; names and dtypes may differ), or None if `step` is not a
    row reduction keeping at least two results (one result is a flat step: see `FlatCheck`)."""
    if step.kind != "reduce" or step.detail.strategy != "rows" or not step.detail.kept:
        return None
    layout = step.detail
    if step.op.type.size < 2 or layout.input.size == 0:
        return None
    return layout.input.extents, layout.kept, layout.reduced


@dataclass
class _Siblings:
    first: int  # index of the first member: where the merged step runs
    members: list[int] = field(default_factory=list)
    operations: int = 0


def sibling_reductions(steps) -> list[list[int]]:
    """Sets of row reductions (indices into `steps`, in order) that can run as one loop nest
    with one accumulator each, at the place of the first.

    A reduction joins the earliest set with its `_row_key` whose first member comes after
    every step that writes what it reads (so it reads no member's result either): moving it up
    to there keeps every dependence, as hoisting does, and nothing in between reads its result
    (that came later in a valid order). After hoisting those sets are the reductions moved to
    just after the same step: cross-entropy's max and the pick of the label's logit (both right
    after the logits) share a pass, and the sum of `exp(logits - max)` runs after them. A set
    holds at most `MAX_GROUP_OPERATIONS` operations. One pass, a dict lookup and a bisection
    per step: planning stays (nearly) linear in the program's length.

    >>> import accy
    >>> p = accy.trace.define("s", [accy.spec(accy.f32, row=4, v=8)],
    ...                       lambda b, a: (a[0].sum("v"), a[0].max("v"), a[0].exp().sum("row")))
    >>> [(step.kind, len(step.members)) for step in accy.lower.build_plan(p).steps]
    [('reductions', 2), ('reduce', 0)]
    """
    written_at: dict[int, int] = {}  # value -> index of the step that will write it
    by_key: dict[tuple, list[_Siblings]] = {}  # each key's sets, by their first member
    sets: list[_Siblings] = []
    for index, step in enumerate(steps):
        key = _row_key(step)
        at = index
        if key is not None:
            size = len(step.fused) + 1
            last = max((written_at[v] for v in step.reads if v in written_at), default=-1)
            candidates = by_key.setdefault(key, [])
            earliest = bisect_right(candidates, last, key=lambda s: s.first)
            # The earliest set it may join, or when that one is full the latest (filled last).
            valid = [candidates[earliest], candidates[-1]] if earliest < len(candidates) else []
            siblings = next((s for s in valid if s.operations + size <= MAX_GROUP_OPERATIONS), None)
            if siblings is None:
                siblings = _Siblings(index)
                candidates.append(siblings)
                sets.append(siblings)
            siblings.members.append(index)
            siblings.operations += size
            at = siblings.first
        for value in step.writes:
            written_at[value] = at
    return [s.members for s in sets if len(s.members) > 1]


# Steps after a row reduction searched for its epilogue (`accy.config.lower_epilogue_window`):
# a consumer further away would move past more work than it saves, and a bounded search keeps
# planning linear.


def _epilogue_size(step, check: FlatCheck, excludes: frozenset[str]) -> int | None:
    """The element count of flat elementwise loop `step` (None if it is not one, or if it
    computes an operation in `excludes`)."""
    if step.kind != "loop" or any(_operation_name(op) in excludes for op in (*step.fused, step.op)):
        return None
    return check.domain(step)


def _operation_name(op: Operation) -> str:
    return op.attrs["op"] if op.kind == "unary" else op.kind


def _epilogue_host(step) -> int | None:
    """The result count of a row reduction (`reduce` or `reductions`, `rows` order, keeping at
    least one axis) whose kernel can run an epilogue; None for any other step."""
    if step.kind not in ("reduce", "reductions") or step.detail.strategy != "rows":
        return None
    size = (step.members[0].op if step.members else step.op).type.size
    if not step.detail.kept or step.detail.input.size == 0 or size < 2:
        return None
    return size


@dataclass(frozen=True)
class Epilogue:
    """A row reduction's epilogue: the loops that join it (`members`) and the steps between
    them that run before the reduction instead (`ahead`: they read nothing it or its epilogue
    writes), all indices into the steps, in order."""

    members: tuple[int, ...]
    ahead: tuple[int, ...]


def reduction_epilogues(
    steps, check: FlatCheck, excludes: frozenset[str] = frozenset()
) -> dict[int, Epilogue]:
    """Row reduction (index into `steps`) -> the flat elementwise loops that run as its
    epilogue: computed where each result is stored, from the final accumulator values.

    A loop joins when it walks exactly the reduction's results (the same element count, every
    stored read at the element's own position: `FlatCheck`), reads a result of the reduction
    or of an earlier epilogue loop, and reads nothing written by a step between the reduction
    and itself that depends on them, so that it can move up to the reduction; the steps in
    between that depend on neither move ahead of the reduction (cross-entropy's backward
    divides by the batch size, a scalar computed between the softmax's sum and the division of
    its results). A loop over other elements (a broadcast of the results back over the rows)
    never joins. At most `lower_epilogue_window` steps are searched and `MAX_GROUP_OPERATIONS`
    operations joined. A loop computing an operation in `excludes` (the target's
    `epilogue_excludes`) stays a loop.

    >>> import accy
    >>> p = accy.trace.define("m", [accy.spec(accy.f32, row=4, v=8)],
    ...                       lambda b, a: (a[0].sum("v") / 8.0 + 1.0).sqrt())
    >>> [(s.kind, len(s.epilogue)) for s in accy.lower.build_plan(p).steps]
    [('reduce', 1)]
    """
    epilogues: dict[int, Epilogue] = {}
    claimed: set[int] = set()  # steps that joined an epilogue or moved ahead of a reduction
    for index, host in enumerate(steps):
        size = _epilogue_host(host)
        if size is None or index in claimed:
            continue
        epilogue = _epilogue_of(steps, index, size, check, claimed, excludes)
        if epilogue is not None:
            epilogues[index] = epilogue
            claimed.update(epilogue.members, epilogue.ahead)
    return epilogues


def _epilogue_of(steps, index: int, size: int, check: FlatCheck, claimed, excludes):
    """The `Epilogue` of `steps[index]` (a row reduction of `size` results), or None (see
    `reduction_epilogues`). A movable loop that reads no result yet waits (`pending`): it joins
    with the first later loop that does (LayerNorm's backward computes `var + eps` again
    before its row scalars read it and the row sums), else it stays where it is. A step in
    between that reads what the reduction, a member, a pending loop or another such step
    writes stays after the reduction (`pinned`); so does another row reduction (it may have an
    epilogue of its own); any other runs ahead of it."""
    host = steps[index]
    available = set(host.writes)
    pinned: set[int] = set()  # what the steps that stay after the reduction write
    operations = len(host.fused) + max(len(host.members), 1)
    members: list[int] = []
    pending: list[int] = []
    ahead: list[int] = []
    for later in range(index + 1, min(index + 1 + config.lower_epilogue_window, len(steps))):
        if later in claimed:  # already placed before this reduction
            continue
        step = steps[later]
        reads = set(step.reads)
        waiting = {v for p in pending for v in steps[p].writes}
        cost = len(step.fused) + 1 + sum(len(steps[p].fused) + 1 for p in pending)
        movable = (
            _epilogue_size(step, check, excludes) == size
            and not reads & pinned
            and operations + cost <= MAX_GROUP_OPERATIONS
        )
        if movable and reads & (available | waiting):
            members += [*pending, later]
            available |= waiting | set(step.writes)
            operations += cost
            pending = []
        elif movable:
            pending.append(later)
        elif reads & (available | waiting | pinned) or _epilogue_host(step) is not None:
            pinned |= set(step.writes)
        else:
            ahead.append(later)
    if not members:
        return None
    return Epilogue(tuple(members), tuple(a for a in ahead if a < members[-1]))


# Steps after a row reduction searched for the later phases of its chain
# (`accy.config.lower_chain_window`; as for epilogues: a bounded search keeps planning linear,
# and a phase further away would move more work). Whether a loop after a chain's last
# reduction may be its last phase (LayerNorm's normalized output after the variance) is
# `accy.config.lower_chain_trailing_loops`.


def _phase_key(step) -> tuple | None:
    """The `_row_key` of a row reduction step that can be a chain's phase: a `reduce` or a
    `reductions` set (its members share the key); None for any other step."""
    if step.kind == "reductions":
        return _row_key(step.members[0])
    return _row_key(step) if step.kind == "reduce" else None


def _phase_operations(step) -> int:
    members = step.members or (step,)
    return sum(len(m.fused) + 1 for m in members) + sum(len(e.fused) + 1 for e in step.epilogue)


LOOP_PHASE_KINDS = SAME_INDEX_KINDS | {"broadcast_in_dim", "transpose"}
"""What a loop that is a chain's phase may compute last (its fused operands may be anything):
an operation whose element at an index reads its operands' elements by axis name."""


MIN_LOOP_PHASE_ROW = 32
"""Elements a row needs for a loop over it to be a chain's phase: a shorter row is one thread's
on a GPU, whose stores would then be strided across its warp instead of coalesced."""


def _loop_phase(step, key: tuple, excludes: frozenset[str]) -> bool:
    """Whether loop `step` can be a phase of a chain over rows `key`: it walks each row's
    elements (its result has the extents the rows' reductions read; rows of at least
    `MIN_LOOP_PHASE_ROW`), and computes nothing in `excludes` (the target's
    `epilogue_excludes`: on the CPU, functions whose vector variants its own loops would
    call)."""
    if step.kind != "loop" or step.op.kind not in LOOP_PHASE_KINDS:
        return False
    extents, _, reduced = key
    length = 1
    for p in reduced:
        length *= extents[p]
    if step.op.type.extents != extents or length < MIN_LOOP_PHASE_ROW:
        return False
    return not any(_operation_name(op) in excludes for op in (*step.fused, step.op))


class RowReads:
    """Whether a chain's later phase reads what earlier phases wrote only at its own row:
    through elementwise work, broadcasts and transposes (by axis name) and reshapes that only
    add or drop axes of extent 1. A per-row result (a reduction's, or its epilogue's) must be
    read at the kept axes' position; a row-sized value (a loop phase's) anywhere in the same
    row (its components at the kept positions are the kept axes')."""

    def __init__(self, check: FlatCheck, key: tuple):
        self.check = check
        self.extents, self.kept_positions, _ = key
        self.rows = math.prod(self.extents[p] for p in self.kept_positions)
        self.row_elements = math.prod(self.extents) // self.rows

    def only_at_row(self, step, chained: set[int]) -> bool:
        """Whether phase `step` (a row reduction, or a loop over the rows' elements) reads the
        values in `chained` only at its own row (and a reduction's initial value never)."""
        depends: dict[int, bool] = {}
        if step.kind == "loop":
            op = step.op
            index = self._operand_indices(op, op.type.axes)
            if index is None:
                return not any(self._reaches(v, chained, depends) for v in op.operands)
            kept = self._kept(op.type)
            return all(
                self._at_row(v, at, chained, kept, depends)
                for v, at in zip(op.operands, index, strict=True)
            )
        for member in step.members or (step,):
            op = member.op
            if self._reaches(op.operands[1], chained, depends):
                return False
            x = op.operand_types[0]
            if not self._at_row(op.operands[0], x.axes, chained, self._kept(x), depends):
                return False
        return True

    def _kept(self, t) -> tuple:
        """The names of `t`'s significant kept axes (`t` has the rows' input extents)."""
        return tuple(t.axes[p] for p in self.kept_positions if t.extents[p] != 1)

    def _reaches(self, value: int, chained: set[int], depends: dict[int, bool]) -> bool:
        """Whether computing `value` (inline, up to stored values) loads one in `chained`."""
        pending, order = [value], []
        while pending:  # a stack, not recursion: expressions can be deep
            v = pending.pop()
            if v in depends:
                continue
            if v in chained or self.check.is_stored(v):
                depends[v] = v in chained
                continue
            order.append(v)
            depends[v] = False  # provisional: the graph is acyclic, fixed below
            pending.extend(self.check.producers[v].operands)
        for v in reversed(order):
            depends[v] = any(depends.get(u, False) for u in self.check.producers[v].operands)
        return depends[value]

    def _at_row(self, value, axes, chained, kept, depends) -> bool:
        """Whether `value`, read at the index whose components are the phase's axis names
        `axes` (or "0"), reads `chained` values only at the row whose kept components are
        `kept`."""
        pending, seen = [(value, tuple(axes))], set()
        while pending:
            v, index = pending.pop()
            if (v, index) in seen or not self._reaches(v, chained, depends):
                continue
            seen.add((v, index))
            if v in chained:
                if not self._in_row(self.check.type_of(v), index, kept):
                    return False
                continue
            op = self.check.producers[v]
            operands = self._operand_indices(op, index)
            if operands is None:
                return False
            pending.extend(zip(op.operands, operands, strict=True))
        return True

    def _in_row(self, t, index: tuple, kept: tuple) -> bool:
        """Whether `index` of chained value `t` is in the row whose kept components are
        `kept`: a per-row result's significant components are `kept`; a row-sized value's
        components at the kept positions are."""
        if t.size == self.rows:
            parts = [c for c, n in zip(index, t.extents, strict=True) if n != 1]
            return tuple(parts) == kept
        if t.extents == self.extents:
            return self._kept_components(index, t) == kept
        return False

    def _kept_components(self, index: tuple, t) -> tuple:
        return tuple(index[p] for p in self.kept_positions if t.extents[p] != 1)

    @staticmethod
    def _operand_indices(op: Operation, index: tuple) -> list[tuple] | None:
        """The index of each operand of `op` read at `index` (components are axis names or
        "0"), or None where it is not a renaming of the same components."""
        if op.kind in LOOP_PHASE_KINDS:
            result = op.type
            indices = []
            for t in op.operand_types:
                if any(a not in result.axes for a in t.axes):
                    return None
                indices.append(tuple(index[result.position(a)] for a in t.axes))
            return indices
        if op.kind == "reshape":
            operand, result = op.operand_types[0], op.type
            if _significant(operand) != _significant(result):
                return None
            parts = iter(c for c, n in zip(index, result.extents, strict=True) if n != 1)
            return [tuple(next(parts) if n != 1 else "0" for n in operand.extents)]
        return None if op.operands else []


@dataclass(frozen=True)
class Chain:
    """Row reductions over the same rows, each reading earlier ones' results only at its own
    row: `phases` (indices into the steps, in order) run as one pass per phase over each row;
    `ahead` are the steps between them that run before the chain (they read nothing it
    writes)."""

    phases: tuple[int, ...]
    ahead: tuple[int, ...]


def reduction_chains(
    steps, check: FlatCheck, excludes: frozenset[str] = frozenset(), ends_in_place: int = 0
) -> list[Chain]:
    """The chains of row reductions in `steps` (see `Chain`): a later row reduction (`reduce`
    or `reductions`, with its epilogue) joins an earlier one's chain when it has the same
    `_row_key`, reads a value some phase of the chain writes, reads those values only at its
    own row (`RowReads`: `logits - max` broadcast along the reduced axis, never a transposed
    or shifted row), and reads nothing written by a step in between that depends on the chain.
    A loop over the rows' elements that reads the chain's values at its own row joins too
    (`_loop_phase`: LayerNorm's `x - mean` between the mean and the variance, its normalized
    output after them), unless it computes an operation in `excludes`, or it is the chain's
    last phase and may write over a buffer it reads last (`_InPlace`), which it does as a phase
    only over rows of at most `ends_in_place` elements and where no earlier phase reads that
    buffer elsewhere than at its own row. The steps in between that
    depend on the chain stay after it; the others run ahead of it. Each row's later passes then
    read the row while it is still in cache. At most `lower_chain_window` steps are searched after
    each phase and `MAX_GROUP_OPERATIONS` operations joined.

    >>> import accy
    >>> p = accy.trace.define("c", [accy.spec(accy.f32, row=4, v=8)],
    ...                       lambda b, a: (a[0] - a[0].max("v")).exp().sum("v"))
    >>> [(s.kind, len(s.members)) for s in accy.lower.build_plan(p).steps]
    [('chain', 2)]
    """
    chains: list[Chain] = []
    claimed: set[int] = set()
    in_place = _InPlace(steps, check)
    for index, host in enumerate(steps):
        key = _phase_key(host)
        if key is None or index in claimed:
            continue
        rows = RowReads(check, key)
        chain = _chain_of(steps, index, key, rows, claimed, excludes, in_place, ends_in_place)
        if chain is not None:
            chains.append(chain)
            claimed.update(chain.phases, chain.ahead)
    return chains


class _InPlace:
    """The buffers a loop may write its result over, those it reads for the last time (the
    test of `plan._in_place_results`, loosely: a value other than a parameter, of as many bytes
    and the same itemsize, that no later step reads)."""

    def __init__(self, steps, check: FlatCheck):
        self.steps = steps
        self.type_of = check.type_of
        self.producers = check.producers
        self.last_read: dict[int, int] = {}
        for index, step in enumerate(steps):
            for value in step.reads:
                self.last_read[value] = index

    def __call__(self, index: int) -> list[int]:
        t = self.type_of(self.steps[index].op.results[0])
        return [
            v
            for v in self.steps[index].reads
            if self.last_read.get(v) == index
            and self.producers[v].kind != "parameter"
            and same_footprint(self.type_of(v), t)
        ]


def _may_end(steps, phases, buffers: list[int], rows: RowReads, ends_in_place: int) -> bool:
    """Whether the chain's last phase, a loop that may write over `buffers`, may end it: with
    `lower_chain_trailing_loops`, where it takes no buffer, or over rows of at most
    `ends_in_place` elements where the earlier phases read those buffers only at their own row
    and not in a reduction's epilogue: each row is then done with before the last phase
    stores over it."""
    if not config.lower_chain_trailing_loops:
        return False
    if not buffers:
        return True
    taken = set(buffers)
    return rows.row_elements <= ends_in_place and all(
        rows.only_at_row(steps[p], taken)
        and not any(taken & set(loop.reads) for loop in steps[p].epilogue)
        for p in phases[:-1]
    )


def same_footprint(source, result) -> bool:
    """Whether a result of type `result` can be written over a buffer of type `source`
    element for element: as many bytes, elements of one size.

    >>> import accy
    >>> same_footprint(accy.spec(accy.f32, n=4), accy.spec(accy.i32, m=4))
    True
    >>> same_footprint(accy.spec(accy.f32, n=4), accy.spec(accy.bf16, n=8))
    False
    """
    return source.nbytes == result.nbytes and source.dtype.itemsize == result.dtype.itemsize


def _chain_of(
    steps, index, key, rows: RowReads, claimed, excludes, in_place, ends_in_place: int
) -> Chain | None:
    """The `Chain` starting at row reduction `steps[index]`, or None (see `reduction_chains`).
    `available`: what the phases write; `pinned`: what the steps that must stay after the chain
    write (they read `available` or `pinned`). A loop after the last reduction may write its
    result over a buffer it reads for the last time (`_InPlace`: GPT-2's logits gradient over
    the logits, 0.8 GB) as the chain's last phase only where the earlier phases read that
    buffer at their own rows alone, which the row's last pass then overwrites; else it stays a
    step of its own."""
    available = set(steps[index].writes)
    pinned: set[int] = set()
    operations = _phase_operations(steps[index])
    phases, ahead = [index], []
    later = index + 1
    while later < min(phases[-1] + 1 + config.lower_chain_window, len(steps)):
        step = steps[later]
        reads = set(step.reads)
        fits = _phase_key(step) == key or _loop_phase(step, key, excludes)
        if later not in claimed and (
            fits
            and reads & available
            and not reads & pinned
            and operations + _phase_operations(step) <= MAX_GROUP_OPERATIONS
            and rows.only_at_row(step, available)
        ):
            phases.append(later)
            available |= set(step.writes)
            operations += _phase_operations(step)
        elif later in claimed:
            pass  # placed before this chain by an earlier one
        elif reads & (available | pinned):
            pinned |= set(step.writes)
        else:
            ahead.append(later)
        later += 1
    while (
        len(phases) > 1
        and steps[phases[-1]].kind == "loop"
        and not _may_end(steps, phases, in_place(phases[-1]), rows, ends_in_place)
    ):
        phases.pop()
    if len(phases) < 2:
        return None
    return Chain(tuple(phases), tuple(a for a in ahead if a < phases[-1]))
