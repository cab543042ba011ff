"""Rematerialization: values made of cheap elementwise work computed again where they are needed
long after they were made, instead of being stored across the gap.

A training step keeps values from the forward pass for the backward pass. Some of them are a few
elementwise operations away from values the backward pass keeps anyway: GPT-2's GELU output
gelu(h), read by the MLP's second GEMM in the forward pass and by that GEMM's weight gradient
in the backward pass, is a dozen operations on h, which the GELU's own derivative reads in the
backward pass too; a LayerNorm's output is (x - mean) * rstd * gain + bias, where the
LayerNorm's backward pass keeps x - mean and rstd. Storing h and recomputing gelu(h) is what
PyTorch's compiler does (inductor's min-cut partitioner); here it takes 1 GB off the peak of
GPT-2-small's bf16 step.

The rewrite splits the uses of each value `v` into runs (`clusters`): uses closer than
`distance` operations to the previous one belong to the same run. The first run keeps reading
`v`; each later run reads a copy of `v` computed just before the run's first use, from
*anchors*: values alive there anyway (read there or later), parameters, constants and values
much smaller than `v` (vectors, scalars: `SMALL_FRACTION`). Only `RECOMPUTABLE` kinds are
repeated (elementwise arithmetic, transcendentals unless the target says not, conversions and
layout; no reductions, GEMMs or gathers), at most `MAX_CHAIN` of them for one copy. If a run
cannot be served so, `v` stays alive until that run and only the runs after it are served by
copies. The copies repeat the same operations on the same values (same kinds, attributes and
dtypes), so the results are bit for bit those of the original; fusion then computes each copy
inside its consumer where it reads it element by element, or stores it just before a GEMM that
reads it whole, so that the stored `v` dies after its first run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..core import Operation, Program
from ..core.builder import Builder
from ..core.kinds.registry import RULES
from ..interpret import Graph, Layer, run
from ..trace import define
from ..transforms.scan_split import replay
from ..transforms.simplify import eliminate_dead_code
from . import fusion
from .grouping import SAME_INDEX_KINDS
from .target import Target
from .views import VIEW_KINDS

RECOMPUTABLE = SAME_INDEX_KINDS | VIEW_KINDS
"""Kinds a copy repeats: elementwise (transcendentals included) and layout operations."""
ALWAYS_ALIVE = frozenset({"parameter", "constant", "iota"})
"""Kinds whose values a copy may read anywhere: inputs, and values fusion computes inline."""
SMALL_FRACTION = 16
"""An anchor at most 1/16 of the copied value's bytes may be kept alive longer for the copy."""
MAX_CHAIN = 64
"""The most operations one copy repeats (fusion's `MAX_INLINE_DEPTH`)."""


def rematerialize(
    program: Program,
    distance: int,
    worth: Callable[[int], bool] | None = None,
    transcendentals: bool = True,
) -> Program:
    """`program` with each value that is read again more than `distance` operations after its
    previous reader recomputed there from values alive anyway, when only cheap elementwise work
    separates them (see the module docstring); the same program if there is none. `worth`
    says which values to consider (`build_plan`: those fusion would store; by default all);
    `transcendentals=False` repeats only arithmetic, conversions and layout (no exp, tanh...).

    >>> import accy
    >>> def body(b, a):
    ...     g = (a[0] * 2.0).exp()
    ...     early = g.sum("n")
    ...     far = a[1]
    ...     for _ in range(8):
    ...         far = far.exp()
    ...     return early + (g * far).sum("n")
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, n=4)] * 2, body)
    >>> rematerialize(p, 4).count("unary") - p.count("unary")  # exp(a[0] * 2) again
    1
    >>> rematerialize(p, 4, transcendentals=False) is p
    True
    """
    uses = _uses(program)
    cut = _plan_copies(program, uses, distance, worth or (lambda value: True), transcendentals)
    if not cut:
        return program
    return run(program, _Rematerialize(Graph(Builder(program.name)), program, cut))


def rematerialize_stored(program: Program, target: Target) -> Program:
    """`rematerialize` as `build_plan` runs it for `target`: copies after
    `target.rematerialize_after` operations, of values that fusion would store (a value it
    computes inside each consumer holds no memory across the gap) and that take at least
    `target.rematerialize_min_bytes` (a copy read whole by a GEMM is a kernel of its own).

    >>> import accy
    >>> from accy.lower.target import GPU
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, n=4)], lambda b, a: a[0].exp())
    >>> rematerialize_stored(p, GPU) is p
    True
    """
    decisions = fusion.decide(program, target.recomputes_transcendentals, target.stores_bias_sums)

    def worth(value: int) -> bool:
        large = program.type_of(value).nbytes >= target.rematerialize_min_bytes
        return large and decisions.is_stored(value)

    return rematerialize(
        program, target.rematerialize_after, worth, target.rematerializes_transcendentals
    )


def _repeatable(op: Operation) -> bool:
    return op.kind in RECOMPUTABLE and len(op.results) == 1


def _is_transcendental(op: Operation) -> bool:
    return op.kind == "unary" and op.attrs["op"] not in fusion.LIGHT_UNARY


def _uses(program: Program) -> dict[int, list[int]]:
    """The positions of the operations reading each value, in order; a program output is also
    read after the last operation."""
    uses: dict[int, list[int]] = {}
    for position, op in enumerate(program.operations):
        for value in dict.fromkeys(op.operands):
            uses.setdefault(value, []).append(position)
    end = len(program.operations)
    for value in program.outputs:
        uses.setdefault(value, []).append(end)
    return uses


def clusters(positions: list[int], distance: int) -> list[list[int]]:
    """`positions` (sorted) in runs: a position more than `distance` after the previous one
    starts a new run.

    >>> clusters([3, 5, 40, 41, 90], 10)
    [[3, 5], [40, 41], [90]]
    """
    runs: list[list[int]] = []
    for position in positions:
        if runs and position - runs[-1][-1] <= distance:
            runs[-1].append(position)
        else:
            runs.append([position])
    return runs


class _Chains:
    """Which operations a copy of a value made at some position repeats, given how long each
    value lives once the copies decided so far are made (`alive_until`)."""

    def __init__(
        self,
        program: Program,
        uses: dict[int, list[int]],
        transcendentals: bool,
    ):
        self.program = program
        self.transcendentals = transcendentals
        self._transcendental: dict[tuple[int, int], bool] = {}
        self.producer: dict[int, Operation] = {}
        self.position: dict[int, int] = {}
        for position, op in enumerate(program.operations):
            for value in op.results:
                self.producer[value] = op
                self.position[value] = position
        self.alive_until = {value: positions[-1] for value, positions in uses.items()}

    def is_anchor(self, value: int, at: int, copied_bytes: int) -> bool:
        producer = self.producer[value]
        if producer.kind in ALWAYS_ALIVE:
            return True
        # A GPU computes a transcendental, and the elementwise work on it, again in each step
        # that reads it (fusion's `recompute_transcendentals`): a copy reading such a value
        # repeats the transcendental after all (GELU's tanh(u) + 1, read by its derivative).
        if not self.transcendentals and self.made_of_transcendentals(value, copied_bytes):
            return False
        if self.alive_until.get(value, -1) >= at:
            return True
        return self.program.type_of(value).nbytes * SMALL_FRACTION <= copied_bytes

    def made_of_transcendentals(self, value: int, copied_bytes: int) -> bool:
        """Whether elementwise work within `MAX_CHAIN` operations before `value` (the work
        fusion may compute inline where `value` is read) includes a transcendental over more
        than a small fraction of `copied_bytes` (the rsqrt of a LayerNorm's variances is not)."""
        key = (value, copied_bytes)
        if key not in self._transcendental:
            pending, seen, found = [value], {value}, False
            while pending and not found and len(seen) <= MAX_CHAIN:
                op = self.producer[pending.pop()]
                large = op.type.nbytes * SMALL_FRACTION > copied_bytes
                found = large and _is_transcendental(op)
                if _repeatable(op):
                    fresh = [v for v in op.operands if v not in seen]
                    seen.update(fresh)
                    pending.extend(fresh)
            self._transcendental[key] = found
        return self._transcendental[key]

    def repeatable(self, op: Operation) -> bool:
        return _repeatable(op) and (self.transcendentals or not _is_transcendental(op))

    def chain(self, value: int, at: int) -> list[Operation] | None:
        """The operations (in program order) that recompute `value` at position `at` from
        anchors, or None if that needs more than `MAX_CHAIN` of them or a kind that is not
        `RECOMPUTABLE`."""
        copied_bytes = self.program.type_of(value).nbytes
        found: dict[int, Operation] = {}
        pending = [value]
        while pending:
            current = pending.pop()
            op = self.producer[current]
            if current in found:
                continue
            if not self.repeatable(op) or len(found) >= MAX_CHAIN:
                return None
            found[current] = op
            for operand in op.operands:
                if operand not in found and not self.is_anchor(operand, at, copied_bytes):
                    pending.append(operand)
        return sorted(found.values(), key=lambda op: self.position[op.results[0]])

    def keep_anchors_alive(self, ops: list[Operation], at: int) -> None:
        """The small anchors of a copy at `at` now live until `at` (the others did already)."""
        inside = {op.results[0] for op in ops}
        for op in ops:
            for operand in op.operands:
                if operand not in inside:
                    self.alive_until[operand] = max(self.alive_until.get(operand, -1), at)


def _plan_copies(
    program: Program,
    uses: dict[int, list[int]],
    distance: int,
    worth: Callable[[int], bool],
    transcendentals: bool,
) -> dict[int, list[tuple[list[int], list[Operation]]]]:
    """For each value to copy: its later runs of uses, each with the operations of its copy.

    Values are decided in program order, so that an anchor's lifetime (shortened if it is
    copied itself, lengthened if a copy reads it) is final before any copy relies on it.
    """
    chains = _Chains(program, uses, transcendentals)
    outputs = set(program.outputs)
    cut: dict[int, list[tuple[list[int], list[Operation]]]] = {}
    for op in program.operations:
        if not _repeatable(op) or not transcendentals and _is_transcendental(op):
            continue
        value = op.results[0]
        if value in outputs or value not in uses or not worth(value):
            continue
        runs = clusters(uses[value], distance)
        served: list[tuple[list[int], list[Operation]]] = []
        for later in runs[1:]:
            ops = chains.chain(value, later[0])
            # A run no copy can serve keeps the value alive until it: copies before it are moot.
            served = [] if ops is None else [*served, (later, ops)]
        if not served:
            continue
        kept = runs[: len(runs) - len(served)]
        chains.alive_until[value] = kept[-1][-1]
        for later, ops in served:
            chains.keep_anchors_alive(ops, later[0])
        cut[value] = served
    return cut


class _Rematerialize(Layer):
    """Re-emits the program, emitting each planned copy just before its run's first use and
    giving the run's readers the copy."""

    def __init__(self, next: Any, program: Program, cut: dict[int, list]):
        super().__init__(next)
        self.program = program
        self.index = 0
        self.env: dict[int, Any] = {}  # value -> what the layers below returned for it
        self.starting: dict[int, list[tuple[int, list[Operation]]]] = {}  # position -> copies
        self.reader: dict[tuple[int, int], int] = {}  # (value, reader position) -> run start
        for value, served in cut.items():
            for later, ops in served:
                self.starting.setdefault(later[0], []).append((value, ops))
                for position in later:
                    self.reader[(value, position)] = later[0]
        self.copies: dict[tuple[int, int], Any] = {}  # (value, run start) -> its copy

    def bind(self, op: Operation, args: list[Any]) -> Any:
        position = self.index
        self.index += 1
        for value, ops in sorted(self.starting.get(position, ()), key=lambda c: c[0]):
            self._emit_copy(value, ops, position)
        args = [
            self.copies.get((value, self.reader.get((value, position), -1)), arg)
            for value, arg in zip(op.operands, args, strict=True)
        ]
        result = self.next.bind(op, args)
        if len(op.results) == 1 and not RULES[op.kind].multiple_results:
            self.env[op.results[0]] = result
        else:  # a copy may read any result of a sort, scan or cond
            self.env.update(zip(op.results, result, strict=True))
        return result

    def _emit_copy(self, value: int, ops: list[Operation], at: int) -> None:
        """Emit the operations of `value`'s copy for the run starting at `at` (sharing what an
        earlier copy for the same run computed already)."""
        for op in ops:
            key = (op.results[0], at)
            if key in self.copies:
                continue
            args = [self.copies.get((v, at), self.env[v]) for v in op.operands]
            self.copies[key] = self.next.bind(op, args)


# -- conversions of scanned operands, made a slice at a time ------------------------------------


def convert_inside_scans(program: Program, min_bytes: int = 0) -> Program:
    """`program` with each conversion (of at least `min_bytes`) that only scans read, as an
    operand they slice along their axis (an x), made inside their bodies instead, a slice at
    each step, so that the converted array never exists whole: mixed precision's bf16 copies
    of a stack of f32 layer weights, read by the forward scan and by the backward one (1.8 GB
    of the llama1b step's peak, where each layer's copy is 116 MiB). Each step converts the
    same elements once more, to the same bits.

    >>> import accy
    >>> def layers(b, a):
    ...     ws = a[1].convert(accy.bf16)
    ...     (h,), _ = b.scan(lambda b, v: [(v[0] * v[1].convert(accy.f32))], carries=[a[0]],
    ...                      xs=[ws], axis="layer")
    ...     return h
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, n=4), accy.spec(accy.f32, layer=3, n=4)],
    ...                       layers)
    >>> inside = convert_inside_scans(p)
    >>> [op.kind for op in inside.operations if op.kind != "parameter"]
    ['scan']
    >>> scan = inside.operations[-1]
    >>> str(scan.operand_types[1]), scan.attrs["body"].count("convert")
    ('f32[layer=3, n=4]', 2)
    """
    readers: dict[int, list[tuple[Operation, int]]] = {}
    for op in program.operations:
        for position, value in enumerate(op.operands):
            readers.setdefault(value, []).append((op, position))
    outputs = set(program.outputs)
    inside = {
        op.results[0]: op
        for op in program.operations
        if op.kind == "convert"
        and op.type.nbytes >= min_bytes
        and op.results[0] not in outputs
        and readers.get(op.results[0])
        and all(_scanned(reader, k) for reader, k in readers[op.results[0]])
    }
    if not inside:
        return program
    return eliminate_dead_code(run(program, _ConvertInside(Graph(Builder(program.name)), inside)))


def _scanned(op: Operation, position: int) -> bool:
    """Whether operand `position` of `op` is an x of a scan (sliced along its axis)."""
    return op.kind == "scan" and position >= op.attrs["num_consts"] + op.attrs["num_carry"]


class _ConvertInside(Layer):
    """Re-emits the program, giving the scans that read a conversion in `inside` (value -> its
    convert) the unconverted operand and a body that converts its slice."""

    def __init__(self, next: Any, inside: dict[int, Operation]):
        super().__init__(next)
        self.inside = inside
        self.unconverted: dict[int, Any] = {}  # converted value -> its operand, as re-emitted

    def bind(self, op: Operation, args: list[Any]) -> Any:
        if op.kind == "convert" and op.results[0] in self.inside:
            self.unconverted[op.results[0]] = args[0]
            return self.next.bind(op, args)  # read by nothing now: dead code
        converts = {k: self.inside[v] for k, v in enumerate(op.operands) if v in self.inside}
        if converts:
            args = [self.unconverted.get(v, arg) for v, arg in zip(op.operands, args, strict=True)]
            body = _converting(op.attrs["body"], converts)
            op = dataclasses.replace(op, attrs=op.attrs.replace(body=body))
        return self.next.bind(op, args)


def _converting(body: Program, converts: dict[int, Operation]) -> Program:
    """`body` taking the parameters at the positions of `converts` before their conversion
    (position -> the convert), converting them first."""
    types = list(body.parameter_types)
    for k, convert in converts.items():
        types[k] = types[k].with_dtype(convert.operand_types[0].dtype)

    def converted_first(b, args):
        args = list(args)
        for k, convert in converts.items():
            args[k] = b.emit("convert", [args[k]], convert.attrs)
        env = replay(b, body, args)
        return [env[v] for v in body.outputs]

    return define(body.name, types, converted_first)


__all__ = [
    "RECOMPUTABLE",
    "clusters",
    "convert_inside_scans",
    "rematerialize",
    "rematerialize_stored",
]
