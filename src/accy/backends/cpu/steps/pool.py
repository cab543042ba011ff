"""The windowed kinds (`reduce_window`, `select_and_gather_add`, `select_and_scatter_add`) in
one pass, over the geometry of `accy.lower.pooling`.

For each result row (the leading axes, up to the last window axis) and block of lanes (the
contiguous run after it: channels), the window offsets are visited in row-major order, each
combining one input row into the lanes in a vector loop: a sum or extreme (`reduce_window`),
or the first extreme so far with what it selects (the tangent at it, or its position). The
operands are read where they are needed, so light elementwise work before a pool (a bias and
ReLU) is computed inside its loop. A padded offset holds the identity, so it is skipped, except
that it counts as the first candidate of a selection (which then only a greater value, or a
NaN, replaces). A scatter then adds each lane's source element at its selected position; its
rows run on several threads only along leading axes that are no window axis (the windows along
those never overlap).
"""

from __future__ import annotations

import math

from ....codegen.c.dialect import GCC
from ....codegen.c.literals import highest, lowest
from ....codegen.c.loops import IF_PARALLEL, SIMD, nest
from ....core.types import TensorType, dtype_named
from ....lower.pooling import PoolGeometry, needs_accumulator, pool_geometry
from ..loops import PARALLEL_WORK
from .context import StepContext


def _linear(index: list[str], extents: tuple[int, ...]) -> str:
    text = "0"
    for i, n in zip(index, extents, strict=True):
        text = i if text == "0" else f"({text}) * {n} + {i}"
    return text


def _index(t: TensorType, leading: list[str]) -> tuple[str, ...]:
    """The index of `t` at the leading axes' `leading` and lane `c0 + c` of the run."""
    run = t.extents[len(leading) :]
    lanes, stride = [], math.prod(run)
    for n in run:
        stride //= n
        lane = "(c0 + c)" if stride == 1 else f"((c0 + c) / {stride})"
        lanes.append("0" if n == 1 else lane if len(lanes) == 0 else f"{lane} % {n}")
    return (*leading, *lanes)


def _update(g: PoolGeometry, v: str, aux: str | None, float_: bool) -> list[str]:
    """The lanes' update by the input element `v` (and the tangent `aux` beside it)."""
    greater = ">" if g.op == "max" else "<"
    if g.kind == "reduce_window":
        if g.op == "sum":
            return [f"best[c] += {v};"]
        # The accumulator first: GCC vectorizes this form when `v` is a fused expression.
        nan = " || best[c] != best[c]" if float_ else ""
        return [f"best[c] = (best[c] {greater} {v}{nan}) ? best[c] : {v};"]
    replaces = f"{v} {greater} best[c]"
    if float_:
        replaces += f" || ({v} != {v} && best[c] == best[c])"
    chosen = aux if g.kind == "select_and_gather_add" else "row + c"
    return [
        f"const int take = first || {replaces};",
        f"best[c] = take ? {v} : best[c];",
        f"pick[c] = take ? {chosen} : pick[c];",
    ]


def _window_loops(ctx: StepContext, g: PoolGeometry, x_type: TensorType) -> list[str]:
    """Every window offset (row-major), each updating the row's lanes from one input row."""
    op = ctx.step.op
    select = g.kind != "reduce_window"
    leading = len(g.extents)
    body = ctx.body()
    index = _index(x_type, [f"p{d}" if g.window[d] else f"i{d}" for d in range(leading)])
    v = body.value(op.operands[-1], index)
    aux = body.value(op.operands[0], index) if g.kind == "select_and_gather_add" else None
    element = body.lines + _update(g, v, aux, x_type.dtype.is_float)
    inner = []
    if g.kind == "select_and_scatter_add":
        inner.append(
            f"const int64_t row = ({_linear(list(index[:leading]), g.extents)}) * {g.run} + c0;"
        )
    inner += nest([("c", "n")], element, inner_pragma=SIMD)
    inner += ["first = 0;"] if select else []
    skip = "{ first = 0; continue; }" if select else "continue;"
    for d in reversed(g.order):
        header = [
            f"const int64_t p{d} = i{d} * {g.stride[d]} + k{d} * {g.dilation[d]} - ({g.low[d]});",
            f"if (p{d} < 0 || p{d} >= {g.extents[d]}) {skip}",
        ]
        inner = nest([(f"k{d}", g.window[d])], header + inner)
    return inner


def _row(ctx: StepContext, g: PoolGeometry, into: str) -> list[str]:
    """One result row: its blocks of lanes over every window offset, then the stores."""
    op = ctx.step.op
    x_type = op.operand_types[-1]
    dtype = dtype_named(g.dtype)
    compute = GCC.c_type(dtype).compute
    start = {"sum": "0", "max": lowest(dtype), "min": highest(dtype)}[g.op]
    lines = [
        f"const int64_t n = {g.run} - c0 < {g.lanes} ? {g.run} - c0 : {g.lanes};",
        f"{compute} best[{g.lanes}];",
        f"for (int64_t c = 0; c < n; ++c) best[c] = {start};",
    ]
    if g.kind != "reduce_window":
        gather = g.kind == "select_and_gather_add"
        pick_type = compute if gather else "int64_t"
        lines += [
            f"{pick_type} pick[{g.lanes}];",
            f"for (int64_t c = 0; c < n; ++c) pick[c] = {'0' if gather else '-1'};",
            "int first = 1;",
        ]
    lines += _window_loops(ctx, g, x_type)
    leading = [f"i{d}" for d in range(len(g.extents))]
    here = f"({_linear(leading, g.positions)}) * {g.run} + c0 + c"
    if g.kind == "select_and_scatter_add":
        body = ctx.body()
        source = body.value(op.operands[0], _index(op.operand_types[0], leading))
        add = [*body.lines, f"if (pick[c] >= 0) {into}[pick[c]] += {source};"]
        lines += nest([("c", "n")], add)
    else:
        value = "best[c]" if g.kind == "reduce_window" else "pick[c]"
        store = GCC.c_type(op.type.dtype).store.format(x=value)
        pointer = ctx.pointers[op.results[0]]
        lines += nest([("c", "n")], [f"{pointer}[{here}] = {store};"], inner_pragma=SIMD)
    step = f"for (int64_t c0 = 0; c0 < {g.run}; c0 += {g.lanes}) {{"
    return [step, *("  " + line for line in lines), "}"]


def emit_pool(ctx: StepContext) -> list[str]:
    """The kept windowed kind's rows (see the module doc)."""
    ctx.value_pointers()
    op = ctx.step.op
    g = pool_geometry(op)
    out = ctx.pointers[op.results[0]]
    into = out
    leading = len(g.extents)
    shared = leading  # the leading axes whose rows may run on different threads
    if g.kind == "select_and_scatter_add":
        if needs_accumulator(op):
            into = ctx.scratch("float", "accumulator")
        shared = next((d for d in range(leading) if g.window[d]), leading)
    loops = [(f"i{d}", g.positions[d]) for d in range(leading)]
    pragma = None
    if g.work >= PARALLEL_WORK and shared > 0 and math.prod(g.positions[:shared]) > 1:
        pragma = f"#pragma omp parallel for collapse({shared}) schedule(static) {IF_PARALLEL}"
    if g.kind != "select_and_scatter_add":
        lines = nest(loops, _row(ctx, g, into), pragma)
    else:  # each slice of the outer axes zeroed just before its windows add into it
        size = op.type.size // math.prod(g.positions[:shared])
        start = _linear([f"i{d}" for d in range(shared)], g.positions[:shared])
        zero = f"memset({into} + ({start}) * {size}, 0, {size} * sizeof(*{into}));"
        lines = nest(loops[:shared], [zero, *nest(loops[shared:], _row(ctx, g, into))], pragma)
    if into != out:  # each 16-bit element rounded once
        store = GCC.c_type(op.type.dtype).store.format(x=f"{into}[j]")
        lines += nest([("j", op.type.size)], [f"{out}[j] = {store};"])
    return lines
