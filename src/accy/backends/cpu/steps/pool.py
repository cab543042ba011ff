"""The windowed kinds (`reduce_window`, `select_and_gather_add`, `select_and_scatter_add`) in
one pass, over the geometry of `accy.lower.pooling`.

For each result row (the leading axes, up to the last window axis) and block of lanes (the
contiguous run after it: channels), the window offsets are visited in row-major order, each
combining one input row into the lanes in a vector loop: a sum or extreme (`reduce_window`),
or the first extreme so far with what it selects (the tangent at it, or its position). A
padded offset holds the identity, so it is skipped, except that it counts as the first
candidate of a selection (which then only a greater value, or a NaN, replaces). A scatter then
adds each lane's source element at its selected position; its rows run on several threads only
along leading axes that are no window axis (the windows along those never overlap).
"""

from __future__ import annotations

import math

from ....codegen.c.dialect import GCC
from ....codegen.c.literals import highest, lowest
from ....codegen.c.loops import IF_PARALLEL, SIMD, nest
from ....core.types import dtype_named
from ....lower.pooling import PoolGeometry, needs_accumulator, pool_geometry
from ..loops import PARALLEL_WORK
from .context import StepContext


def _linear(index: list[str], extents: tuple[int, ...]) -> str:
    text = "0"
    for i, n in zip(index, extents, strict=True):
        text = i if text == "0" else f"({text}) * {n} + {i}"
    return text


def _update(g: PoolGeometry, compute: str, load: str, float_: bool) -> list[str]:
    """The lanes' update by one input row (`src`, `aux`: the row of the other operand)."""
    greater = ">" if g.op == "max" else "<"
    nan = " || v != v" if float_ else ""
    if g.kind == "reduce_window":
        if g.op == "sum":
            change = "best[c] += v;"
        else:
            change = f"best[c] = (v {greater} best[c]{nan}) ? v : best[c];"
        return [f"const {compute} v = {load.format(x='src[c]')};", change]
    replaces = f"v {greater} best[c]" + (" || (v != v && best[c] == best[c])" if float_ else "")
    chosen = load.format(x="aux[c]") if g.kind == "select_and_gather_add" else "row + c"
    return [
        f"const {compute} v = {load.format(x='src[c]')};",
        f"const int take = first || {replaces};",
        "best[c] = take ? v : best[c];",
        f"pick[c] = take ? {chosen} : pick[c];",
    ]


def _row(g: PoolGeometry, names: dict[str, str], ctype) -> list[str]:
    """One result row: its blocks of lanes over every window offset, then the stores."""
    compute = ctype.compute
    float_ = dtype_named(g.dtype).is_float
    leading = len(g.extents)
    dtype = dtype_named(g.dtype)
    start = {"sum": "0", "max": lowest(dtype), "min": highest(dtype)}[g.op]
    select = g.kind != "reduce_window"
    pick_type = compute if g.kind == "select_and_gather_add" else "int64_t"
    lines = [
        f"const int64_t n = {g.run} - c0 < {g.lanes} ? {g.run} - c0 : {g.lanes};",
        f"{compute} best[{g.lanes}];",
        f"for (int64_t c = 0; c < n; ++c) best[c] = {start};",
    ]
    if select:
        none = "0" if g.kind == "select_and_gather_add" else "-1"
        lines += [
            f"{pick_type} pick[{g.lanes}];",
            f"for (int64_t c = 0; c < n; ++c) pick[c] = {none};",
            "int first = 1;",
        ]
    index = [f"p{d}" if g.window[d] else f"i{d}" for d in range(leading)]
    inner = [
        f"const int64_t row = ({_linear(index, g.extents)}) * {g.run} + c0;",
        f"const {ctype.storage} *const src = {names['x']} + row;",
    ]
    if g.kind == "select_and_gather_add":
        inner.append(f"const {ctype.storage} *const aux = {names['other']} + row;")
    inner += nest([("c", "n")], _update(g, compute, ctype.load, float_), inner_pragma=SIMD)
    inner = inner + (["first = 0;"] if select else [])
    skip = "{ first = 0; continue; }" if select else "continue;"
    for d in reversed(g.order):
        header = [
            f"const int64_t p{d} = i{d} * {g.stride[d]} + t{d} * {g.dilation[d]} - ({g.low[d]});",
            f"if (p{d} < 0 || p{d} >= {g.extents[d]}) {skip}",
        ]
        inner = nest([(f"t{d}", g.window[d])], header + inner)
    lines += inner
    here = f"({names['row']}) * {g.run} + c0 + c"
    if g.kind == "select_and_scatter_add":
        add = ctype.load.format(x=f"{names['other']}[{here}]")
        lines += nest([("c", "n")], [f"if (pick[c] >= 0) {names['into']}[pick[c]] += {add};"])
    else:
        value = "best[c]" if g.kind == "reduce_window" else "pick[c]"
        store = ctype.store.format(x=value)
        lines += nest([("c", "n")], [f"{names['out']}[{here}] = {store};"], inner_pragma=SIMD)
    step = f"for (int64_t c0 = 0; c0 < {g.run}; c0 += {g.lanes}) {{"
    return [step, *("  " + line for line in lines), "}"]


def emit_pool(ctx: StepContext) -> list[str]:
    """The kept windowed kind's rows (see the module doc)."""
    ctx.value_pointers()
    op = ctx.step.op
    g = pool_geometry(op)
    ctype = GCC.c_type(op.operand_types[-1].dtype)
    views = [ctx.plan.view(v) for v in op.operands]
    operands = [f"({ctx.pointers[v.base]} + {v.offset})" for v in views]
    out = ctx.pointers[op.results[0]]
    names = {"x": operands[-1], "other": operands[0], "out": out, "into": out}
    leading = len(g.extents)
    lines = []
    if g.kind == "select_and_scatter_add":
        size = op.type.size
        if needs_accumulator(op):
            names["into"] = ctx.scratch("float", "accumulator")
        lines.append(f"memset({names['into']}, 0, {size} * sizeof(*{names['into']}));")
        shared = next((d for d in range(leading) if g.window[d]), leading)
    else:
        shared = leading
    names["row"] = _linear([f"i{d}" for d in range(leading)], g.positions)
    loops = [(f"i{d}", g.positions[d]) for d in range(leading)]
    pragma = None
    if g.work >= PARALLEL_WORK and shared > 0 and math.prod(g.positions[:shared]) > 1:
        pragma = f"#pragma omp parallel for collapse({shared}) schedule(static) {IF_PARALLEL}"
    lines += nest(loops, _row(g, names, ctype), pragma)
    if names["into"] != out:  # each 16-bit element rounded once
        store = ctype.store.format(x=f"{names['into']}[j]")
        lines += nest([("j", op.type.size)], [f"{out}[j] = {store};"])
    return lines
