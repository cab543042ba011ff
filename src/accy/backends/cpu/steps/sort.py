"""sort: per row (every position of the other axes), the keys into scratch, a stable merge
sort of positions by key, then every operand written out in that order.

Runs of 16 are insertion-sorted first, then merged bottom-up between the two index arrays of
scratch (`order`, `spare`); an element moves ahead only when it strictly precedes, so equal
keys keep their order. Rows are independent, so a large sort shares rows among threads; each
row has its own slice of scratch, and the bits do not depend on the thread count.
"""

from __future__ import annotations

import math

from ....codegen.c.dialect import GCC
from ....codegen.c.expressions import linear
from ....codegen.c.loops import PARALLEL_FOR, nest
from ....codegen.c.templates import precedes
from ..loops import axis_loops, worth_threads
from .context import StepContext, store_element

RUN = 16  # insertion-sorted before merging


def merge_sort(before) -> list[str]:
    """C that sorts `order[0..n)` by `k[...]` stably (`before(a, b)`: a C expression saying key
    a sorts strictly before key b), using `spare` as room; `n` is in scope."""
    return [
        "{",
        "  int64_t *src = order, *dst = spare;",
        f"  for (int64_t lo = 0; lo < n; lo += {RUN}) {{",
        f"    const int64_t hi = lo + {RUN} < n ? lo + {RUN} : n;",
        "    for (int64_t a = lo + 1; a < hi; ++a) {",
        "      const int64_t v = src[a];",
        "      int64_t b = a;",
        f"      while (b > lo && {before('k[v]', 'k[src[b - 1]]')}) {{",
        "        src[b] = src[b - 1];",
        "        --b;",
        "      }",
        "      src[b] = v;",
        "    }",
        "  }",
        f"  for (int64_t width = {RUN}; width < n; width *= 2) {{",
        "    for (int64_t lo = 0; lo < n; lo += 2 * width) {",
        "      const int64_t mid = lo + width < n ? lo + width : n;",
        "      const int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;",
        "      int64_t a = lo, b = mid, o = lo;",
        "      while (a < mid && b < hi) {",
        f"        dst[o++] = {before('k[src[b]]', 'k[src[a]]')} ? src[b++] : src[a++];",
        "      }",
        "      while (a < mid) dst[o++] = src[a++];",
        "      while (b < hi) dst[o++] = src[b++];",
        "    }",
        "    int64_t *swap = src;",
        "    src = dst;",
        "    dst = swap;",
        "  }",
        "  if (src != order) {",
        "    for (int64_t j = 0; j < n; ++j) order[j] = src[j];",
        "  }",
        "}",
    ]


def emit_sort(ctx: StepContext) -> list[str]:
    """Sort every row of the keys along the axis and write each operand in that order."""
    ctx.value_pointers()
    op = ctx.step.op
    t = op.operand_types[0]
    if t.size == 0:
        return []
    position = t.position(op.attrs["axis"])
    n = t.extents[position]
    ctype = GCC.c_type(t.dtype)
    keys = ctx.scratch(ctype.compute, "keys")
    order = ctx.scratch("int64_t", "order")
    spare = ctx.scratch("int64_t", "spare")
    others = [p for p in range(t.rank) if p != position]
    names = {p: "0" if t.extents[p] == 1 else f"i{p}" for p in others}

    def index(along: str) -> tuple[str, ...]:
        return tuple(along if p == position else names[p] for p in range(t.rank))

    row = linear(tuple(names[p] for p in others), tuple(t.extents[p] for p in others))
    lines = [
        f"const int64_t n = {n}, row = {row};",
        f"{ctype.compute} *k = {keys} + row * n;",
        f"int64_t *order = {order} + row * n, *spare = {spare} + row * n;",
    ]
    body = ctx.body()
    key = body.value(op.operands[0], index("j"))
    lines += nest([("j", n)], [*body.lines, f"k[j] = {key};", "order[j] = j;"])
    family = ctype.family
    descending = op.attrs["descending"]
    lines += merge_sort(lambda a, b: precedes(family, descending, a, b))
    for result, operand, rt in zip(op.results, op.operands, op.result_types, strict=True):
        body = ctx.body()
        x = body.value(operand, index("s"))
        store = store_element(rt.dtype, ctx.pointers[result], linear(index("j"), t.extents), x)
        lines += nest([("j", n)], ["const int64_t s = order[j];", *body.lines, store])
    work = t.size * max(1, math.ceil(math.log2(max(n, 2))))
    loops = axis_loops(t, "i", others)
    pragma = PARALLEL_FOR if loops and worth_threads(work, ctx.step.fused) else None
    return nest(loops, lines, pragma) if loops else ["{", *lines, "}"]
