"""Attention on CUDA in f32: FlashAttention's blocked online softmax in CUDA C (cuDNN's is 16-bit).

cuDNN's fused attention needs bf16/f16, and the composition (GEMMs of the whole scores, then a
softmax over them) reads and writes the tokens × keys scores several times and computes the
masked half of a causal score matrix. These kernels hold a 64 x 64 block of scores at a time
and skip the key blocks a causal mask hides. Every product of two blocks is register-tiled as
a SIMT GEMM is: each thread holds a tile of 8 (or 4) rows by 4 columns and reads its operands
from shared memory as float4, so that each read feeds 8 (or 4) multiply-adds (the previous
kernels, a row per thread or two, fed 4: 0.58 and 1.54 ms at GPT-2's shape):

- forward (`flash_forward`): a thread block owns 64 query rows of one batch entry and walks
  the key blocks: S = Q Kᵀ, the running max and sum per row (as the CPU kernel, `cpu.py`), P
  through shared memory, O += P V. The result is [O | lse] per row.
- backward: `flash_backward_rows` (a warp per query row) writes each row's lse and delta =
  rowsum(dO ∘ O) - dlse to scratch and zeroes its dQ row; `flash_backward_key` (a thread block
  per 64 key rows, walking the query blocks that see them; its two halves split the products)
  recomputes S and P, dP = dO Vᵀ and dS, accumulates dV += Pᵀ dO and dK += dSᵀ Q in
  registers, and adds dQ += dS K into the result with atomic adds (FlashAttention-2's
  backward: five products instead of seven for a separate dQ pass). dQ's bits depend on the
  order of those adds; dK and dV have one writer.

Scores are kept in base 2 (q is scaled by scale · log2(e) when loaded), so that each
probability is one `exp2f`. Every extent and stride is a constant of the generated source (any
layout of the operands is read in place, as in `cpu.py`), which follows the shared CUDA
dialect's prelude; the kernels are compiled with NVRTC (through CuPy) when a program using
them is loaded, and run on the program's stream inside its CUDA graph, as a `LibraryStep`
(dynamic shared memory: 70 and 105 KB a block at dim 64). Declines (the composition runs) for
other dtypes, a bias, a dim extent that is not a multiple of 4 or above 64 (a result row's
dims are held by 16 threads of 4), or empty axes.

Measured on the H200 at GPT-2 small's shape (8 x 12 heads, 1,024 tokens, dim 64, causal;
`tools/flash_attention_f32.py`): forward 0.390 ms, backward 1.051 ms, against PyTorch's SDPA in
f32 (its memory-efficient kernels) 0.490 and 1.202 ms; the composition took 3.2 ms a layer.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends.cuda import binaries
from ..backends.cuda.cudnn import ALIGN
from ..caches import memoized
from ..codegen.c.dialect import CUDA
from ..core.types import TensorType, f32
from ..kernel.call import KernelCall
from .signature import (
    Shape,
    Signature,
    backward_type,
    check,
    element_strides,
    packed_type,
    stride_constants,
)

log = logging.getLogger("accy.attention.flash_cuda")

BLOCK = 64  # query rows and key rows of a block (the tile of scores a thread block holds)
GROUP = BLOCK // 4  # threads that share a row of scores: each holds 4 of its keys
# Rows of each 64 x 64 product a forward thread holds (with 4 columns): 8 (128 threads a
# block) or 4 (256 threads, which read more shared float4 per multiply-add: 0.431 against
# 0.389 ms on the H200 at GPT-2's shape, tools/flash_attention_f32.py).
FORWARD_TILE_ROWS = 8
BACKWARD_THREADS = 256  # two halves of 8 x GROUP threads (see flash_backward_key)
LOG2E = 1.0 / math.log(2.0)
MAX_DIM = 4 * GROUP  # the dims of a result row are held by the GROUP threads of its row group


def threads(part: str) -> int:
    """Threads of a block of kernel `part`.

    >>> threads("forward"), threads("backward")
    (128, 256)
    """
    return (BLOCK // FORWARD_TILE_ROWS) * GROUP if part == "forward" else BACKWARD_THREADS


def padded_row(extent: int) -> int:
    """Floats a shared row of `extent` entries takes: a multiple of 4 (rows are read as float4)
    whose float4 count is odd, so that the float4 reads of 8 consecutive rows (a quarter warp's)
    fall in different banks.

    >>> padded_row(64), padded_row(48), padded_row(36)
    (68, 52, 44)
    """
    return extent + (4 if (extent // 4) % 2 == 0 else 8)


def kernel_factory(
    s: Signature, part: str
) -> Callable[[Sequence[TensorType], TensorType], KernelCall | None]:
    """The CUDA kernel of record `part` ("forward" or "backward") of `s` for f32 operands, or
    None (another kernel or the composition runs)."""

    def factory(operand_types: Sequence[TensorType], result_type: TensorType) -> KernelCall | None:
        return _kernel(s, part, tuple(operand_types), result_type)

    return factory


def decline(s: Signature, types: Sequence[TensorType]) -> str | None:
    """Why these kernels do not take a call, or None if they do.

    >>> from accy import spec
    >>> sig = Signature(("token", "dim"), ("key", "dim"), ("key", "dim"))
    >>> decline(sig, [spec(f32, token=8, dim=64)] + [spec(f32, key=8, dim=64)] * 2) is None
    True
    >>> decline(sig, [spec(f32, token=8, dim=66)] + [spec(f32, key=8, dim=66)] * 2)
    'a dim extent of 66: the kernels need a multiple of 4, at most 64'
    """
    if s.bias is not None:
        return "a bias (its gradient needs the scores)"
    shape = check(s, *types[:3])
    if shape.dtype != f32:
        return f"{shape.dtype.name} operands (these kernels are f32's)"
    if shape.dim % 4 or shape.dim > MAX_DIM:
        return f"a dim extent of {shape.dim}: the kernels need a multiple of 4, at most {MAX_DIM}"
    if shape.tokens == 0 or shape.keys == 0 or shape.batch_size == 0:
        return "an empty axis"
    return None


@memoized("flash attention kernels", "kernels_max_entries")
def _kernel(
    s: Signature, part: str, types: tuple[TensorType, ...], result: TensorType
) -> KernelCall | None:
    why = decline(s, types)
    if why is not None:
        log.info("%s: declined, %s", s.target(part), why)
        return None
    shape = check(s, *types[:3])
    expected = packed_type(s, shape) if part == "forward" else backward_type(s, shape)
    assert result == expected, (result, expected)  # the record's type rule made it
    layout = Layout(s, shape, dict(zip(("q", "k", "v"), types[:3], strict=True)))
    step = FlashAttention(part, layout.source(), layout.launches(part), layout.scratch(part))
    names = ["q", "k", "v"] + (["packed", "dpacked"] if part == "backward" else [])
    parameters = [("dst", result), *zip(names, types, strict=True)]
    digest = hashlib.sha256(step.source.encode()).hexdigest()[:16]
    symbol = f"accy_flash_attention_{part}_{digest}"
    summary = f"[batch={shape.batch_size} s_q={shape.tokens} s_kv={shape.keys} d={shape.dim}]"
    return KernelCall.of_library(
        s.target(part), symbol, parameters, f"flash attention f32 {part} {summary}", step
    )


# -- the generated source ------------------------------------------------------------------------


class Layout:
    """The constants of one call's kernels: extents, strides, shared memory."""

    def __init__(self, s: Signature, shape: Shape, operands: dict[str, TensorType]):
        self.s, self.shape, self.operands = s, shape, operands
        self.row = padded_row(shape.dim)  # a shared row of q, k, v or dO
        self.score_row = padded_row(BLOCK)  # a shared row of P or dS

    def launches(self, part: str) -> tuple[Launch, ...]:
        """The kernels in launch order."""
        batch = self.shape.batch_size
        if part == "forward":
            blocks = -(-self.shape.tokens // BLOCK) * batch
            return (Launch("flash_forward", blocks, threads(part), self.shared_bytes(part)),)
        rows = min(-(-self.shape.tokens * batch // 8), 132 * 16)  # a warp per row
        keys = -(-self.shape.keys // BLOCK) * batch
        return (
            Launch("flash_backward_rows", rows, 256, 0),
            Launch("flash_backward_key", keys, threads(part), self.shared_bytes(part)),
        )

    def shared_bytes(self, part: str) -> int:
        """Dynamic shared memory of a thread block: the forward holds blocks of q, k and v and
        one of P; the backward's key kernel blocks of k, v, q and dO, one of P and one of dS,
        and two floats a query row."""
        rows = BLOCK * self.row, BLOCK * self.score_row
        floats = (
            3 * rows[0] + rows[1] if part == "forward" else 4 * rows[0] + 2 * rows[1] + 2 * BLOCK
        )
        return 4 * floats

    def scratch(self, part: str) -> int:
        """Bytes of scratch: each query row's lse and delta (base 2), for the backward."""
        return 0 if part == "forward" else 2 * 4 * self.shape.batch_size * self.shape.tokens

    def offsets_function(self) -> str:
        """`batch_offsets(b, &oq, &ok, &ov)`: the element offset of batch entry `b` in each
        operand (the batch axes in the query's order, the last varying fastest)."""
        lines = ["long long rest = b;", "*oq = 0; *ok = 0; *ov = 0;"]
        for axis, extent in reversed(self.shape.batch):
            strides = [element_strides(self.operands[n])[axis] for n in ("q", "k", "v")]
            lines.append(
                f"{{ const long long at = rest % {extent}; rest /= {extent}; "
                f"*oq += at * {strides[0]}; *ok += at * {strides[1]}; *ov += at * {strides[2]}; }}"
            )
        body = "\n".join(f"  {line}" for line in lines)
        return (
            "__device__ __forceinline__ void batch_offsets(long long b, long long *oq, "
            f"long long *ok, long long *ov) {{\n{body}\n}}\n"
        )

    def source(self) -> str:
        s, shape = self.s, self.shape
        constants = {
            "NB": f"{shape.batch_size}LL",  # rows = NB * TQ may pass 2^31
            "TQ": shape.tokens,
            "TK": shape.keys,
            "D": shape.dim,
            "BLOCK": BLOCK,
            "GROUP": GROUP,
            "FTR": FORWARD_TILE_ROWS,
            "F_THREADS": threads("forward"),
            "B_THREADS": threads("backward"),
            "SROW": self.row,
            "PROW": self.score_row,
            "CAUSAL": int(s.causal),
            **stride_constants(s, self.operands),
        }
        defines = "".join(f"#define {k} {v}\n" for k, v in constants.items())
        scale = s.scale_for(shape.dim)
        defines += f"#define SCALE {scale!r}f\n#define SCALE2 {scale * LOG2E!r}f\n"
        defines += f"#define UNSCALE2 {1.0 / (scale * LOG2E)!r}f\n#define LOG2E_F {LOG2E!r}f\n"
        return CUDA.prelude + defines + self.offsets_function() + KERNELS


KERNELS = r"""
#define LN2 0.6931471805599453f
#define NQB ((TQ + BLOCK - 1) / BLOCK)
#define F_STEP (BLOCK / FTR) /* rows between a forward thread's rows */
#define FULL 0xffffffffu

/* The max and the sum over the GROUP adjacent lanes that hold one row of scores. Every lane
   of the warp must call them (a shuffle waits for all the lanes it names). */
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int m = 1; m < GROUP; m <<= 1) x = fmaxf(x, __shfl_xor_sync(FULL, x, m));
  return x;
}
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int m = 1; m < GROUP; m <<= 1) x += __shfl_xor_sync(FULL, x, m);
  return x;
}

/* Rows [r0, r0 + BLOCK) of x (element strides xt, xd from `base`) times `scale` into shared
   rows of SROW floats, zeros past `rows`, by a block of T threads. When T is a multiple of D
   each thread copies one column, from one pointer at constant offsets (all loads in flight at
   once). */
template <int T>
__device__ __forceinline__ void load_rows(float *shared, const float *x, long long base, int r0,
                                          int rows, long long xt, long long xd, float scale) {
  if constexpr (T % D == 0) {
    const int d = threadIdx.x % D, first = threadIdx.x / D, step = T / D;
    const float *from = x + base + (long long)(r0 + first) * xt + (long long)d * xd;
    float *to = shared + first * SROW + d;
#pragma unroll
    for (int n = 0; n < BLOCK / step; ++n)
      to[n * step * SROW] = r0 + first + n * step < rows ? from[n * step * xt] * scale : 0.0f;
  } else {
#pragma unroll 1
    for (int e = threadIdx.x; e < BLOCK * D; e += T) {
      const int r = e / D, d = e % D;
      shared[r * SROW + d] =
          r0 + r < rows ? x[base + (long long)(r0 + r) * xt + (long long)d * xd] * scale : 0.0f;
    }
  }
}

/* The three shapes of 64 x 64 product a thread block computes, each thread a TR x 4 tile of
   it in registers. Which entries of the tile a thread holds follows the operands' layout in
   shared memory, so that every read is a float4: a side read along its rows ("rows") holds
   rows r, r + S, ..., r + (TR - 1) S (S = BLOCK / TR; the GROUP threads reading consecutive
   rows hit different banks: padded_row); a side read across its rows ("columns") holds
   adjacent columns. */

/* acc + x . y, as four fused multiply-adds. */
__device__ __forceinline__ float dot4(float acc, float4 x, float4 y) {
  return fmaf(x.w, y.w, fmaf(x.z, y.z, fmaf(x.y, y.y, fmaf(x.x, y.x, acc))));
}

/* acc[e][f] += sum over c < N of a[e S LDA + c] * b[f GROUP LDB + c]. */
template <int TR, int N, int LDA, int LDB>
__device__ __forceinline__ void rows_times_rows(float acc[TR][4], const float *a, const float *b) {
#pragma unroll
  for (int c = 0; c < N; c += 4) {
    float4 x[TR], y[4];
#pragma unroll
    for (int e = 0; e < TR; ++e) x[e] = *(const float4 *)&a[e * (BLOCK / TR) * LDA + c];
#pragma unroll
    for (int f = 0; f < 4; ++f) y[f] = *(const float4 *)&b[f * GROUP * LDB + c];
#pragma unroll
    for (int e = 0; e < TR; ++e)
#pragma unroll
      for (int f = 0; f < 4; ++f) acc[e][f] = dot4(acc[e][f], x[e], y[f]);
  }
}

__device__ __forceinline__ void add_outer(float acc[4], float x, float4 y) {
  acc[0] = fmaf(x, y.x, acc[0]);
  acc[1] = fmaf(x, y.y, acc[1]);
  acc[2] = fmaf(x, y.z, acc[2]);
  acc[3] = fmaf(x, y.w, acc[3]);
}

/* acc[e][f] += sum over c < N of a[e S LDA + c] * b[c LDB + f]. */
template <int TR, int N, int LDA, int LDB>
__device__ __forceinline__ void rows_times_columns(float acc[TR][4], const float *a,
                                                   const float *b) {
#pragma unroll 4 /* fully unrolled, its loads are hoisted and spill */
  for (int c = 0; c < N; c += 4) {
    float4 x[TR];
#pragma unroll
    for (int e = 0; e < TR; ++e) x[e] = *(const float4 *)&a[e * (BLOCK / TR) * LDA + c];
    const float4 y0 = *(const float4 *)&b[c * LDB], y1 = *(const float4 *)&b[(c + 1) * LDB];
    const float4 y2 = *(const float4 *)&b[(c + 2) * LDB], y3 = *(const float4 *)&b[(c + 3) * LDB];
#pragma unroll
    for (int e = 0; e < TR; ++e) {
      add_outer(acc[e], x[e].x, y0);
      add_outer(acc[e], x[e].y, y1);
      add_outer(acc[e], x[e].z, y2);
      add_outer(acc[e], x[e].w, y3);
    }
  }
}

/* acc[e][f] += sum over c < N of a[c LDA + e] * b[c LDB + f]. */
template <int TR, int N, int LDA, int LDB>
__device__ __forceinline__ void columns_times_columns(float acc[TR][4], const float *a,
                                                      const float *b) {
#pragma unroll 16 /* 1.091 against 1.100 ms for 8 */
  for (int c = 0; c < N; ++c) {
    const float4 y = *(const float4 *)&b[c * LDB];
#pragma unroll
    for (int e = 0; e < TR; e += 4) {
      const float4 x = *(const float4 *)&a[c * LDA + e];
      add_outer(acc[e], x.x, y);
      add_outer(acc[e + 1], x.y, y);
      add_outer(acc[e + 2], x.z, y);
      add_outer(acc[e + 3], x.w, y);
    }
  }
}

/* Block order: the longest first (under a causal mask the last query blocks see most keys). */
__device__ __forceinline__ void query_block(int *qb, long long *b) {
  *qb = NQB - 1 - (int)(blockIdx.x / NB);
  *b = blockIdx.x % NB;
}

/* A thread block owns BLOCK query rows of one batch entry; thread (rt, ct) holds the scores of
   rows rt + F_STEP e (e < FTR) against keys ct + GROUP f of each key block, and the output of
   those rows at dims 4 ct ... 4 ct + 3. Scores are in base 2 (q is scaled by SCALE2 when
   loaded). Three blocks an SM: 3 x 128 threads leave each at most 170 registers (168 used at
   dim 64) and 3 x 70 KB of shared memory fit the SM's 228 KB. */
extern "C" __global__ void __launch_bounds__(F_THREADS, 3)
flash_forward(float *__restrict__ dst, const float *__restrict__ q, const float *__restrict__ k,
              const float *__restrict__ v) {
  extern __shared__ float4 shared4[];
  float *qs = (float *)shared4, *ks = qs + BLOCK * SROW, *vs = ks + BLOCK * SROW;
  float *ps = vs + BLOCK * SROW; /* P: [query row][key] */
  int qb;
  long long b, oq, ok, ov;
  query_block(&qb, &b);
  batch_offsets(b, &oq, &ok, &ov);
  const int rt = threadIdx.x / GROUP, ct = threadIdx.x % GROUP;
  load_rows<F_THREADS>(qs, q, oq, qb * BLOCK, TQ, QT, QD, SCALE2);
  float o[FTR][4] = {}, m[FTR], l[FTR];
#pragma unroll
  for (int e = 0; e < FTR; ++e) m[e] = -INFINITY, l[e] = 0.0f;
  const int kend = CAUSAL ? min(TK, (qb + 1) * BLOCK) : TK;
  for (int j0 = 0; j0 < kend; j0 += BLOCK) {
    __syncthreads(); /* the last key block's readers are done with ks, vs and ps */
    load_rows<F_THREADS>(ks, k, ok, j0, TK, KT, KD, 1.0f);
    load_rows<F_THREADS>(vs, v, ov, j0, TK, VT, VD, 1.0f);
    __syncthreads();
    float s[FTR][4] = {};
    rows_times_rows<FTR, D, SROW, SROW>(s, qs + rt * SROW, ks + ct * SROW);
#pragma unroll
    for (int e = 0; e < FTR; ++e) {
      const int i = qb * BLOCK + rt + F_STEP * e;
      float peak = m[e];
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const int j = j0 + ct + GROUP * f;
        if (j >= TK || (CAUSAL && j > i)) s[e][f] = -INFINITY;
        peak = fmaxf(peak, s[e][f]);
      }
      /* Finite: every row sees key 0 in the first block. */
      peak = group_max(peak);
      const float correction = exp2f(m[e] - peak); /* 0 on the first block: m is -inf */
      float total = 0.0f;
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        s[e][f] = exp2f(s[e][f] - peak);
        total += s[e][f];
        ps[(rt + F_STEP * e) * PROW + ct + GROUP * f] = s[e][f];
      }
      l[e] = l[e] * correction + group_sum(total);
      m[e] = peak;
#pragma unroll
      for (int c = 0; c < 4; ++c) o[e][c] *= correction;
    }
    __syncthreads();
    if (4 * ct < D) rows_times_columns<FTR, BLOCK, PROW, SROW>(o, ps + rt * PROW, vs + 4 * ct);
  }
#pragma unroll
  for (int e = 0; e < FTR; ++e) {
    const int i = qb * BLOCK + rt + F_STEP * e;
    if (i >= TQ) break;
    float *out = dst + (b * TQ + i) * (D + 1);
    const float inverse = 1.0f / l[e];
    if (4 * ct < D)
#pragma unroll
      for (int c = 0; c < 4; ++c) out[4 * ct + c] = o[e][c] * inverse;
    if (ct == 0) out[D] = (m[e] + log2f(l[e])) * LN2; /* the natural-log logsumexp */
  }
}

/* Per query row: its base-2 lse and delta = rowsum(dO * O) - dlse into `stats`, and its dQ
   row zeroed (the key kernel adds into it). One warp per row. */
extern "C" __global__ void __launch_bounds__(256)
flash_backward_rows(float *__restrict__ dst, const float *__restrict__ q,
                    const float *__restrict__ k, const float *__restrict__ v,
                    const float *__restrict__ packed, const float *__restrict__ dpacked,
                    float *__restrict__ stats) {
  const int lane = threadIdx.x % 32;
  const long long warps = (long long)gridDim.x * (256 / 32);
  for (long long w = blockIdx.x * (256 / 32) + threadIdx.x / 32; w < NB * TQ; w += warps) {
    const long long b = w / TQ, i = w % TQ, at = w * (D + 1);
    float dot = 0.0f;
    for (int d = lane; d < D; d += 32) dot += dpacked[at + d] * packed[at + d];
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) dot += __shfl_xor_sync(FULL, dot, m);
    if (lane == 0) {
      stats[2 * w] = packed[at + D] * LOG2E_F;
      stats[2 * w + 1] = dot - dpacked[at + D];
    }
    float *dq = dst + b * (TQ + 2 * TK) * D + i * D;
    for (int d = lane; d < D; d += 32) dq[d] = 0.0f;
  }
}

/* dK and dV of a key block, from the query blocks that see it, and its share of their dQ
   (FlashAttention-2's backward), the products split between the block's two halves of 128
   threads with tiles of 8 rows. For each query block the first half computes S = Q Kᵀ (rows
   rt + 8 e, keys ct + GROUP f) and stores P = exp2(S - lse), the second dP = dO Vᵀ and stores
   dP - delta; all threads make dS = P (dP - delta) SCALE in place; then the first half adds
   Pᵀ dO into dV, the second dSᵀ Q into dK (keys 8 rt.., dims 4 ct..: one accumulator array
   whose meaning is the half's, so a thread holds one of them), and all threads add dQ += dS K
   (tiles of 4 rows: rq + 16 e) into dQ in global memory (an atomic add: several key blocks
   add to one dQ row, in no fixed order, so dQ's bits depend on that order; dK and dV have one
   writer). 1.051 against 1.095 ms on the H200 for every thread computing every product with
   tiles of 4 rows (8-row tiles that way need 255 registers: 1.180). */
extern "C" __global__ void __launch_bounds__(B_THREADS, 2)
flash_backward_key(float *__restrict__ dst, const float *__restrict__ q,
                     const float *__restrict__ k, const float *__restrict__ v,
                     const float *__restrict__ packed, const float *__restrict__ dpacked,
                     const float *__restrict__ stats) {
  extern __shared__ float4 shared4[];
  float *ks = (float *)shared4, *vs = ks + BLOCK * SROW, *qs = vs + BLOCK * SROW;
  float *dos = qs + BLOCK * SROW, *ps = dos + BLOCK * SROW; /* P: [query row][key] */
  float *dss = ps + BLOCK * PROW; /* dP - delta, then dS * SCALE: [query row][key] */
  float *lse2s = dss + BLOCK * PROW, *deltas = lse2s + BLOCK;
  const int kb = (int)(blockIdx.x / NB); /* the first key blocks see the most queries */
  const long long b = blockIdx.x % NB;
  long long oq, ok, ov;
  batch_offsets(b, &oq, &ok, &ov);
  const bool second = threadIdx.x >= B_THREADS / 2; /* a whole warp is in one half */
  const int t = threadIdx.x % (B_THREADS / 2), rt = t / GROUP, ct = t % GROUP;
  const int rq = threadIdx.x / GROUP; /* dQ's rows: rq + 16 e */
  const bool dims = 4 * ct < D;      /* this thread holds dims of dK or dV, and of dQ */
  load_rows<B_THREADS>(ks, k, ok, kb * BLOCK, TK, KT, KD, 1.0f);
  load_rows<B_THREADS>(vs, v, ov, kb * BLOCK, TK, VT, VD, 1.0f);
  float kv[8][4] = {}; /* dV in the first half, dK (times SCALE2) in the second */
  float *dq = dst + b * (TQ + 2 * TK) * D;
  const long long rows = b * TQ;
  /* Under a causal mask the query blocks before this key block see none of its keys. */
  for (int i0 = CAUSAL ? kb * BLOCK : 0; i0 < TQ; i0 += BLOCK) {
    __syncthreads(); /* the last query block's readers are done */
    load_rows<B_THREADS>(qs, q, oq, i0, TQ, QT, QD, SCALE2);
    load_rows<B_THREADS>(dos, dpacked, rows * (D + 1), i0, TQ, D + 1, 1, 1.0f); /* dO */
    for (int r = threadIdx.x; r < BLOCK; r += B_THREADS) {
      const bool in = i0 + r < TQ;
      lse2s[r] = in ? stats[2 * (rows + i0 + r)] : INFINITY; /* P = 0 past the end */
      deltas[r] = in ? stats[2 * (rows + i0 + r) + 1] : 0.0f;
    }
    __syncthreads();
    {
      float sd[8][4] = {}; /* S in the first half, dP in the second */
      rows_times_rows<8, D, SROW, SROW>(sd, (second ? dos : qs) + rt * SROW,
                                        (second ? vs : ks) + ct * SROW);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int r = rt + 8 * e;
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const int j = kb * BLOCK + ct + GROUP * f, at = r * PROW + ct + GROUP * f;
          if (second) {
            dss[at] = sd[e][f] - deltas[r];
          } else {
            const bool masked = j >= TK || (CAUSAL && j > i0 + r);
            ps[at] = masked ? 0.0f : exp2f(sd[e][f] - lse2s[r]);
          }
        }
      }
    }
    __syncthreads();
#pragma unroll 4
    for (int n = threadIdx.x; n < BLOCK * BLOCK; n += B_THREADS) {
      const int at = (n / BLOCK) * PROW + n % BLOCK;
      dss[at] *= ps[at] * SCALE;
    }
    __syncthreads();
    if (dims) {
      columns_times_columns<8, BLOCK, PROW, SROW>(kv, (second ? dss : ps) + 8 * rt,
                                                  (second ? qs : dos) + 4 * ct);
      float acc[4][4] = {};
      rows_times_columns<4, BLOCK, PROW, SROW>(acc, dss + rq * PROW, ks + 4 * ct);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i0 + rq + GROUP * e;
        if (i >= TQ) break;
#pragma unroll
        for (int c = 0; c < 4; ++c) atomicAdd(dq + (long long)i * D + 4 * ct + c, acc[e][c]);
      }
    }
  }
  if (!dims) return;
  float *out = dst + b * (TQ + 2 * TK) * D + (long long)(second ? TQ : TQ + TK) * D;
  const float factor = second ? UNSCALE2 : 1.0f; /* dK: Q was scaled by SCALE2 */
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int j = kb * BLOCK + 8 * rt + e;
    if (j >= TK) break;
#pragma unroll
    for (int c = 0; c < 4; ++c) out[(long long)j * D + 4 * ct + c] = kv[e][c] * factor;
  }
}
"""


# -- the library step ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One kernel launch: its name, thread blocks, threads a block, dynamic shared bytes."""

    kernel: str
    blocks: int
    threads: int
    shared_bytes: int


@dataclass(frozen=True)
class FlashAttention:
    """The `LibraryStep` of one call's kernels: their source, launches and scratch."""

    part: str
    source: str
    launch: tuple[Launch, ...]  # in order
    stats_bytes: int

    @property
    def scratch_bytes(self) -> int:
        return self.stats_bytes + ALIGN if self.stats_bytes else 0

    def load(self, ordinal: int) -> Issuer:
        """The issuer on GPU `ordinal`, its kernels compiled (NVRTC) now, outside any capture."""
        return Issuer(self, _module(self.source, ordinal))


@memoized("flash attention modules", "kernels_max_entries")
def _module(source: str, ordinal: int) -> Any:
    import cupy

    with cupy.cuda.Device(ordinal):
        return binaries.module(source, ("-std=c++17",), ordinal)


class Issuer:
    """Launches one call's kernels on the current stream (see `accy.kernel.call.LibraryStep`)."""

    def __init__(self, step: FlashAttention, module: Any):
        self.step = step
        self.kernels = []
        for launch in step.launch:
            kernel = module.get_function(launch.kernel)
            # Above 48 KB a block's dynamic shared memory must be allowed first (outside any
            # capture: this runs when the program is loaded).
            binaries.allow_dynamic_shared_memory(kernel, launch.shared_bytes)
            self.kernels.append((kernel, launch))

    def bind(self, stream: int) -> None:
        """Nothing to bind: the kernels launch on CuPy's current stream, which the backend
        makes `stream` around `issue`."""

    def issue(self, dst: int, operands: Sequence[int], scratch: int) -> None:
        import numpy as np

        pointers = [np.uint64(dst), *(np.uint64(p) for p in operands)]
        if self.step.part == "backward":
            pointers.append(np.uint64(-(-scratch // ALIGN) * ALIGN))
        for kernel, launch in self.kernels:
            kernel(
                (launch.blocks,), (launch.threads,), tuple(pointers), shared_mem=launch.shared_bytes
            )
