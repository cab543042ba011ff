"""conv: the tiled implicit GEMM of `accy.lower.convolution` (patch tiles in cache).

Each part of the tiles (a fixed number, by shape) has its own patch tile in the workspace and
runs its tiles in order: gather the tile's windows (one `memcpy` of the innermost run per row
and window offset, zeros where the window meets padding or an input dilation's hole), then
multiply. In the `rows` form the product is the tile's result rows; in the `columns` form it is
added into the part's partial result, and the partials are summed in part order afterwards.
The elements of paired axes (groups, a vmapped kernel) are convs of their own, run in turn on
their slices.

The multiplication: in f32 (16-bit floats converted as they are gathered) where the compiler
targets AVX-512, register-blocked micro-kernels of our own (`rows`: a block of patch rows times
a band of kernel columns, an accumulator register per row and vector of columns; `columns`: a
block of outputs times a band of patch columns), fused multiply-adds; the AVX2 BLAS this
project's machines run reaches half of that. Otherwise
BLAS GEMMs (f64, or a machine without AVX-512), or plain loops where no BLAS was found. Each
result element is summed in one order, fixed by the shape: the threads never change it.
"""

from __future__ import annotations

from ....codegen.c.dialect import GCC
from ....codegen.c.loops import IF_PARALLEL, PARALLEL_FOR, nest
from ....lower.convolution import VECTOR, ConvGeometry, geometry
from ..loops import PARALLEL_WORK
from .context import StepContext
from .dot import AVX512_VECTORS, NO_TRANS, ROW_MAJOR, TRANS

# Fused multiply-adds in the micro-kernels only (the unit is built with -ffp-contract=off, so
# that elementwise code rounds as the reference does); BLAS fuses them too.
FUSED = '__attribute__((optimize("fp-contract=fast")))'
# Accumulator rows of a micro-kernel by its vectors of columns: 24 of the 32 registers hold
# accumulators, the rest the loaded vectors and the broadcast.
BLOCK_ROWS = {4: 6, 3: 8, 2: 12, 1: 12}
BAND = 4  # vectors of columns per micro-kernel
# Parts are handed out one at a time: a part computes the same whichever thread runs it, and
# on a busy machine a thread that is descheduled holds up only the part it has.
PARALLEL_PARTS = f"#pragma omp parallel for schedule(dynamic, 1) {IF_PARALLEL}"


def _store(pointer: str, acc: str, last: bool, add: str | None) -> list[str]:
    """Store (or, where `add` holds at run time, add) vector `acc` at `pointer`; a `last`
    vector stores only its first `last` lanes."""
    full = f"*(accy_unaligned_float *)({pointer})"
    if not last:
        if add is None:
            return [f"{full} = {acc};"]
        return [f"if ({add}) {full} += {acc}; else {full} = {acc};"]
    lines = [f"if (last == {VECTOR}) {{"]
    lines += ["  " + line for line in _store(pointer, acc, False, add)]
    lines += ["} else {", "  accy_vector_float v = {0};"]
    if add is not None:
        lines.append(f"  if ({add}) memcpy(&v, {pointer}, last * sizeof(float));")
    lines += [f"  v += {acc};", f"  memcpy({pointer}, &v, last * sizeof(float));", "}"]
    return lines


def _micro_kernel(form: str, band: int) -> tuple[str, str, list[str]]:
    """The name, prototype and body of one micro-kernel: `BLOCK_ROWS[band]` accumulator rows
    times `band` vectors, of which the first `rows` (at least one) hold results. A block of
    fewer rows reads its last row again into the others, which are never stored: one kernel
    serves every block, and each result is summed as a kernel of its own rows would.

    rows form: out[r, v] = sum_k p[r * ldp + k] * w[k * ldw + v] over `depth` k.
    columns form: out[r, v] (+)= sum_t g[t * ldg + r] * p[t * ldp + v] over `count` t.
    """
    name = f"accy_conv_{form}_{band}"
    block = range(BLOCK_ROWS[band])
    accs = [[f"a{r}_{j}" for j in range(band)] for r in block]
    declare = "accy_vector_float " + ", ".join(f"{a} = {{0}}" for row in accs for a in row) + ";"
    # Row r of the block reads row `r < rows ? r : rows - 1`, in bounds.
    setup = [f"const int64_t r{r} = {r} < rows ? {r} : rows - 1;" for r in block[1:]]
    row = ["0", *(f"r{r}" for r in block[1:])]
    if form == "rows":
        params = (
            "const float *restrict p, int64_t ldp, const float *restrict w, int64_t ldw, "
            "float *restrict out, int64_t ldo, int64_t depth, int64_t last, int64_t rows"
        )
        setup += [f"const float *restrict p{r} = p + {row[r]} * ldp;" for r in block]
        loop = ["for (int64_t k = 0; k < depth; ++k) {", "  const float *wk = w + k * ldw;"]
        operand = "p{r}[k]"
        add = None
    else:
        params = (
            "const float *restrict g, int64_t ldg, const float *restrict p, int64_t ldp, "
            "float *restrict out, int64_t ldo, int64_t count, int64_t last, int add, "
            "int64_t rows"
        )
        loop = ["for (int64_t t = 0; t < count; ++t) {", "  const float *wk = p + t * ldp;"]
        operand = "g[t * ldg + {row}]"
        add = "add"
    loop += [
        f"  const accy_vector_float w{j} = *(const accy_unaligned_float *)(wk + {j * VECTOR});"
        for j in range(band)
    ]
    for r in block:
        loop.append(f"  {{ const float b = {operand.format(r=r, row=row[r])};")
        loop += [f"    {accs[r][j]} += b * w{j};" for j in range(band)]
        loop.append("  }")
    loop.append("}")
    stores = []
    for r in block:
        stored = []
        for j in range(band):
            pointer = f"out + {r} * ldo + {j * VECTOR}"
            stored += _store(pointer, accs[r][j], j == band - 1, add)
        stores += stored if r == 0 else [f"if ({r} < rows) {{", *stored, "}"]
    return name, f"{FUSED} void {name}({params})", [declare, *setup, *loop, *stores]


def _patch_rows(g: ConvGeometry, dtype, x: str, patches: str) -> list[str]:
    """Fill `patches` (rows `t` of `count`, from row `start`) with the windows of the input,
    converted to the compute type (16-bit floats to f32)."""
    d = len(g.extents)
    ftype = GCC.c_type(dtype).compute
    lines = ["int64_t rest = start + t;"]
    for i in reversed(range(d)):
        lines.append(f"const int64_t r{i} = rest % {g.row_extents[i]}; rest /= {g.row_extents[i]};")
    lines.append(f"{ftype} *dst = {patches} + t * {g.stride};")
    address = "rest"
    for i in range(d):
        address = f"({address}) * {g.extents[i]} + i{i}"
    run = f"{g.inner} * sizeof({ftype})"
    source = f"{x} + (({address}) * {g.inner})"
    if g.half:
        load = GCC.c_type(dtype).load.format(x="src[c]")
        copy = [
            f"if (ok{d - 1}) {{",
            f"  const {GCC.c_type(dtype).storage} *src = {source};",
            f"  for (int64_t c = 0; c < {g.inner}; ++c) dst[c] = {load};",
            "} else {",
            f"  memset(dst, 0, {run});",
            "}",
        ]
    else:
        copy = [f"if (ok{d - 1}) memcpy(dst, {source}, {run});", f"else memset(dst, 0, {run});"]
    inner = [*copy, f"dst += {g.inner};"]
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
    lines += inner
    if g.stride > g.depth:  # the vectors' lanes past the depth multiply as zeros
        lines.append(f"memset(dst, 0, {g.stride - g.depth} * sizeof({ftype}));")
    return lines


def _library_gemm(g: ConvGeometry, blas: bool, ftype: str, a, b, c, beta: str) -> list[str]:
    """The tile's GEMM by BLAS (or loops), operands (pointer, leading dimension): rows form
    c[count, outputs] = a[count, depth] @ b[depth, outputs]; columns form c[outputs, depth] =
    beta * c + a[count, outputs]ᵀ @ b[count, depth]."""
    function = "accy_sgemm" if g.dtype != "f64" else "accy_dgemm"
    (a, lda), (b, ldb), (c, ldc) = ((f"({p})", ld) for p, ld in (a, b, c))
    if g.form == "rows":
        if blas:
            return [
                f"{function}({ROW_MAJOR}, {NO_TRANS}, {NO_TRANS}, count, {g.outputs}, {g.depth}, "
                f"1, {a}, {lda}, {b}, {ldb}, 0, {c}, {ldc});"
            ]
        product = f"{a}[t * {lda} + k] * {b}[k * {ldb} + o]"
        return nest(
            [("t", "count"), ("o", g.outputs)],
            [f"{ftype} acc = 0;", f"for (int64_t k = 0; k < {g.depth}; ++k) acc += {product};"]
            + [f"{c}[t * {ldc} + o] = acc;"],
            bounds={"t": ("0", "count")},
        )
    if blas:
        return [
            f"{function}({ROW_MAJOR}, {TRANS}, {NO_TRANS}, {g.outputs}, {g.depth}, count, "
            f"1, {a}, {lda}, {b}, {ldb}, {beta}, {c}, {ldc});"
        ]
    product = f"{a}[t * {lda} + o] * {b}[t * {ldb} + k]"
    return nest(
        [("o", g.outputs), ("k", g.depth)],
        [
            f"{ftype} acc = ({beta}) ? {c}[o * {ldc} + k] : 0;",
            f"for (int64_t t = 0; t < count; ++t) acc += {product};",
            f"{c}[o * {ldc} + k] = acc;",
        ],
    )


def _bands(columns: int) -> list[tuple[int, int, int]]:
    """(first column, the column after the run, vectors per band) of each run of bands of
    `columns` columns: the whole bands, then the rest."""
    vectors = -(-columns // VECTOR)
    whole = vectors - vectors % BAND
    runs = [(0, whole * VECTOR, BAND)] if whole else []
    if vectors % BAND:
        runs.append((whole * VECTOR, vectors * VECTOR, vectors % BAND))
    return runs


def _banded(ctx, form: str, columns: int, extent: str, call: str) -> list[str]:
    """Loops over the bands of `columns` columns (column `c` first) and blocks of
    `BLOCK_ROWS[band]` rows of `extent` (a C expression), calling the band's micro-kernel on
    each block (`call` formats with `name`, `last`, the lanes of the band's last vector that
    hold columns, and `rows`, the block's rows). Loops, not a copy per band or block size: the
    compiler's time goes as the source."""
    lines = []
    for first, end, band in _bands(columns):
        rows = BLOCK_ROWS[band]
        lanes = f"{columns} - c - {(band - 1) * VECTOR}"
        last = (
            str(VECTOR) if columns % VECTOR == 0 else f"({lanes} < {VECTOR} ? {lanes} : {VECTOR})"
        )
        name, prototype, body = _micro_kernel(form, band)
        ctx.unit.shared_function(prototype, body, "__AVX512F__")
        left = f"{extent} - r0 < {rows} ? {extent} - r0 : {rows}"
        lines += [
            f"for (int64_t c = {first}; c < {end}; c += {band * VECTOR})",
            f"  for (int64_t r0 = 0; r0 < {extent}; r0 += {rows})",
            f"    {call.format(name=name, last=last, rows=left)}",
        ]
    return lines


def _vector_rows(ctx, g: ConvGeometry, weights: str, target: str) -> list[str]:
    """A tile of the rows form in micro-kernels: blocks of patch rows by bands of columns,
    into `target` (the tile's first result row, `outputs` apart)."""
    call = (
        f"{{name}}(mine + r0 * {g.stride}, {g.stride}, {weights} + c, {g.padded_outputs}, "
        f"{target} + r0 * {g.outputs} + c, {g.outputs}, {g.depth}, {{last}}, {{rows}});"
    )
    return _banded(ctx, "rows", g.outputs, "count", call)


def _vector_columns(ctx, g: ConvGeometry, cotangent: str) -> list[str]:
    """A tile of the columns form in micro-kernels: blocks of outputs by bands of columns;
    `cotangent` is the tile's first row of the kernel operand (`outputs` apart)."""
    call = (
        f"{{name}}({cotangent} + r0, {g.outputs}, mine + c, {g.stride}, "
        f"into + r0 * {g.depth} + c, {g.depth}, count, {{last}}, tile > first, {{rows}});"
    )
    return _banded(ctx, "columns", g.depth, str(g.outputs), call)


def _either(vector: list[str], library: list[str]) -> list[str]:
    return ["#ifdef __AVX512F__", *vector, "#else", *library, "#endif"]


def _rows_tile(ctx, g: ConvGeometry, kernel: str, out: str, weights, staged) -> list[str]:
    """The multiplication of a rows-form tile (its patches are `mine`)."""
    blas, dtype = ctx.unit.blas is not None, ctx.step.op.type.dtype
    ftype = GCC.c_type(dtype).compute
    target = "staged_mine" if g.half else f"{out} + start * {g.outputs}"
    b = (weights, g.padded_outputs) if g.half else (kernel, g.outputs)
    library = _library_gemm(g, blas, ftype, ("mine", g.stride), b, (target, g.outputs), "0")
    lines = _either(_vector_rows(ctx, g, weights, target), library) if g.vectorized else library
    if g.half:  # each f32 sum rounded once into the 16-bit result
        store = GCC.c_type(dtype).store.format(x=f"staged_mine[t * {g.outputs} + o]")
        lines += nest(
            [("t", "count"), ("o", g.outputs)],
            [f"{out}[(start + t) * {g.outputs} + o] = {store};"],
            bounds={"t": ("0", "count")},
        )
    return lines


def _columns_tile(ctx, g: ConvGeometry, kernel: str) -> list[str]:
    """The multiplication of a columns-form tile into `into` (its patches are `mine`)."""
    blas, dtype = ctx.unit.blas is not None, ctx.step.op.type.dtype
    ftype = GCC.c_type(dtype).compute
    lines = []
    cotangent = f"({kernel} + start * {g.outputs})"
    if g.half:  # the tile's rows of the cotangent in f32
        load = GCC.c_type(dtype).load.format(x=f"{cotangent}[i]")
        size = f"count * {g.outputs}"
        lines += nest([("i", size)], [f"staged_mine[i] = {load};"], bounds={"i": ("0", size)})
        cotangent = "staged_mine"
    a, b = (cotangent, g.outputs), ("mine", g.stride)
    library = _library_gemm(g, blas, ftype, a, b, ("into", g.depth), "tile > first")
    if g.vectorized:
        return lines + _either(_vector_columns(ctx, g, cotangent), library)
    return lines + library


def _packed_weights(g: ConvGeometry, dtype, kernel: str, weights: str) -> list[str]:
    """The kernel in the compute type, its rows padded with zeros to whole vectors."""
    load = GCC.c_type(dtype).load.format(x=f"{kernel}[k * {g.outputs} + o]")
    pack = nest(
        [("k", g.depth), ("o", g.padded_outputs)],
        [f"{weights}[k * {g.padded_outputs} + o] = o < {g.outputs} ? {load} : 0;"],
    )
    return pack if g.half else ["#ifdef __AVX512F__", *pack, "#endif"]


def emit_conv(ctx: StepContext) -> list[str]:
    """The kept conv's tiles, shared by the threads in `parts` (see the module doc)."""
    ctx.value_pointers()
    op = ctx.step.op
    g = geometry(op)
    dtype = op.type.dtype
    ftype = GCC.c_type(dtype).compute
    x_view, k_view = (ctx.plan.view(v) for v in op.operands)
    storage = GCC.c_type(dtype).storage
    groups = [  # each group's slices of x, the kernel and the result
        (f"const {storage} *const xg", f"{ctx.pointers[x_view.base]} + {x_view.offset}", "x"),
        (f"const {storage} *const kg", f"{ctx.pointers[k_view.base]} + {k_view.offset}", "k"),
        (f"{storage} *const og", ctx.pointers[op.results[0]], "out"),
    ]
    x, kernel, out = "xg", "kg", "og"
    if g.vectorized:
        ctx.declare_once(AVX512_VECTORS)
    patches = ctx.scratch(ftype, "patches")
    partial = ctx.scratch(ftype, "partial") if g.sums_partials else None
    weights = ctx.scratch(ftype, "weights") if g.packs_weights else None
    staged = ctx.scratch(ftype, "staged") if g.half else None
    tile = [
        f"const int64_t start = tile * {g.tile};",
        f"const int64_t count = {g.rows} - start < {g.tile} ? {g.rows} - start : {g.tile};",
        *nest([("t", "count")], _patch_rows(g, dtype, x, "mine"), bounds={"t": ("0", "count")}),
    ]
    if g.form == "rows":
        tile += _rows_tile(ctx, g, kernel, out, weights, staged)
    else:
        tile += _columns_tile(ctx, g, kernel)
    body = [
        f"const int64_t first = {g.tiles} * part / {g.parts};",
        f"const int64_t last = {g.tiles} * (part + 1) / {g.parts};",
        f"{ftype} *const mine = {patches} + part * {g.tile * g.stride};",
    ]
    if staged is not None:
        body.append(f"{ftype} *const staged_mine = {staged} + part * {g.tile * g.outputs};")
    if g.form == "columns":
        into = f"{partial} + part * {g.outputs * g.depth}" if g.sums_partials else out
        body += [
            f"{ftype} *const into = {into};",
            f"if (last == first) memset(into, 0, {g.outputs * g.depth} * sizeof({ftype}));",
        ]
    body += nest([("tile", "last")], tile, bounds={"tile": ("first", "last")})
    lines = nest([("part", g.parts)], body, PARALLEL_PARTS if g.parts > 1 else None)
    if weights is not None:
        lines = [*_packed_weights(g, dtype, kernel, weights), *lines]
    if g.sums_partials:
        size = g.outputs * g.depth
        terms = " + ".join(f"{partial}[{p * size} + j]" for p in range(g.parts))
        total = GCC.c_type(dtype).store.format(x=f"({terms})")
        pragma = PARALLEL_FOR if size >= PARALLEL_WORK else None
        lines += nest([("j", size)], [f"{out}[j] = {total};"], pragma)
    sizes = {"x": op.operand_types[0].size, "k": op.operand_types[1].size, "out": op.type.size}
    slices = [f"{name} = {base} + group * {sizes[of] // g.groups};" for name, base, of in groups]
    lines = nest([("group", g.groups)], [*slices, *lines])
    if ctx.unit.blas is not None:  # BLAS's GEMM sections take turns (the CPU README)
        serial, restore = "const int threads = accy_blas_serial();", "accy_blas_restore(threads);"
        if g.vectorized:  # the micro-kernels call no BLAS
            serial = f"#ifndef __AVX512F__\n{serial}\n#endif"
            restore = f"#ifndef __AVX512F__\n{restore}\n#endif"
        lines = [serial, *lines, restore]
    return lines
