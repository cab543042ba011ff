"""dot_general: BLAS GEMMs through function pointers, or plain loops where BLAS cannot serve."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ....codegen.c.dialect import GCC
from ....codegen.c.expressions import linear, offset_expression
from ....codegen.c.loops import IF_PARALLEL, PARALLEL_FOR, SIMD, nest
from ....core.types import TensorType, bf16, f32, f64
from ....lower.contraction import (
    Gemm,
    MatrixOperand,
    gemm_layout,
    loop_indices,
    strided_matrices,
)
from ....lower.plan import BLAS_DTYPES, is_half_gemm
from ..gemm import KERNEL, MIXED_GEMM_SMALLEST_N
from ..loops import axis_index, axis_loops
from .context import CHUNKS, StepContext, store_element

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112
PARALLEL_GEMM_MNK = 1 << 21  # batch * m * n * k from which a GEMM is shared among threads
# (2M multiply-adds take about 45 us on one core of AVX-512, against 5-10 us to wake the
# passively waiting thread: char-gpt's GEMMs, 2M to 8M multiply-adds each, are most of its
# step, which would leave the second core idle)
# A shared GEMM's bands (2 to CHUNKS) each have at least BAND_MNK of work and BAND_ROWS rows (or
# columns): each band's call packs the operand it does not cut once more, so small bands cost
# more in packing than they gain (8 bands of a 256 x 512 x 512 product ran 20% slower than 2 on
# two cores; 8 of 2048 x 512 x 2048, about 10%).
BAND_MNK = 1 << 25
BAND_ROWS = 512
# Bands are handed out one at a time: on a busy machine a thread the kernel has descheduled
# holds up a static share, while the running thread can take its bands (each band writes its
# own rows, so the result is the same whoever computes it).
BANDS_FOR = f"#pragma omp parallel for schedule(dynamic, 1) {IF_PARALLEL}"


def _pack(
    ctx: StepContext, value: int, t: TensorType, matrix: MatrixOperand, name: str, to=None
) -> str:
    """Copy an operand BLAS cannot read as it is into scratch laid out batch, rows, columns
    (converted to dtype `to` on the way: 16-bit floats become float32 once, here)."""
    dtype = to or t.dtype
    pointer = ctx.scratch(GCC.c_type(dtype).storage, name)
    body = ctx.body()
    index = axis_index(t, "p")
    x = body.value(value, index)
    packed_position = offset_expression(index, matrix.view.strides)
    loops = [(f"p{q}", t.extents[q]) for q in matrix.order if t.extents[q] != 1]
    ctx.prologue += nest(loops, body.lines + [store_element(dtype, pointer, packed_position, x)])
    return pointer


def _gemm_operand(ctx, value, t, matrix: MatrixOperand, name) -> tuple[str, int, tuple]:
    if matrix.packed:
        return _pack(ctx, value, t, matrix, name), 0, matrix.batch_strides
    view = ctx.plan.view(value)
    return ctx.pointers[view.base], view.offset, matrix.batch_strides


def _gemm_call(op, gemm: Gemm, m: str, n: str, a: str, b: str, c: str) -> str:
    f32_like = op.type.dtype != f64
    function, one, zero = (
        ("accy_sgemm", "1.0f", "0.0f") if f32_like else ("accy_dgemm", "1.0", "0.0")
    )
    flags = [TRANS if x.transposed else NO_TRANS for x in (gemm.lhs, gemm.rhs)]
    return (
        f"{function}({ROW_MAJOR}, {flags[0]}, {flags[1]}, {m}, {n}, {gemm.k}, {one}, "
        f"{a}, {gemm.lhs.leading}, {b}, {gemm.rhs.leading}, {zero}, {c}, {max(gemm.n, 1)});"
    )


BANDS = r"""
/* A GEMM shared by the threads in `parts` bands of rows (m >= n) or of columns, each band
   written by one call: the one parallel region of every such GEMM in the unit. */
static void accy_{name}_bands(int ta, int tb, int64_t m, int64_t n, int64_t k, const {t} *a,
                              int64_t lda, const {t} *b, int64_t ldb, {t} *c, int64_t parts) {{
  const int64_t extent = m >= n ? m : n;
  #pragma omp parallel for schedule(dynamic, 1) if(accy_shared->parallel)
  for (int64_t part = 0; part < parts; ++part) {{
    const int64_t first = extent * part / parts, last = extent * (part + 1) / parts;
    if (last <= first) continue;
    if (m >= n)
      accy_{name}(101, ta, tb, last - first, n, k, 1, a + (ta == 112 ? first : first * lda), lda,
                  b, ldb, 0, c + first * n, n);
    else
      accy_{name}(101, ta, tb, m, last - first, k, 1, a, lda,
                  b + (tb == 112 ? first * ldb : first), ldb, 0, c + first, n);
  }}
}}"""
MIXED_BANDS = r"""
/* The same for accy_gemm_mixed (operands of 2-byte elements where flags say bf16). */
static void accy_gemm_mixed_bands(int flags, int64_t m, int64_t n, int64_t k, const void *a,
                                  int64_t lda, const void *b, int64_t ldb, float *sums,
                                  uint16_t *rounded, int64_t parts) {
  const int64_t extent = m >= n ? m : n;
  const int64_t a_size = flags & 4 ? 2 : 4, b_size = flags & 8 ? 2 : 4;
  #pragma omp parallel for schedule(dynamic, 1) if(accy_shared->parallel)
  for (int64_t part = 0; part < parts; ++part) {
    const int64_t first = extent * part / parts, last = extent * (part + 1) / parts;
    if (last <= first) continue;
    if (m >= n)
      accy_gemm_mixed(flags, last - first, n, k,
                      (const char *)a + (flags & 1 ? first : first * lda) * a_size, lda, b, ldb,
                      sums + first * n, rounded ? rounded + first * n : rounded, n);
    else
      accy_gemm_mixed(flags, m, last - first, k, a, lda,
                      (const char *)b + (flags & 2 ? first * ldb : first) * b_size, ldb,
                      sums + first, rounded ? rounded + first : rounded, n);
  }
}"""


def _split_gemm(ctx: StepContext, gemm: Gemm, a: str, b: str, c: str, call) -> list[str]:
    """One GEMM shared by the threads as GEMMs over bands of rows (or of columns), through
    a function of the unit's (`BANDS`, `MIXED_BANDS`, declared once: an OpenMP region is a
    function of its own for the compiler, and char-gpt's step has some thirty such GEMMs). How
    many bands depends on the shape alone (`BAND_MNK`, `BAND_ROWS`), never on the thread
    count: BLAS's results may depend on the extents it is given, and must not change with the
    threads available."""
    extent = max(gemm.m, gemm.n)
    parts = min(
        CHUNKS, extent, max(2, min(gemm.m * gemm.n * gemm.k // BAND_MNK, extent // BAND_ROWS))
    )
    shape = f"{gemm.m}, {gemm.n}, {gemm.k}"
    leading = gemm.lhs.leading, gemm.rhs.leading
    if isinstance(call, MixedCall):
        ctx.declare_once(MIXED_BANDS)
        rounded = "(uint16_t *)0" if call.rounded is None else f"(uint16_t *){call.rounded}"
        return [
            f"accy_gemm_mixed_bands({call.flags(ctx.step.op, gemm)}, {shape}, {a}, {leading[0]}, "
            f"{b}, {leading[1]}, (float *){call.sums}, {rounded}, {parts});"
        ]
    name, t = ("sgemm", "float") if ctx.step.op.type.dtype != f64 else ("dgemm", "double")
    ctx.declare_once(BANDS.format(name=name, t=t))
    flags = [TRANS if x.transposed else NO_TRANS for x in (gemm.lhs, gemm.rhs)]
    return [
        f"accy_{name}_bands({flags[0]}, {flags[1]}, {shape}, {a}, {leading[0]}, {b}, "
        f"{leading[1]}, {c}, {parts});"
    ]


def _emit_gemm(ctx: StepContext, gemm: Gemm) -> list[str]:
    """BLAS GEMMs, run with BLAS's own threads off: large work is shared out by OpenMP, one
    thread pool that waits passively, instead of two pools that fight over the cores."""
    op = ctx.step.op
    lhs_type, rhs_type = op.operand_types
    a, a_offset, a_batch = _gemm_operand(ctx, op.operands[0], lhs_type, gemm.lhs, "lhs")
    b, b_offset, b_batch = _gemm_operand(ctx, op.operands[1], rhs_type, gemm.rhs, "rhs")
    out = f"({GCC.c_type(op.type.dtype).storage} *){ctx.pointers[op.results[0]]}"
    return _gemm_calls(ctx, gemm, (a, a_offset, a_batch), (b, b_offset, b_batch), out)


def _emit_half_gemm(ctx: StepContext) -> list[str]:
    """A GEMM of f16/bf16 operands: each operand converted to float32 once, as it is packed
    into scratch, one sgemm, and a 16-bit result rounded once from the float32 product."""
    op = ctx.step.op
    views = [ctx.plan.view(v) for v in op.operands]
    gemm = gemm_layout(op, *views, pack=True)
    lhs_type, rhs_type = op.operand_types
    a = _pack(ctx, op.operands[0], lhs_type, gemm.lhs, "lhs", f32)
    b = _pack(ctx, op.operands[1], rhs_type, gemm.rhs, "rhs", f32)
    out = ctx.pointers[op.results[0]]
    operands = (a, 0, gemm.lhs.batch_strides), (b, 0, gemm.rhs.batch_strides)
    if op.type.dtype == f32:
        return _gemm_calls(ctx, gemm, *operands, out)
    product = ctx.scratch("float", "result")
    calls = _gemm_calls(ctx, gemm, *operands, product)
    size = op.type.size
    rounded = store_element(op.type.dtype, out, "i", f"{product}[i]")
    return [*calls, *nest([("i", size)], [rounded], PARALLEL_FOR if size >= 1 << 16 else None)]


RESULT = "ACCY_RESULT"  # where a mixed GEMM's call puts its result pointer (two of them)


def _uses_mixed_gemm(ctx: StepContext) -> bool:
    """A bf16 (or bf16 and f32) product that accy's GEMM kernel reads and rounds itself: no
    conversion passes before or after it. Narrow products keep the packing path, whose sgemm
    the kernel hands to BLAS."""
    op, gemm = ctx.step.op, ctx.step.detail
    dtypes = {t.dtype for t in op.operand_types} | {op.type.dtype}
    blas = ctx.unit.blas
    return (
        blas is not None
        and blas.sgemm_kernel == KERNEL
        and dtypes <= {bf16, f32}
        and gemm.n >= MIXED_GEMM_SMALLEST_N
    )


@dataclass(frozen=True)
class MixedCall:
    """Writes one `accy_gemm_mixed` call (a call builder of `_gemm_calls`, whose result
    pointer is `RESULT`): the float32 sums go to `sums` (a float32 buffer), or, with `rounded`
    (the bf16 output), are rounded into it, `sums` holding them between passes over k."""

    sums: str
    rounded: str | None

    @staticmethod
    def flags(op, gemm: Gemm) -> int:
        """accy_gemm_mixed's flags: A, B transposed; A, B read as bf16."""
        lhs_type, rhs_type = op.operand_types
        return (
            int(gemm.lhs.transposed)
            | int(gemm.rhs.transposed) << 1
            | int(lhs_type.dtype == bf16 and not gemm.lhs.packed) << 2
            | int(rhs_type.dtype == bf16 and not gemm.rhs.packed) << 3
        )

    def __call__(self, op, gemm: Gemm, m: str, n: str, a: str, b: str, c: str) -> str:
        into = c.replace(RESULT, f"(float *){self.sums}")
        rounded = self.rounded
        out = "(uint16_t *)0" if rounded is None else c.replace(RESULT, f"(uint16_t *){rounded}")
        return (
            f"accy_gemm_mixed({self.flags(op, gemm)}, {m}, {n}, {gemm.k}, {a}, "
            f"{gemm.lhs.leading}, {b}, {gemm.rhs.leading}, {into}, {out}, {max(gemm.n, 1)});"
        )


def _emit_mixed_gemm(ctx: StepContext) -> list[str]:
    """A bf16 product through `accy_gemm_mixed`: bf16 operands read (and converted) as the
    kernel packs them, a bf16 result rounded once from the float32 sums as it is stored."""
    op, gemm = ctx.step.op, ctx.step.detail
    lhs_type, rhs_type = op.operand_types
    operands = []
    for value, t, matrix, name in (
        (op.operands[0], lhs_type, gemm.lhs, "lhs"),
        (op.operands[1], rhs_type, gemm.rhs, "rhs"),
    ):
        if matrix.packed:  # a layout GEMMs cannot read: packed (as float32) first
            operands.append((_pack(ctx, value, t, matrix, name, f32), 0, matrix.batch_strides))
        else:
            view = ctx.plan.view(value)
            operands.append((ctx.pointers[view.base], view.offset, matrix.batch_strides))
    out = ctx.pointers[op.results[0]]
    if op.type.dtype == f32:
        call = MixedCall(out, None)
    else:  # the sums' scratch is touched only where k takes more than one pass
        call = MixedCall(ctx.scratch("float", "result"), out)
    return _gemm_calls(ctx, gemm, *operands, RESULT, call, locked=False)


def _matrix_vector(op, gemm: Gemm, a: str, b: str, out: str) -> list[str]:
    """A product with one row or one column (m or n is 1) as a loop: BLAS's GEMM takes tens of
    microseconds for a 256 x 256 matrix-vector product (a scan step of an RNN), a loop that
    GCC vectorizes a few. Along contiguous memory it is dot products (an OpenMP SIMD sum),
    across it an axpy per element of the vector."""
    ctype = GCC.c_type(op.type.dtype).compute
    a, b, out = f"({a})", f"({b})", f"({out})"

    def element(pointer: str, matrix: MatrixOperand, row: str, column: str) -> str:
        if matrix.transposed:
            row, column = column, row
        return f"{pointer}[(int64_t){row} * {matrix.leading} + {column}]"

    if gemm.n == 1:  # out[i] = sum_k A(i, k) B(k, 0)
        vector, matrix = (lambda k: element(b, gemm.rhs, k, "0")), gemm.lhs
        entry = lambda i, k: element(a, gemm.lhs, i, k)  # noqa: E731
        length = gemm.m
    else:  # out[j] = sum_k A(0, k) B(k, j): the same with B read transposed
        vector, matrix = (lambda k: element(a, gemm.lhs, "0", k)), gemm.rhs
        entry = lambda j, k: element(b, gemm.rhs, k, j)  # noqa: E731
        length = gemm.n
    across = matrix.transposed if gemm.n == 1 else not matrix.transposed
    if across:  # the matrix's rows run along the vector's index: axpy, k outside
        return [
            f"for (int64_t i = 0; i < {length}; ++i) {out}[i] = 0;",
            f"for (int64_t k = 0; k < {gemm.k}; ++k) {{",
            f"  const {ctype} v = {vector('k')};",
            SIMD,
            f"  for (int64_t i = 0; i < {length}; ++i) {out}[i] += v * {entry('i', 'k')};",
            "}",
        ]
    return [
        f"for (int64_t i = 0; i < {length}; ++i) {{",
        f"  {ctype} acc = 0;",
        f"  {SIMD} reduction(+:acc)",
        f"  for (int64_t k = 0; k < {gemm.k}; ++k) acc += {entry('i', 'k')} * {vector('k')};",
        f"  {out}[i] = acc;",
        "}",
    ]


SMALL_PRODUCT_MNK = 1 << 16  # m * n * k of one product of a batch computed by loops
SMALL_PRODUCT_COLUMNS = 256
# A batch of small products (attention's 32 x 32 x 16 scores of 64 heads) as generated loops:
# a BLAS call per product spends microseconds on packing, partial tiles and the call itself,
# several times the arithmetic, where loops of known extents read the operands in place (any
# strides: no packing pass) and keep a block of result rows in registers.
BLOCK_ENTRIES = 256  # result entries summed at once: 16 AVX-512 registers of floats
TILE_ENTRIES = 1 << 14  # the most entries of B's k x n tile (on the thread's stack)
# A batch of small products is shared among threads from fewer multiply-adds than a GEMM:
# without packing, 2^19 of them take about 20 us of a core (attention's 64 heads of 32 x 32 x
# 16, 1M, about 40 us, against 5-10 us to wake a thread).
PARALLEL_SMALL_PRODUCTS_MNK = 1 << 19
SMALL_PRODUCT_DTYPES = frozenset({f32, f64, bf16})


def is_small_batch(gemm: Gemm) -> bool:
    """Whether `gemm`'s products (a batch of them) are small enough for loops.

    >>> from accy.lower.views import StridedView
    >>> side = MatrixOperand(StridedView(0, 0, (1,)), False, (), False, 32, (1024,))
    >>> batched, single = Gemm((64,), 32, 32, 16, side, side), Gemm((), 32, 32, 16, side, side)
    >>> is_small_batch(batched), is_small_batch(single)
    (True, False)
    """
    return (
        bool(gemm.batch_extents)
        and gemm.m * gemm.n * gemm.k <= SMALL_PRODUCT_MNK
        and gemm.n <= SMALL_PRODUCT_COLUMNS
    )


def _small_products(ctx: StepContext) -> list[str] | None:
    """The batch of products of `ctx.step` as a loop calling `_products_kernel` per product, or
    None where an operand's rows or columns do not merge into one strided axis (or B's tile
    would be large)."""
    op, gemm = ctx.step.op, ctx.step.detail
    views = [ctx.plan.view(v) for v in op.operands]
    a, b = strided_matrices(op, *views)
    m, n, k = gemm.m, gemm.n, gemm.k
    if a is None or b is None or (b.column != 1 and k * n > TILE_ENTRIES):
        return None
    dtypes = (*(t.dtype for t in op.operand_types), op.type.dtype)
    name = _products_kernel(ctx, m, n, k, b.column != 1, dtypes)
    a_base, b_base = (ctx.pointers[view.base] for view in views)
    batch = _batch_components(gemm)
    a_at = offset_expression(batch, a.batch_strides, a.offset)
    b_at = offset_expression(batch, b.batch_strides, b.offset)
    call = (
        f"{name}({a_base} + {a_at}, {a.row}, {a.column}, {b_base} + {b_at}, {b.row}, "
        f"{b.column}, {ctx.pointers[op.results[0]]} + batch * {m * n});"
    )
    count = math.prod(gemm.batch_extents)
    large = count > 1 and count * m * n * k >= PARALLEL_SMALL_PRODUCTS_MNK
    return nest([("batch", count)], [call], BANDS_FOR if large else None)


def _products_kernel(ctx: StepContext, m: int, n: int, k: int, tiled: bool, dtypes) -> str:
    """The name of a function, defined once per program for its extents, B's layout and dtypes
    (`Translation.shared_function`: a program's products of one shape share its compile, in one
    part where the program compiles in two), computing one product C = A B (m x n, row-major)
    from A and B with the strides given: blocks of result rows are summed, in order of k, from
    rows of B scaled by A's entries; with `tiled`, B's columns are strided and B is copied to a
    k x n tile first. 16-bit operands are converted as they are loaded; the result is rounded
    once to its dtype. Where the compiler targets AVX-512 the block's rows are named vector
    variables (`_vector_products`), held in registers; elsewhere they are local arrays
    vectorized along the columns (`_looped_products`)."""
    a_type, b_type, result = (GCC.c_type(d) for d in dtypes)
    name = f"accy_products_{m}x{n}x{k}{'_tiled' if tiled else ''}_" + "_".join(
        d.name for d in dtypes
    )
    looped = _looped_products(m, n, k, tiled, dtypes)
    vector = _vector_products(m, n, k, tiled, dtypes)
    if vector is None:
        lines = looped
    else:
        ctx.declare_once(AVX512_VECTORS)
        lines = ["#ifdef __AVX512F__", *vector, "#else", *looped, "#endif"]
    params = (
        f"const {a_type.storage} *restrict A, int64_t ar, int64_t ac, "
        f"const {b_type.storage} *restrict B, int64_t br, int64_t bc, "
        f"{result.storage} *restrict C"
    )
    ctx.unit.shared_function(f"void {name}({params})", lines)
    return name


def _looped_products(m: int, n: int, k: int, tiled: bool, dtypes) -> list[str]:
    """`_products_kernel`'s body with each block's sums in a local array `acc`, its loop over
    the columns vectorized by the compiler (which keeps the array in memory)."""
    a_type, b_type, result = (GCC.c_type(d) for d in dtypes)
    rows = next(r for r in (8, 4, 2, 1) if (m % r == 0 and r * n <= BLOCK_ENTRIES) or r == 1)
    b_entry = b_type.load.format(x="B[p * br + j * bc]")
    lines = []
    if tiled:
        lines += [
            f"{result.compute} tile[{k * n}];",
            f"for (int64_t p = 0; p < {k}; ++p)",
            f"  for (int64_t j = 0; j < {n}; ++j) tile[p * {n} + j] = {b_entry};",
        ]
        b_entry = f"tile[p * {n} + j]"
    else:
        b_entry = b_type.load.format(x="B[p * br + j]")
    a_entry = a_type.load.format(x="A[(i + r) * ar + p * ac]")
    rounded = result.round.format(x="acc[r][j]")
    return lines + [
        f"for (int64_t i = 0; i < {m}; i += {rows}) {{",
        f"  {result.compute} acc[{rows}][{n}];",
        f"  for (int64_t r = 0; r < {rows}; ++r)",
        f"    for (int64_t j = 0; j < {n}; ++j) acc[r][j] = 0;",
        f"  for (int64_t p = 0; p < {k}; ++p) {{",
        f"    #pragma GCC unroll {rows}",
        f"    for (int64_t r = 0; r < {rows}; ++r) {{",
        f"      const {result.compute} x = {a_entry};",
        f"      {SIMD}",
        f"      for (int64_t j = 0; j < {n}; ++j) acc[r][j] += x * {b_entry};",
        "    }",
        "  }",
        f"  for (int64_t r = 0; r < {rows}; ++r)",
        f"    for (int64_t j = 0; j < {n}; ++j) "
        + store_element(dtypes[2], "C", f"(i + r) * {n} + j", rounded),
        "}",
    ]


VECTOR_BYTES = 64  # an AVX-512 register
VECTOR_ACCUMULATORS = 16  # of its 32 registers: the rest hold rows of B and the broadcast
# The AVX-512 vector types of generated steps (the small products here, conv's micro-kernels).
AVX512_VECTORS = """#ifdef __AVX512F__
typedef float accy_vector_float __attribute__((vector_size(64)));
typedef float accy_unaligned_float __attribute__((vector_size(64), aligned(4)));
typedef double accy_vector_double __attribute__((vector_size(64)));
typedef double accy_unaligned_double __attribute__((vector_size(64), aligned(8)));
#endif"""


def _vector_products(m: int, n: int, k: int, tiled: bool, dtypes) -> list[str] | None:
    """`_products_kernel`'s body for AVX-512: each block of `rows` result rows is `rows` x
    `vectors` named vector accumulators (GCC keeps a local array of sums in memory, one load
    and store per multiply-add), each summing products of an entry of A and a vector of B's
    row, multiplied and then added, in order of k, as the scalar loop does (the same bits). B
    is read in place where its rows are contiguous vectors of the accumulator's type, else
    from a tile (converted, its rows padded with zeros to whole vectors); None where the
    accumulators or the tile would not fit."""
    a_type, b_type, result = (GCC.c_type(d) for d in dtypes)
    lanes = VECTOR_BYTES // (8 if result.compute == "double" else 4)
    vectors = -(-n // lanes)
    width = vectors * lanes
    in_place = not tiled and n == width and b_type.storage == result.compute
    if vectors > VECTOR_ACCUMULATORS or (not in_place and k * width > TILE_ENTRIES):
        return None
    rows = next(
        r for r in (8, 4, 2, 1) if (m % r == 0 and r * vectors <= VECTOR_ACCUMULATORS) or r == 1
    )
    vector, unaligned = f"accy_vector_{result.compute}", f"accy_unaligned_{result.compute}"
    lines = []
    if in_place:
        row = "B + p * br"
    else:
        entry = b_type.load.format(x="B[p * br + j * bc]")
        # B's entries read in order of its layout: down its columns where they are strided
        first, then = ("j", n), ("p", k)
        if not tiled:
            first, then = then, first
        lines += [
            f"{result.compute} tile[{k * width}] __attribute__((aligned(64)));",
            f"for (int64_t {first[0]} = 0; {first[0]} < {first[1]}; ++{first[0]})",
            f"  for (int64_t {then[0]} = 0; {then[0]} < {then[1]}; ++{then[0]}) "
            f"tile[p * {width} + j] = {entry};",
        ]
        if width > n:
            lines += [
                f"for (int64_t p = 0; p < {k}; ++p)",
                f"  for (int64_t j = {n}; j < {width}; ++j) tile[p * {width} + j] = 0;",
            ]
        row = f"tile + p * {width}"
    accumulators = [[f"s{r}_{q}" for q in range(vectors)] for r in range(rows)]
    sums = ", ".join(f"{s} = {{0}}" for each in accumulators for s in each)
    lines += [
        f"for (int64_t i = 0; i < {m}; i += {rows}) {{",
        f"  {vector} {sums};",
        f"  for (int64_t p = 0; p < {k}; ++p) {{",
        f"    const {result.compute} *restrict b = {row};",
        *(
            f"    const {vector} b{q} = *(const {unaligned} *)(b + {q * lanes});"
            for q in range(vectors)
        ),
    ]
    for r in range(rows):
        x = a_type.load.format(x=f"A[(i + {r}) * ar + p * ac]")
        lines.append(f"    {{ const {result.compute} x = {x};")
        lines += [f"      {accumulators[r][q]} += x * b{q};" for q in range(vectors)]
        lines.append("    }")
    lines.append("  }")
    if width == n and dtypes[2] in (f32, f64):
        lines += [
            f"  *({unaligned} *)(C + (i + {r}) * {n} + {q * lanes}) = {accumulators[r][q]};"
            for r in range(rows)
            for q in range(vectors)
        ]
    else:  # through a local block: rounded (16-bit results), or the padding left out
        lines.append(f"  {result.compute} block[{rows * width}] __attribute__((aligned(64)));")
        lines += [
            f"  *({vector} *)(block + {r * width + q * lanes}) = {accumulators[r][q]};"
            for r in range(rows)
            for q in range(vectors)
        ]
        rounded = result.round.format(x=f"block[r * {width} + j]")
        lines += [
            f"  for (int64_t r = 0; r < {rows}; ++r)",
            f"    for (int64_t j = 0; j < {n}; ++j) "
            + store_element(dtypes[2], "C", f"(i + r) * {n} + j", rounded),
        ]
    return lines + ["}"]


def _batch_components(gemm: Gemm) -> tuple[str, ...]:
    """Each batch axis's index, from the flat counter `batch` over all of them."""
    return tuple(
        f"(batch / {math.prod(gemm.batch_extents[k + 1 :])}) % {n}"
        for k, n in enumerate(gemm.batch_extents)
    )


def _gemm_calls(
    ctx: StepContext, gemm: Gemm, lhs, rhs, out: str, call=None, locked: bool = True
) -> list[str]:
    """The BLAS calls of `gemm` from operands (pointer, offset, batch strides) into `out`
    (`call` writes one call, `_gemm_call`'s BLAS sgemm/dgemm unless given; `locked`: the calls
    go to the BLAS, whose threads are held to one around them)."""
    op = ctx.step.op
    (a, a_offset, a_batch), (b, b_offset, b_batch) = lhs, rhs
    count = math.prod(gemm.batch_extents)
    if gemm.m == 0 or gemm.n == 0 or count == 0:
        return []
    if gemm.k == 0:
        return [f"memset({out}, 0, {gemm.m * gemm.n * count} * sizeof(*{out}));"]
    large = count * gemm.m * gemm.n * gemm.k >= PARALLEL_GEMM_MNK
    if call is None and 1 in (gemm.m, gemm.n) and not gemm.batch_extents and not large:
        a, b = f"{a} + {a_offset}", f"{b} + {b_offset}"
        return [*ctx.prologue, *_matrix_vector(op, gemm, a, b, out)]
    call = call or _gemm_call
    if not gemm.batch_extents:
        a, b = f"{a} + {a_offset}", f"{b} + {b_offset}"
        calls = (
            _split_gemm(ctx, gemm, a, b, out, call)
            if large
            else [call(op, gemm, str(gemm.m), str(gemm.n), a, b, out)]
        )
    else:
        batch = _batch_components(gemm)
        a_at = offset_expression(batch, a_batch, a_offset)
        b_at = offset_expression(batch, b_batch, b_offset)
        one = call(
            op,
            gemm,
            str(gemm.m),
            str(gemm.n),
            f"{a} + {a_at}",
            f"{b} + {b_at}",
            f"{out} + batch * {gemm.m * gemm.n}",
        )
        calls = nest([("batch", count)], [one], BANDS_FOR if large else None)
    if not locked:
        return [*ctx.prologue, *calls]
    return [
        *ctx.prologue,
        "const int threads = accy_blas_serial();",
        *calls,
        "accy_blas_restore(threads);",
    ]


def _emit_dot_loops(ctx: StepContext) -> list[str]:
    """dot_general as plain loops: for dtypes BLAS lacks, or where no BLAS was found."""
    op = ctx.step.op
    result_index = axis_index(op.type, "r")
    lhs_index, rhs_index, contract_loops = loop_indices(op, result_index)
    body = ctx.body()
    a = body.value(op.operands[0], lhs_index)
    b = body.value(op.operands[1], rhs_index)
    ctype = GCC.c_type(op.type.dtype)
    # Products in the accumulator's type: an f64 `accumulate` of f32 operands multiplies in f64.
    product = f"({ctype.compute})({a}) * ({ctype.compute})({b})"
    inner = nest(contract_loops, body.lines + [f"acc = acc + {product};"])
    store = store_element(
        op.type.dtype,
        ctx.pointers[op.results[0]],
        linear(result_index, op.type.extents),
        ctype.round.format(x="acc"),
    )
    return nest(axis_loops(op.type, "r"), [f"{ctype.compute} acc = 0;"] + inner + [store])


def _fits_blas_integers(gemm: Gemm, bits: int) -> bool:
    sizes = (gemm.m, gemm.n, gemm.k, gemm.lhs.leading, gemm.rhs.leading)
    return max(sizes) < 2 ** (bits - 1)


def emit_dot(ctx: StepContext) -> list[str]:
    """A contraction: BLAS for f32 and f64 where a BLAS was found (and its integers are wide
    enough for the sizes), plain loops otherwise."""
    ctx.value_pointers()
    blas, gemm, op = ctx.unit.blas, ctx.step.detail, ctx.step.op
    dtypes = {t.dtype for t in op.operand_types} | {op.type.dtype}
    if dtypes <= SMALL_PRODUCT_DTYPES and is_small_batch(gemm):
        small = _small_products(ctx)
        if small is not None:
            return small
    if blas is None or not _fits_blas_integers(gemm, blas.integer_bits):
        return _emit_dot_loops(ctx)
    if is_half_gemm(op):
        return _emit_mixed_gemm(ctx) if _uses_mixed_gemm(ctx) else _emit_half_gemm(ctx)
    if op.type.dtype in BLAS_DTYPES and op.operand_types[0].dtype == op.type.dtype:
        return _emit_gemm(ctx, gemm)
    return _emit_dot_loops(ctx)
