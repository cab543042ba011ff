"""`dot_general` on the GPU: cuBLAS GEMMs for f32 and f64, and for f16/bf16 operands (read as
they are, computed in float32 on tensor cores, written as f32 or rounded once to the operands'
dtype), a kernel for other dtypes and for very short contractions.

The plan lays a contraction out as row-major `C[b] = A[b] @ B[b]` (`accy.lower.contraction`);
cuBLAS is column-major, so the call computes `C^T = B^T A^T`: the operands swap places and keep
their transpose flags. Batches go in one call: strided when every batch is a fixed distance
from the last and all buffers are fixed, otherwise with arrays of pointers in the pool (the
invocation's buffers move between calls, so their addresses cannot be baked into the graph).

A single GEMM goes through pointer arrays only in a loop body, and only when its contraction is
not long for its result: `cublasGemmBatchedEx` does not split long contractions over thread
blocks, so a weight gradient (512 x 512 over a batch of 2048) took
347 us that way on the H200 and 41 us through `cublasGemmEx`. Its operands and result that live
in the invocation's buffers are copied through scratch instead (a few microseconds per
megabyte), which makes every address fixed.

Inside the body of a graph conditional node (a cond's branches, a while_loop's body, a scan
run as a WHILE node) GEMMs are cuBLAS too (`accy.config.cuda_cublas_in_conditionals`, default on;
`ACCY_CUDA_CUBLAS_IN_CONDITIONALS=0` turns it off, and contractions there
are then accy's kernels, as before). cuBLAS takes its arguments when the graph is captured, so
in a WHILE-node scan, whose body's buffers move every iteration, a GEMM reads pointer arrays
that live in the scan's pool region (`StepContext.region`): the scan's step kernel rewrites
them with the body's table, so `cublasGemmBatchedEx` reads the iteration's operands.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from ....codegen.c.dialect import CUDA
from ....codegen.c.expressions import EMITTERS, Body, Index, components, offset_expression
from ....codegen.c.loops import nest
from ....config import config
from ....lower.contraction import Gemm as Layout
from ....lower.contraction import MatrixOperand, loop_indices
from ....lower.gemm_epilogues import BiasEpilogue, GemmEpilogue, gemm_epilogue
from ....lower.plan import BLAS_DTYPES, is_half_gemm
from ....lower.views import row_major
from .. import epilogues
from ..context import StepCode, StepContext, launches, nothing
from ..kernels import (
    LevelPointer,
    axis_names,
    blocks_for,
    compute_bytes,
    decompose,
    grid_stride,
)
from ..schedule import WORKSPACE, Address, Gemm, Level, Schedule
from ..tiles import tile_side, tiled_copy, transposed_axes
from ..vectors import LaneBody
from .common import (
    Staging,
    elementwise_kernel,
    indent,
    moves,
    rounded,
    stage_moving_buffers,
    store,
    store_at,
    stored_result,
)

OP_N, OP_T = 0, 1  # cublasOperation_t
# A contraction this short over a result this large is a few multiply-adds per element of a big
# result: a plain kernel does it at memory speed, while cuBLAS took 35 us for the 2048 x 512
# result of mlp's d.w2^T (k=10) on the H200, as long as for k=512. (Small results are one
# launch either way.)
SHORT_CONTRACTION = 16
LARGE_RESULT = 1 << 16
# cuBLAS GEMMs inside WHILE-node bodies (see the module doc). Off: accy's kernels there. In IF
# bodies (cond branches) accy's kernels always: on the H200 a cond with cuBLAS
# GEMMs of 256 x 256 x 256 or 1 x 1 x 3 failed to instantiate (cudaErrorInvalidValue), while
# the same GEMMs in WHILE bodies ran.
# ... for results of at least this many rows and columns: a 64 x 64 x 64 GEMM in an IF node's
# body instantiated and ran on the H200, a 1 x 1 x 3 dot product there had failed to
# instantiate (cuBLAS picks other kernels for vectors), and matrix-vector products
# in loop bodies are a warp per result element anyway (`_by_warps`).
CONDITIONAL_GEMM_MIN = 16
# The a, b and c of a GEMM whose pointer arrays are in a WHILE-node region: cuBLAS reads the
# arrays, and the addresses of one iteration are not the schedule's to know.
IN_REGION = Address(WORKSPACE, 0)


def _cublas_in_conditional(layout: Layout, inside: str) -> bool:
    """Whether a contraction of this layout inside a conditional node's body of kind `inside`
    ("while" or "if") is cuBLAS."""
    wide = min(layout.m, layout.n) >= CONDITIONAL_GEMM_MIN
    return config.cuda_cublas_in_conditionals and inside == "while" and wide


def _by_cublas(ctx: StepContext) -> bool:
    op = ctx.step.op
    if ctx.inside_conditional and not _cublas_in_conditional(
        ctx.step.detail, ctx.inside_conditional
    ):
        return False
    same = op.type.dtype in BLAS_DTYPES and op.operand_types[0].dtype == op.type.dtype
    if not (same or is_half_gemm(op)):
        return False
    return ctx.step.detail.k > SHORT_CONTRACTION or op.type.size < LARGE_RESULT


def _pack(ctx: StepContext, value: int, matrix: MatrixOperand, name: str) -> tuple[str, int]:
    """A kernel that copies an operand cuBLAS cannot read as it is into scratch, laid out
    batch, rows, columns: tile by tile through shared memory where the copy transposes (the
    source's stride-1 axis is not the packed layout's: `accy.backends.cuda.tiles`), element by
    element in the operand's order otherwise."""
    t = ctx.plan.program.type_of(value)
    pointers = ctx.pointers()
    body = ctx.body(pointers)
    names = axis_names(t, "p")
    storage = CUDA.c_type(t.dtype).storage
    offset = ctx.workspace_scratch(name)
    declaration = f"{storage} *__restrict__ packed = ({storage} *)(ws + {offset});"
    view = ctx.view(value)
    axes = None if view is None else transposed_axes(t.extents, view.strides, matrix.view.strides)
    if axes is not None:
        lines, grid = _tiled_pack(body, value, t, names, axes, matrix)
        side = tile_side(compute_bytes(t.dtype))
        what = f"(pack {name}, {side}x{side} tiles)"
        return ctx.kernel(pointers, [declaration, *lines], what), grid

    def make(body: Body, index: Index, position: str) -> None:
        # Per axis: the packed layout is not the operand's order. The lanes run along the
        # innermost axis, so a pack that keeps it innermost loads and stores 16 bytes at a time.
        x = body.value(value, components(index))
        strides = matrix.view.strides
        if isinstance(body, LaneBody):
            body.lines.append(body.store_element(t.dtype, "packed", index, strides, x))
        else:
            body.lines.append(store(t.dtype, "packed", offset_expression(index, strides), x))

    return elementwise_kernel(ctx, t, make, f"(pack {name})", [declaration])


def _tiled_pack(body, value: int, t, names, axes, matrix: MatrixOperand) -> tuple[list[str], int]:
    """The statements and grid of a pack that transposes, one tile at a time."""

    def load(index: tuple[str, ...]) -> tuple[list[str], str]:
        x = body.value(value, index)
        return body.lines, x

    def store_at(index: tuple[str, ...], x: str) -> str:
        return store(t.dtype, "packed", offset_expression(index, matrix.view.strides), x)

    ctype = CUDA.c_type(t.dtype)
    return tiled_copy(t.extents, names, axes, ctype.compute, compute_bytes(t.dtype), load, store_at)


def _zeros(ctx: StepContext) -> tuple[str, int]:
    op = ctx.step.op
    pointers = ctx.pointers()
    out = pointers[stored_result(ctx)]
    lines = [grid_stride("i", op.type.size), f"  {out}[i] = 0;", "}"]
    return ctx.kernel(pointers, lines, "(zeros)"), blocks_for(op.type.size)


def _batch_offsets(extents: tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
    """Element offset of each batch, in row-major order of the batch axes.

    >>> _batch_offsets((2, 3), (1, 2))
    [0, 2, 4, 1, 3, 5]
    """
    return [
        sum(i * s for i, s in zip(index, strides, strict=True))
        for index in itertools.product(*(range(n) for n in extents))
    ]


def _stride(offsets: list[int]) -> int | None:
    """The common distance between consecutive offsets, or None if there is none.

    >>> _stride([0, 4, 8]), _stride([0, 2, 1]), _stride([0])
    (4, None, 0)
    """
    step = offsets[1] - offsets[0] if len(offsets) > 1 else 0
    return step if all(o == i * step for i, o in enumerate(offsets)) else None


def _operand(
    ctx, level: Level, staging: Staging, value: int, matrix: MatrixOperand, name: str
) -> Address:
    if matrix.packed:
        return Address(WORKSPACE, level.ws + ctx.workspace_scratch(name))
    return staging.address(ctx, level, value)


def _offsets_and_sizes(ctx: StepContext, layout: Layout) -> tuple[list[list[int]], tuple]:
    """Element offsets of each batch of (rhs, lhs, out), cuBLAS's (A, B, C), and their item
    sizes."""
    op = ctx.step.op
    lhs_type, rhs_type = op.operand_types
    sizes = (rhs_type.dtype.itemsize, lhs_type.dtype.itemsize, op.type.dtype.itemsize)
    offsets = [
        _batch_offsets(layout.batch_extents, layout.rhs.batch_strides),
        _batch_offsets(layout.batch_extents, layout.lhs.batch_strides),
        [b * layout.m * layout.n for b in range(math.prod(layout.batch_extents))],
    ]
    return offsets, sizes


def _operand_pointer(ctx: StepContext, value: int, matrix: MatrixOperand, name: str):
    """Where an operand is, as (level pointer, byte offset): its packed copy or its view."""
    if matrix.packed:
        return LevelPointer(False, ctx.workspace_scratch(name)), 0
    return ctx.view_pointer(value)


def _region_arrays(ctx: StepContext, layout: Layout) -> int | None:
    """In a WHILE-node scan's body: the GEMM's pointer arrays as entries derived in the scan's
    region (their index among the derived entries), or None when every buffer is the body's
    workspace (fixed addresses)."""
    op = ctx.step.op
    bases = [
        _operand_pointer(ctx, op.operands[1], layout.rhs, "rhs"),
        _operand_pointer(ctx, op.operands[0], layout.lhs, "lhs"),
        ctx.view_pointer(stored_result(ctx)),
    ]
    if not any(pointer.table for pointer, _ in bases):
        return None
    offsets, sizes = _offsets_and_sizes(ctx, layout)
    columns = zip(bases, offsets, sizes, strict=True)
    entries = [(p, at + o * size) for (p, at), column, size in columns for o in column]
    return ctx.region.derive(entries)


def _shape(ctx: StepContext, layout: Layout, epilogue: GemmEpilogue | None = None) -> Gemm:
    """The single GEMM of `layout`, with `epilogue` if any (fixed addresses; the addresses
    themselves left out)."""
    op = ctx.step.op
    gemm = Gemm(
        dtype=op.operand_types[0].dtype.name,
        out=op.type.dtype.name,
        transa=OP_T if layout.rhs.transposed else OP_N,
        transb=OP_T if layout.lhs.transposed else OP_N,
        m=layout.n,
        n=layout.m,
        k=layout.k,
        a=IN_REGION,
        lda=layout.rhs.leading,
        b=IN_REGION,
        ldb=layout.lhs.leading,
        c=IN_REGION,
        ldc=max(layout.n, 1),
    )
    if epilogue is None:
        return gemm
    bias = None if epilogue.bias is None else IN_REGION
    aux = None if epilogue.aux is None else IN_REGION
    return replace(gemm, epilogue=epilogue.name, bias=bias, aux=aux)


def _fuses(ctx: StepContext, layout: Layout, staged: bool, epilogue: GemmEpilogue) -> bool:
    """Whether cuBLASLt computes the step's epilogue (else kernels do after the GEMM): a single
    GEMM with fixed addresses (`staged`) that cuBLASLt runs on this GPU. The GELU epilogues'
    second matrix (the GELU written, the aux read) is not staged: they stay out of loop bodies
    and off the invocation's buffers (a GELU the caller gets back, an aux it passes in)."""
    if not staged:
        return False
    second = {"gelu_aux_bias": epilogue.result, "dgelu": epilogue.aux}.get(epilogue.name)
    if second is not None and (ctx.in_loop or moves(ctx, ctx.view(second).base)):
        return False
    shape = _shape(ctx, layout, epilogue)
    return epilogues.takes(shape) and epilogues.refusal_here(shape) is None


def _schedule_gemm(
    ctx: StepContext,
    layout: Layout,
    level: Level,
    schedule: Schedule,
    staging: Staging,
    derived: int | None = None,
    fused: GemmEpilogue | None = None,
) -> None:
    """Add the GEMM; `derived`: its pointer arrays are entries of the level's region; `fused`:
    the epilogue cuBLASLt computes (its bias converted into the step's scratch "bias" by
    `_bias_copy`; gelu_aux_bias writes the GELU into its result and the GEMM's own into aux)."""
    op = ctx.step.op
    offsets, sizes = _offsets_and_sizes(ctx, layout)
    strides = [_stride(o) for o in offsets]
    if derived is not None:
        lhs = rhs = out = IN_REGION
        arrays = level.io + ctx.region.start + derived
    else:
        lhs = _operand(ctx, level, staging, op.operands[0], layout.lhs, "lhs")
        rhs = _operand(ctx, level, staging, op.operands[1], layout.rhs, "rhs")
        out = staging.result_address(ctx, level)
        fixed = all(address.fixed for address in (lhs, rhs, out))
        arrays = None
        if not fixed or None in strides:
            bases = zip((rhs, lhs, out), offsets, sizes, strict=True)
            pointers = [base.plus(o * size) for base, column, size in bases for o in column]
            arrays = schedule.table(pointers)
    gemm = replace(
        _shape(ctx, layout),
        a=rhs,
        b=lhs,
        c=out,
        batch=len(offsets[2]),
        stride_a=strides[0] or 0,
        stride_b=strides[1] or 0,
        stride_c=strides[2] or 0,
        arrays=arrays,
    )
    if fused is not None:
        gemm = replace(gemm, epilogue=fused.name)
        if fused.bias is not None:
            bias = Address(WORKSPACE, level.ws + ctx.workspace_scratch("bias"))
            gemm = replace(gemm, bias=bias)
        if fused.name == "gelu_aux_bias":
            gemm = replace(gemm, c=ctx.slot_address(level, fused.result), aux=gemm.c)
        elif fused.aux is not None:
            gemm = replace(gemm, aux=ctx.view_address(level, fused.aux))
    schedule.add(gemm)


def _emit_gemm(ctx: StepContext, layout: Layout) -> StepCode:
    op = ctx.step.op
    count = math.prod(layout.batch_extents)
    if layout.m == 0 or layout.n == 0 or count == 0:
        return nothing
    epilogue = gemm_epilogue(ctx.step, ctx.plan.producers)
    if layout.k == 0:
        return launches(_zeros(ctx), *_unfused_epilogue(ctx, epilogue))
    operands = list(zip(op.operands, (layout.lhs, layout.rhs), ("lhs", "rhs"), strict=True))
    packs = [_pack(ctx, value, matrix, name) for value, matrix, name in operands if matrix.packed]
    # Batched GEMMs read pointer arrays instead (see the module doc), and so do GEMMs in a
    # loop body whose contraction is not long for their result: there the copies would repeat
    # every iteration, of weights that do not change (the RNN's 256 x 256 weight, twice per
    # step), where cublasGemmBatchedEx's missing split-K does not matter.
    unpacked = [value for value, matrix, _ in operands if not matrix.packed]
    long_contraction = layout.k >= 2 * max(layout.m, layout.n)
    staged = count == 1 and (long_contraction or not ctx.in_loop)
    staging = stage_moving_buffers(ctx, unpacked) if staged else Staging()
    # Staged, every address is fixed; otherwise a WHILE-node body's arrays are in its region.
    derived = None if staged or ctx.region is None else _region_arrays(ctx, layout)
    fuses = epilogue is not None and _fuses(ctx, layout, staged, epilogue)
    fused = epilogue if fuses else None
    before = [_bias_copy(ctx, epilogue.bias)] if fused and epilogue.bias is not None else []
    after = [] if fused else _unfused_epilogue(ctx, epilogue)

    def schedule_gemm(level: Level, schedule: Schedule) -> None:
        launches(*packs, *staging.copies_before(ctx, level), *before)(level, schedule)
        _schedule_gemm(ctx, layout, level, schedule, staging, derived, fused)
        launches(*staging.copies_after(ctx, level), *after)(level, schedule)

    return schedule_gemm


def _bias_copy(ctx: StepContext, bias: BiasEpilogue) -> tuple[str, int]:
    """A kernel that writes the bias vector, in the result's dtype, into the step's scratch
    "bias" (cuBLASLt takes it only in that dtype; the plan's is often an f32 master's
    conversion, computed here as the loop would have)."""
    t = ctx.plan.program.type_of(bias.vector)
    storage = CUDA.c_type(t.dtype).storage
    offset = ctx.workspace_scratch("bias")
    declaration = f"{storage} *__restrict__ packed = ({storage} *)(ws + {offset});"
    strides = row_major(t.extents)

    def make(body: Body, index: Index, position: str) -> None:
        x = body.value(bias.vector, components(index))
        if isinstance(body, LaneBody):
            body.lines.append(body.store_element(t.dtype, "packed", index, strides, x))
        else:
            body.lines.append(store(t.dtype, "packed", offset_expression(index, strides), x))

    return elementwise_kernel(ctx, t, make, "(bias for the GEMM)", [declaration])


def _unfused_epilogue(ctx: StepContext, epilogue: GemmEpilogue | None) -> list:
    """The kernels that compute the step's epilogue after its GEMM wrote the product into the
    first loop's result (`stored_result`): each loop's expression, in order."""
    if epilogue is None:
        return []
    loops = zip(ctx.step.epilogue, _EPILOGUE_LOOPS[epilogue.name], strict=True)
    return [_after_gemm(ctx, loop, what) for loop, what in loops]


# What each loop of an epilogue computes (the kernels' comments).
_EPILOGUE_LOOPS = {
    "bias": ("bias added",),
    "gelu_aux_bias": ("bias added", "GELU"),
    "dgelu": ("GELU's derivative applied",),
}


def _after_gemm(ctx: StepContext, loop, what: str) -> tuple[str, int]:
    """A kernel that computes epilogue `loop` (`what` it does), the product read from the
    loop's own result buffer where the loop reads it (in place: the bias added, the GELU's
    derivative multiplied)."""
    op = loop.op
    product = ctx.step.op.results[0]
    result = loop.writes[0]
    t = op.type

    def make(body: Body, index: Index, position: str) -> None:
        if product in loop.reads:
            body.seed(product, index, body.value(result, index))
        x = EMITTERS[op.kind](body, op, index)
        body.lines.append(store_at(body, t.dtype, body.pointers[result], position, x))

    return elementwise_kernel(ctx, t, make, f"({what} after the GEMM)")


def _emit_loops(ctx: StepContext) -> StepCode:
    """dot_general as one thread per result element: for dtypes cuBLAS has no GEMM of, and for
    short contractions into large results."""
    op = ctx.step.op
    if op.type.size == 0:
        return nothing
    result = axis_names(op.type, "r")
    lhs_index, rhs_index, loops = loop_indices(op, result)
    if _by_warps(op, loops):
        return _emit_warp_loops(ctx, result, lhs_index, rhs_index, loops)
    pointers = ctx.pointers()
    body = ctx.body(pointers)
    a = body.value(op.operands[0], lhs_index)
    b = body.value(op.operands[1], rhs_index)
    compute = CUDA.c_type(op.type.dtype).compute
    # Products in the accumulator's type: an f64 `accumulate` of f32 operands multiplies in f64.
    product = f"({compute})({a}) * ({compute})({b})"
    inner = [
        f"{compute} acc = 0;",
        *nest(loops, body.lines + [f"acc = acc + {product};"]),
        store(op.type.dtype, pointers[stored_result(ctx)], "i", rounded(op.type.dtype, "acc")),
    ]
    head = decompose("i", op.type.extents, result)
    lines = [grid_stride("i", op.type.size), *indent(head + inner), "}"]
    return launches((ctx.kernel(pointers, lines), blocks_for(op.type.size)))


# A contraction at least this long into a result this small (a matrix-vector product in a loop
# body: the RNN's 256 x 256 step) is one warp per result element, the lanes splitting the
# contraction and adding their partial sums by shuffles: 256 results were one block of 256
# threads, each walking all 256 products alone, on one SM of 132.
WARP_CONTRACTION = 64
WARP_RESULT = 1 << 14
WARP = 32


def _by_warps(op, loops: list) -> bool:
    k = math.prod(extent for _, extent in loops)
    return k >= WARP_CONTRACTION and op.type.size <= WARP_RESULT


def _emit_warp_loops(ctx: StepContext, result, lhs_index, rhs_index, loops) -> StepCode:
    """dot_general as one warp per result element: lane `l` adds the products `l`, `l + 32`,
    ... of the (flattened) contraction, then the lanes' sums are added by shuffles, in the
    same order every run."""
    op = ctx.step.op
    pointers = ctx.pointers()
    body = ctx.body(pointers)
    a = body.value(op.operands[0], lhs_index)
    b = body.value(op.operands[1], rhs_index)
    compute = CUDA.c_type(op.type.dtype).compute
    product = f"({compute})({a}) * ({compute})({b})"
    names = tuple(name for name, _ in loops)
    k = math.prod(extent for _, extent in loops)
    out = pointers[stored_result(ctx)]
    inner = [
        f"{compute} acc = 0;",
        f"for (int64_t kf = (int64_t)(threadIdx.x % {WARP}); kf < {k}LL; kf += {WARP}) {{",
        *indent(decompose("kf", tuple(n for _, n in loops), names)),
        *indent(body.lines + [f"acc = acc + {product};"]),
        "}",
        f"for (int offset = {WARP // 2}; offset > 0; offset /= 2) {{",
        "  acc = acc + accy_shfl_down(acc, offset);",
        "}",
        f"if (threadIdx.x % {WARP} == 0) {{",
        "  " + store(op.type.dtype, out, "i", rounded(op.type.dtype, "acc")),
        "}",
    ]
    head = decompose("i", op.type.extents, result)
    per_block = 256 // WARP
    lines = [
        grid_stride("i", op.type.size, per_block=per_block, lanes=WARP),
        *indent(head + inner),
        "}",
    ]
    grid = blocks_for(op.type.size, per_block)
    return launches((ctx.kernel(pointers, lines, "(a warp per result)"), grid))


def emit_dot(ctx: StepContext) -> StepCode:
    """cuBLAS for f32, f64 and 16-bit float operands (but short contractions into large
    results), else one thread per result element. An epilogue (bias, GELU, its derivative) is
    cuBLASLt's where it takes the GEMM, else kernels after it."""
    if _by_cublas(ctx):
        return _emit_gemm(ctx, ctx.step.detail)
    code = _emit_loops(ctx)
    kernels = _unfused_epilogue(ctx, gemm_epilogue(ctx.step, ctx.plan.producers))
    if not kernels:
        return code
    after = launches(*kernels)

    def schedule_loops(level: Level, schedule: Schedule) -> None:
        code(level, schedule)
        after(level, schedule)

    return schedule_loops
