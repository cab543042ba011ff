"""conv: the tiled implicit GEMM of `accy.lower.convolution` (patch tiles in cache, BLAS).

Each part of the tiles (a fixed number, by shape) has its own patch tile in the workspace and
runs its tiles in order: gather the tile's windows (one `memcpy` of the innermost run per row
and window offset, zeros where the window meets padding or an input dilation's hole), then one
GEMM. In the `rows` form the GEMM writes the tile's result rows; in the `columns` form it adds
the tile's product into the part's partial result, and the partials are summed in part order
afterwards. Where no BLAS was found, the GEMMs are plain loops.
"""

from __future__ import annotations

from ....codegen.c.dialect import GCC
from ....codegen.c.loops import PARALLEL_FOR, nest
from ....lower.convolution import ConvGeometry, geometry
from ..loops import PARALLEL_WORK
from .context import StepContext
from .dot import NO_TRANS, ROW_MAJOR, TRANS


def _patch_rows(g: ConvGeometry, ctype: str, x: str, patches: str) -> list[str]:
    """Fill `patches` (rows `t` of `count`, from row `start`) with the windows of the input."""
    d = len(g.extents)
    lines = ["int64_t rest = start + t;"]
    for i in reversed(range(d)):
        lines.append(f"const int64_t r{i} = rest % {g.row_extents[i]}; rest /= {g.row_extents[i]};")
    lines.append(f"{ctype} *dst = {patches} + t * {g.depth};")
    inner: list[str] = []
    address = "rest"
    for i in range(d):
        address = f"({address}) * {g.extents[i]} + i{i}"
    run = f"{g.inner} * sizeof({ctype})"
    inner = [
        f"if (ok{d - 1}) memcpy(dst, {x} + (({address}) * {g.inner}), {run});",
        f"else memset(dst, 0, {run});",
        f"dst += {g.inner};",
    ]
    for i in reversed(range(d)):
        dilated = (g.extents[i] - 1) * g.lhs_dilation[i] + 1
        ld = g.lhs_dilation[i]
        holes = f" && p{i} % {ld} == 0" if ld > 1 else ""
        previous = f"ok{i - 1} && " if i else ""
        header = [
            f"const int64_t p{i} = r{i} * {g.row_step[i]} + q{i} * {g.column_step[i]} - "
            f"({g.low[i]});",
            f"const int ok{i} = {previous}p{i} >= 0 && p{i} < {dilated}{holes};",
            f"const int64_t i{i} = p{i} / {ld};",
        ]
        inner = nest([(f"q{i}", g.column_extents[i])], header + inner)
    return lines + inner


def _gemm(g: ConvGeometry, blas: bool, ctype: str, a: str, b: str, c: str, beta: str) -> list[str]:
    """The tile's GEMM: rows form c[count, outputs] = a[count, depth] @ b[depth, outputs];
    columns form c[outputs, depth] = beta * c + a[count, outputs]ᵀ @ b[count, depth]."""
    function = "accy_sgemm" if g.dtype == "f32" else "accy_dgemm"
    a, b, c = f"({a})", f"({b})", f"({c})"
    if g.form == "rows":
        if blas:
            return [
                f"{function}({ROW_MAJOR}, {NO_TRANS}, {NO_TRANS}, count, {g.outputs}, {g.depth}, "
                f"1, {a}, {g.depth}, {b}, {g.outputs}, 0, {c}, {g.outputs});"
            ]
        product = f"{a}[t * {g.depth} + k] * {b}[k * {g.outputs} + o]"
        return nest(
            [("t", "count"), ("o", g.outputs)],
            [f"{ctype} acc = 0;", f"for (int64_t k = 0; k < {g.depth}; ++k) acc += {product};"]
            + [f"{c}[t * {g.outputs} + o] = acc;"],
            bounds={"t": ("0", "count")},
        )
    if blas:
        return [
            f"{function}({ROW_MAJOR}, {TRANS}, {NO_TRANS}, {g.outputs}, {g.depth}, count, "
            f"1, {a}, {g.outputs}, {b}, {g.depth}, {beta}, {c}, {g.depth});"
        ]
    product = f"{a}[t * {g.outputs} + o] * {b}[t * {g.depth} + k]"
    return nest(
        [("o", g.outputs), ("k", g.depth)],
        [
            f"{ctype} acc = ({beta}) ? {c}[o * {g.depth} + k] : 0;",
            f"for (int64_t t = 0; t < count; ++t) acc += {product};",
            f"{c}[o * {g.depth} + k] = acc;",
        ],
    )


def emit_conv(ctx: StepContext) -> list[str]:
    """The kept conv's tiles, shared by the threads in `parts` (see the module doc)."""
    ctx.value_pointers()
    op = ctx.step.op
    g = geometry(op)
    ctype = GCC.c_type(op.type.dtype).storage
    x_view, k_view = (ctx.plan.view(v) for v in op.operands)
    x = f"({ctx.pointers[x_view.base]} + {x_view.offset})"
    kernel = f"({ctx.pointers[k_view.base]} + {k_view.offset})"
    out = ctx.pointers[op.results[0]]
    blas = ctx.unit.blas is not None
    patches = ctx.scratch(ctype, "patches")
    summed = g.form == "columns" and g.parts > 1
    partial = ctx.scratch(ctype, "partial") if summed else None
    tile = [
        f"const int64_t start = tile * {g.tile};",
        f"const int64_t count = {g.rows} - start < {g.tile} ? {g.rows} - start : {g.tile};",
        *nest([("t", "count")], _patch_rows(g, ctype, x, "mine"), bounds={"t": ("0", "count")}),
    ]
    if g.form == "rows":
        tile += _gemm(g, blas, ctype, "mine", kernel, f"{out} + start * {g.outputs}", "0")
        into = None
    else:
        into = f"{partial} + part * {g.outputs * g.depth}" if summed else out
        a = f"{kernel} + start * {g.outputs}"
        tile += _gemm(g, blas, ctype, a, "mine", "into", "tile > first")
    body = [
        f"const int64_t first = {g.tiles} * part / {g.parts};",
        f"const int64_t last = {g.tiles} * (part + 1) / {g.parts};",
        f"{ctype} *const mine = {patches} + part * {g.tile * g.depth};",
    ]
    if into is not None:
        body += [
            f"{ctype} *const into = {into};",
            f"if (last == first) memset(into, 0, {g.outputs * g.depth} * sizeof({ctype}));",
        ]
    body += nest([("tile", "last")], tile, bounds={"tile": ("first", "last")})
    lines = nest([("part", g.parts)], body, PARALLEL_FOR if g.parts > 1 else None)
    if summed:
        size = g.outputs * g.depth
        terms = " + ".join(f"{partial}[{p * size} + j]" for p in range(g.parts))
        pragma = PARALLEL_FOR if size >= PARALLEL_WORK else None
        lines += nest([("j", size)], [f"{out}[j] = {terms};"], pragma)
    if blas:
        lines = ["const int threads = accy_blas_serial();", *lines, "accy_blas_restore(threads);"]
    return lines
