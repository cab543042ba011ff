"""Fusion: decide which values are stored in memory and which are computed inside their consumer.

One pass walks the program backwards, so that every consumer of a value is decided before the
value itself. A consumer reads each operand in one of three ways (`Need.mode`):

- `inline`: element by element at the consumer's own index (elementwise work, a reduction's
  input, a gather's indices);
- `expanding`: element by element but more often than the operand has elements (a broadcast, a
  gather that repeats rows, padding), so that computing it inline repeats work;
- `buffer`: as a whole tensor in memory (BLAS, a custom kernel, a scan body).

and in one step (a loop nest, a library call) and phase of that step (a reduction reads its
input in its main loop and its init once). From the needs of a value:

- program outputs and the results of kinds that need their own loop structure (`ROOT_KINDS`)
  are stored;
- a value needed in one step is computed inside that step, unless it is costly (not
  `is_light`) and needed `expanding`;
- a value needed in several steps is stored, unless it is cheap (`CHEAP_KINDS`: index
  arithmetic and loads), in which case each step recomputes it; so is light arithmetic
  (`is_light`: one add, multiply, comparison...) needed in a few steps, element by element:
  writing it and reading it back costs more memory traffic than doing it again;
- on a target whose GEMMs add a bias themselves (`stores_bias_sums`), a GEMM's product plus a
  broadcast bias vector needed in several steps is stored (the GEMM's epilogue writes it,
  `accy.lower.gemm_epilogues`): its readers read one buffer instead of the product and the
  vector each, and GELU's can be GEMM epilogues themselves;
- a value needed as a `buffer` is stored, unless it is a layout operation (`VIEW_KINDS`), which
  is then a strided view of its operand's buffer and passes the need on;
- a value that would be computed `MAX_INLINE_DEPTH` operations deep inside its step's
  expression is stored, and starts a new expression (layout and creation operations, which
  end most chains as broadcast constants, get twice the depth; constants and iotas, which read
  nothing, any depth): a chain of a hundred thousand elementwise operations becomes steps of
  bounded depth, which `grouping` joins into one loop again, and no later pass, each walking an
  expression from its root, nests without bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..core import Operation, Program
from ..core.kinds.elementwise import CHEAP_UNARY
from .gemm_epilogues import is_bias_sum
from .views import VIEW_KINDS

ROOT_KINDS = frozenset(
    {
        "reduce",
        "dot_general",
        "scatter_add",
        "scatter",
        "sort",
        "conv",
        "reduce_window",
        "select_and_gather_add",
        "select_and_scatter_add",
        "custom_call",
        "scan",
        "cond",
    }
    | {"while_loop"}
)
CHEAP_KINDS = VIEW_KINDS | {"constant", "iota", "convert", "gather", "pad", "concatenate"}

LIGHT_KINDS = frozenset({"add", "sub", "mul", "max", "min", "compare", "select", "convert"})
LIGHT_KINDS |= {"and", "or", "xor", "shift_left", "shift_right_logical", "copysign"}
LIGHT_KINDS |= {"shift_right_arithmetic", "bitcast_convert"}
LIGHT_UNARY = CHEAP_UNARY
LIGHT_RECOMPUTE_STEPS = 3  # at most this many steps recompute a light value
# Operations between a step's root and its deepest inline operand. Code generators walk an
# expression recursively; this bounds their depth (a few frames per level) far below Python's
# recursion limit, while a longer fused chain would save little (one load and store per element).
MAX_INLINE_DEPTH = 64

STORED, INLINE, INPUT, DEAD = "stored", "inline", "input", "dead"


def is_light(op: Operation) -> bool:
    """One cheap arithmetic operation per element (no division, power or transcendental)."""
    return op.kind in LIGHT_KINDS or op.kind == "unary" and op.attrs["op"] in LIGHT_UNARY


@dataclass(frozen=True)
class Need:
    """A consumer step (`step`: the index of its root operation), its `phase`, and `mode`."""

    step: int
    phase: str
    mode: str


def _inline(op: Operation) -> list[tuple[str, str]]:
    return [("each", "inline")] * len(op.operands)


def _expanding_if_larger(op: Operation) -> list[tuple[str, str]]:
    return [("each", "expanding" if op.type.size > t.size else "inline") for t in op.operand_types]


def _all_buffers(op: Operation) -> list[tuple[str, str]]:
    return [("call", "buffer")] * len(op.operands)


def _gather(op: Operation) -> list[tuple[str, str]]:
    table = "expanding" if op.type.size > op.operand_types[0].size else "inline"
    return [("each", table), ("each", "inline")]


def _sort(op: Operation) -> list[tuple[str, str]]:
    # The keys are read twice (into the sort's scratch, and as a result); the others once, at
    # the permuted position.
    return [("keys", "expanding")] + [("carried", "inline")] * (len(op.operands) - 1)


def _windowed(op: Operation) -> list[tuple[str, str]]:
    # The windowed kinds read x (and a tangent) once per window that holds an element, a
    # scatter's source once per window.
    x = op.operand_types[-1]
    reduced = op.operand_types[0] if op.kind == "select_and_scatter_add" else op.type
    reads = reduced.size * math.prod(op.attrs["window"])
    mode = "expanding" if reads > x.size else "inline"
    if op.kind == "select_and_scatter_add":
        return [("source", "inline"), ("windows", mode)]
    return [("windows", mode)] * len(op.operands)


def _concatenate(op: Operation) -> list[tuple[str, str]]:
    # Every piece is evaluated (at a clamped index) for every element, then one is selected.
    mode = "expanding" if len(op.operands) > 1 else "inline"
    return [("each", mode)] * len(op.operands)


OPERAND_NEEDS: dict[str, Callable[[Operation], list[tuple[str, str]]]] = {
    "reduce": lambda op: [("input", "inline"), ("init", "inline")],
    "scatter_add": lambda op: [("init", "inline"), ("updates", "inline"), ("updates", "inline")],
    "scatter": lambda op: [("init", "inline"), ("updates", "inline"), ("updates", "inline")],
    "dot_general": _all_buffers,
    "custom_call": _all_buffers,
    "conv": _all_buffers,  # kept whole for a library (cuDNN) or the CPU's kernel: buffers
    "reduce_window": _windowed,  # kept whole for the CPU's one-pass loops
    "select_and_gather_add": _windowed,
    "select_and_scatter_add": _windowed,
    "scan": _all_buffers,
    "cond": _all_buffers,
    "while_loop": _all_buffers,
    "broadcast_in_dim": _expanding_if_larger,
    "pad": _expanding_if_larger,
    "gather": _gather,
    "concatenate": _concatenate,
    "sort": _sort,
}


def operand_needs(op: Operation) -> list[tuple[str, str]]:
    """(phase, mode) for each operand of `op`, in operand order.

    >>> import accy
    >>> p = accy.trace.define("s", [accy.spec(accy.f32, n=3)], lambda b, a: a[0].sum("n"))
    >>> operand_needs(p.operations[-1])
    [('input', 'inline'), ('init', 'inline')]
    """
    return OPERAND_NEEDS.get(op.kind, _inline)(op)


@dataclass
class Fusion:
    """The decisions for one program: `decision[value]` is stored, inline, input or dead."""

    program: Program
    decision: dict[int, str]
    producer: dict[int, Operation]
    position: dict[int, int]

    def is_stored(self, value: int) -> bool:
        return self.decision.get(value) in (STORED, INPUT)

    def store(self, value: int) -> None:
        self.decision[value] = STORED


def decide(
    program: Program, recompute_transcendentals: bool = False, stores_bias_sums: bool = False
) -> Fusion:
    """Walk `program` backwards and decide, for every value, where it lives.
    `recompute_transcendentals`: treat transcendental unaries as light when several steps
    need them element by element; `stores_bias_sums`: store a GEMM's product plus a bias
    that several steps need (`accy.lower.target.Target`).

    >>> import accy
    >>> p = accy.trace.define("f", [accy.spec(accy.f32, n=3)], lambda b, a: a[0].exp().sum("n"))
    >>> [decide(p).decision[v] for v in range(len(p.value_types))]
    ['input', 'inline', 'inline', 'stored']
    """
    producer, position = {}, {}
    for index, op in enumerate(program.operations):
        for value in op.results:
            producer[value] = op
            position[value] = index
    fusion = Fusion(program, {}, producer, position)
    needs: dict[int, set[Need]] = {}
    # depth[v]: the most operations between v and the root of a step that computes it inline.
    depth: dict[int, int] = {}
    outputs = set(program.outputs)

    def kept(op: Operation) -> bool:  # stored where several steps need it, light or not
        return stores_bias_sums and is_bias_sum(op, producer)

    for index in reversed(range(len(program.operations))):
        op = program.operations[index]
        decision = _decide_op(op, index, needs, outputs, recompute_transcendentals, kept)
        own_depth = max((depth.get(v, 0) for v in op.results), default=0)
        if decision == INLINE and op.operands and own_depth >= _depth_limit(op):
            decision = STORED
        for value in op.results:
            fusion.decision[value] = decision
        if decision in (STORED, INLINE):
            _pass_needs(op, index, decision, needs)
            operand_depth = 1 if decision == STORED else own_depth + 1
            for value in op.operands:
                depth[value] = max(depth.get(value, 0), operand_depth)
    return fusion


def _depth_limit(op: Operation) -> int:
    """How deep inside an expression `op` may be computed inline (see the module docstring)."""
    return 2 * MAX_INLINE_DEPTH if op.kind in CHEAP_KINDS else MAX_INLINE_DEPTH


def _decide_op(
    op: Operation,
    index: int,
    needs: dict[int, set[Need]],
    outputs: set[int],
    recompute_transcendentals: bool,
    kept: Callable[[Operation], bool],
) -> str:
    if op.kind == "parameter":
        return INPUT
    wanted = set().union(*(needs.get(v, set()) for v in op.results))
    if any(v in outputs for v in op.results):
        return STORED
    if not wanted:
        return DEAD
    if op.kind in ROOT_KINDS:
        return STORED
    modes = {need.mode for need in wanted}
    steps = {(need.step, need.phase) for need in wanted}
    if "buffer" in modes:
        return INLINE if op.kind in VIEW_KINDS else STORED
    if op.kind in CHEAP_KINDS:
        return INLINE
    if "expanding" in modes and not is_light(op):
        return STORED
    recomputed = is_light(op) or recompute_transcendentals and op.kind == "unary"
    shared = not (recomputed and len(steps) <= LIGHT_RECOMPUTE_STEPS) or kept(op)
    if len(steps) > 1 and shared:
        return STORED
    return INLINE


def _pass_needs(op: Operation, index: int, decision: str, needs: dict[int, set[Need]]) -> None:
    """Record what `op` needs of its operands, in the step(s) where it is computed."""
    own = operand_needs(op)
    if decision == STORED:
        for value, (phase, mode) in zip(op.operands, own, strict=True):
            needs.setdefault(value, set()).add(Need(index, phase, mode))
        return
    for need in needs[op.results[0]]:
        for value, (_, mode) in zip(op.operands, own, strict=True):
            passed = need.mode if need.mode in ("buffer", "expanding") else mode
            needs.setdefault(value, set()).add(Need(need.step, need.phase, passed))
