"""Attention on CUDA in f32: FlashAttention's blocked online softmax in CUDA C (cuDNN's is 16-bit).

cuDNN's fused attention needs bf16/f16, and the composition (GEMMs of the whole scores, then a
softmax over them) reads and writes the tokens × keys scores several times and computes the
masked half of a causal score matrix. These kernels keep a block of scores in registers and
skip the key blocks a causal mask hides:

- forward (`flash_forward`): a thread block owns `ROWS` query rows of one batch entry; each row
  is held by `LANES` adjacent threads (`PER` dims each, so that a row's q and running output fit
  in registers); key and value blocks of `KEYS` rows go through shared memory, where every
  thread of the block reads the same entry (a broadcast). Running max and sum per row, as in
  the CPU kernel (`cpu.py`); the result is [O | lse] per row.
- backward: `flash_backward_rows` (a warp per query row) writes each row's lse and delta =
  rowsum(dO ∘ O) - dlse to scratch and zeroes its dQ row; `flash_backward_key` (a thread block
  per `ROWS` key rows, holding their k and v in registers; query blocks of `KEYS` rows through
  shared memory) recomputes P = exp(S - lse) and dP = dO vᵀ, accumulates dK and dV in
  registers, and adds its share of each query block's dQ = dS K into the result with atomic
  adds (FlashAttention-2's backward: five GEMM-sized products instead of seven for a separate
  dQ pass, 1.54 against 1.70 ms on the H200 at GPT-2's shape). dQ's bits depend on the order
  of those adds; dK and dV have one writer per row.

Scores are kept in base 2 (q or k is scaled by scale · log2(e) when loaded), so that each
probability is one `exp2f`. Every extent and stride is a constant of the generated source (any
layout of the operands is read in place, as in `cpu.py`), which follows the shared CUDA
dialect's prelude; the kernels are compiled with NVRTC (through CuPy) when a program using
them is loaded, and run on the program's stream inside its CUDA graph, as a `LibraryStep`.
Declines (the composition runs) for other dtypes, a bias, a dim extent that is not a multiple
of 4 or above 64 (the backward's blocks would not fit shared memory), or empty axes.

Measured on the H200 at GPT-2 small's shape (8 x 12 heads, 1,024 tokens, dim 64, causal;
`tools/device/flash_f32.py`): forward 0.58 ms, backward 1.54 ms, against PyTorch's SDPA in f32
(its memory-efficient kernels) 0.49 and 1.20 ms; the composition took 3.2 ms a layer.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..codegen.c.dialect import CUDA
from ..core.types import TensorType, f32
from ..kernel.call import KernelCall
from ..kernel.cudnn import ALIGN
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

ROWS = 64  # query (key) rows per thread block
KEYS = 32  # key (query) rows per block in shared memory
CHUNK = 1  # query rows whose scores a thread computes together in the backward (1 is fastest)
PAD = 4  # floats between the lanes' parts of a shared row: a broadcast read hits one bank set
LOG2E = 1.0 / math.log(2.0)
SHARED_BYTES = 48 * 1024  # static shared memory a thread block may have
PER_THREAD = 32  # entries of a row a thread keeps in registers (of q and O; of k, v, dK, dV)


def lanes_for(dim: int) -> int | None:
    """Threads per row for a dim extent: each holds `dim / lanes` entries (a multiple of 4, at
    most `PER_THREAD`) of each row it keeps in registers; None if no such split exists.

    >>> lanes_for(64), lanes_for(128), lanes_for(48), lanes_for(66)
    (2, 4, 2, None)
    """
    for lanes in (1, 2, 4, 8):
        per = dim // lanes
        if dim % lanes == 0 and per % 4 == 0 and per <= PER_THREAD:
            return lanes
    return None


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
    if lanes_for(shape.dim) is None:
        return f"a dim extent of {shape.dim}: the kernels need a multiple of 4, at most 64"
    if shape.tokens == 0 or shape.keys == 0 or shape.batch_size == 0:
        return "an empty axis"
    operands = dict(zip(("q", "k", "v"), types[:3], strict=True))
    if Layout(s, shape, operands).shared_bytes() > SHARED_BYTES:
        return f"a dim extent of {shape.dim}: the backward's blocks would not fit shared memory"
    return None


@functools.cache
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
    """The constants of one call's kernels: extents, strides, the thread layout."""

    def __init__(self, s: Signature, shape: Shape, operands: dict[str, TensorType]):
        self.s, self.shape, self.operands = s, shape, operands
        self.lanes = lanes_for(shape.dim)
        self.per = shape.dim // self.lanes

    def stride(self, name: str, axis: str) -> int:
        return element_strides(self.operands[name])[axis]

    def launches(self, part: str) -> tuple[tuple[str, int, int], ...]:
        """(kernel, thread blocks, threads a block) in launch order."""
        batch, threads = self.shape.batch_size, ROWS * self.lanes
        if part == "forward":
            return (("flash_forward", -(-self.shape.tokens // ROWS) * batch, threads),)
        rows = min(-(-self.shape.tokens * batch // 8), 132 * 16)  # a warp per row
        keys = -(-self.shape.keys // ROWS) * batch
        return (("flash_backward_rows", rows, 256), ("flash_backward_key", keys, threads))

    def shared_bytes(self) -> int:
        """Static shared memory of the largest kernel, the backward's key kernel: query and dO
        blocks, its own keys, a block of dS, and two floats a query row."""
        row = 4 * (self.shape.dim + PAD * self.lanes)
        return (2 * KEYS + ROWS) * row + ROWS * (KEYS + 4) * 4 + 2 * KEYS * 4

    def scratch(self, part: str) -> int:
        """Bytes of scratch: each query row's lse and delta (base 2), for the backward."""
        return 0 if part == "forward" else 2 * 4 * self.shape.batch_size * self.shape.tokens

    def offsets_function(self) -> str:
        """`batch_offsets(b, &oq, &ok, &ov)`: the element offset of batch entry `b` in each
        operand (the batch axes in the query's order, the last varying fastest)."""
        lines = ["long long rest = b;", "*oq = 0; *ok = 0; *ov = 0;"]
        for axis, extent in reversed(self.shape.batch):
            strides = [self.stride(n, axis) for n in ("q", "k", "v")]
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
        # Every thread of a key block sums one 4 x 4 tile of a query block's dQ.
        assert (KEYS // 4) * (shape.dim // 4) <= ROWS * self.lanes, (KEYS, shape.dim)
        constants = {
            "NB": f"{shape.batch_size}LL",  # rows = NB * TQ may pass 2^31
            "TQ": shape.tokens,
            "TK": shape.keys,
            "D": shape.dim,
            "LANES": self.lanes,
            "PER": self.per,
            "ROWS": ROWS,
            "KEYS": KEYS,
            "CHUNK": CHUNK,
            "PAD": PAD,
            "DSROW": KEYS + 4,
            "THREADS": ROWS * self.lanes,
            "SROW": shape.dim + PAD * self.lanes,
            "CAUSAL": int(s.causal),
            **stride_constants(s, self.operands),
        }
        defines = "".join(f"#define {k} {v}\n" for k, v in constants.items())
        scale = s.scale_for(shape.dim)
        defines += f"#define SCALE {scale!r}f\n#define SCALE2 {scale * LOG2E!r}f\n"
        return CUDA.prelude + defines + self.offsets_function() + KERNELS


KERNELS = r"""
#define LN2 0.6931471805599453f
#define NQB ((TQ + ROWS - 1) / ROWS)
#define NKB ((TK + ROWS - 1) / ROWS)
/* Entry d of a shared row: the lanes' parts are PAD floats apart, so that the LANES distinct
   addresses a warp reads at once fall in different banks. */
#define AT(row, d) ((row) * SROW + (d) + ((d) / PER) * PAD)
#define FULL 0xffffffffu
/* Read shared memory again after this point rather than keep what was read before in
   registers (a chunk's blocks kept would take hundreds of registers, and spill). */
#define RELOAD_SHARED() asm volatile("" ::: "memory")

/* acc + a[0..3] . x, as four fused multiply-adds. */
__device__ __forceinline__ float dot4(float acc, const float *a, float4 x) {
  return fmaf(a[3], x.w, fmaf(a[2], x.z, fmaf(a[1], x.y, fmaf(a[0], x.x, acc))));
}

__device__ __forceinline__ float lanes_sum(float x) {
#pragma unroll
  for (int m = 1; m < LANES; m <<= 1) x += __shfl_xor_sync(FULL, x, m);
  return x;
}

/* Rows [r0, r0 + KEYS) of x (element strides xt, xd from `base`) into shared memory, zeros
   past `rows`. When THREADS is a multiple of D each thread copies one column, from one
   pointer at constant offsets (few registers, all loads in flight at once). */
__device__ __forceinline__ void load_block(float *shared, const float *x, long long base,
                                           int r0, int rows, int xt, int xd) {
#if THREADS % D == 0 && KEYS % (THREADS / D) == 0
  const int d = threadIdx.x % D, first = threadIdx.x / D, step = THREADS / D;
  const float *from = x + base + (long long)(r0 + first) * xt + (long long)d * xd;
  float *to = shared + AT(first, d);
#pragma unroll
  for (int n = 0; n < KEYS / step; ++n)
    to[n * step * SROW] = r0 + first + n * step < rows ? from[(long long)n * step * xt] : 0.0f;
#else
#pragma unroll 1
  for (int e = threadIdx.x; e < KEYS * D; e += THREADS) {
    const int r = e / D, d = e % D;
    shared[AT(r, d)] = r0 + r < rows ? x[base + (long long)(r0 + r) * xt + (long long)d * xd]
                                     : 0.0f;
  }
#endif
}

/* Block order: the longest first (under a causal mask the last query blocks see most keys). */
__device__ __forceinline__ void query_block(int *qb, long long *b) {
  *qb = NQB - 1 - (int)(blockIdx.x / NB);
  *b = blockIdx.x % NB;
}

extern "C" __global__ void __launch_bounds__(THREADS)
flash_forward(float *__restrict__ dst, const float *__restrict__ q, const float *__restrict__ k,
              const float *__restrict__ v) {
  __shared__ __align__(16) float ks[KEYS * SROW];
  __shared__ __align__(16) float vs[KEYS * SROW];
  int qb;
  long long b, oq, ok, ov;
  query_block(&qb, &b);
  batch_offsets(b, &oq, &ok, &ov);
  const int lane = threadIdx.x % LANES, off = lane * PER, part = off + lane * PAD;
  const int i = qb * ROWS + threadIdx.x / LANES;
  const int row = i < TQ ? i : TQ - 1; /* rows past the end compute, and store nothing */
  float qr[PER], o[PER];
#pragma unroll
  for (int d = 0; d < PER; ++d) {
    qr[d] = q[oq + (long long)row * QT + (long long)(off + d) * QD] * SCALE2;
    o[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int kend = CAUSAL ? min(TK, (qb + 1) * ROWS) : TK;
  for (int j0 = 0; j0 < kend; j0 += KEYS) {
    __syncthreads();
    load_block(ks, k, ok, j0, TK, KT, KD);
    load_block(vs, v, ov, j0, TK, VT, VD);
    __syncthreads();
    float s[KEYS];
#pragma unroll
    for (int j = 0; j < KEYS; ++j) s[j] = 0.0f;
#pragma unroll
    for (int d = 0; d < PER; d += 4) {
#pragma unroll
      for (int j = 0; j < KEYS; ++j) {
        const float4 x = *(const float4 *)&ks[(j) * SROW + part + d];
        s[j] = dot4(s[j], &qr[d], x);
      }
    }
    const int last = CAUSAL ? row : TK - 1; /* keys after it are masked */
    const bool edge = j0 + KEYS - 1 > (CAUSAL ? qb * ROWS : TK - 1);
    float peak = m;
#pragma unroll
    for (int j = 0; j < KEYS; ++j) {
      s[j] = lanes_sum(s[j]);
      if (edge && j0 + j > last) s[j] = -INFINITY;
      peak = fmaxf(peak, s[j]);
    }
    const float correction = exp2f(m - peak); /* 0 on the first block: m is -inf */
    float total = 0.0f;
#pragma unroll
    for (int j = 0; j < KEYS; ++j) {
      s[j] = exp2f(s[j] - peak);
      total += s[j];
    }
    l = l * correction + total;
    m = peak;
#pragma unroll
    for (int d = 0; d < PER; ++d) o[d] *= correction;
#pragma unroll
    for (int j = 0; j < KEYS; ++j) {
#pragma unroll
      for (int d = 0; d < PER; d += 4) {
        const float4 x = *(const float4 *)&vs[(j) * SROW + part + d];
        o[d] += s[j] * x.x;
        o[d + 1] += s[j] * x.y;
        o[d + 2] += s[j] * x.z;
        o[d + 3] += s[j] * x.w;
      }
    }
  }
  if (i >= TQ) return;
  float *out = dst + (b * TQ + i) * (D + 1);
  const float inverse = 1.0f / l;
#pragma unroll
  for (int d = 0; d < PER; ++d) out[off + d] = o[d] * inverse;
  if (lane == 0) out[D] = (m + log2f(l)) * LN2; /* the natural-log logsumexp */
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

/* dK and dV rows of a key block, from the query rows that see them, and their share of those
   rows' dQ: dS of a query block and these keys goes through shared memory, where each thread
   sums a 4 x 4 tile of dQ over the block's keys and adds it to dQ in global memory (an atomic
   add: several key blocks add to one dQ row, in no fixed order). */
extern "C" __global__ void __launch_bounds__(THREADS)
flash_backward_key(float *__restrict__ dst, const float *__restrict__ q,
                   const float *__restrict__ k, const float *__restrict__ v,
                   const float *__restrict__ packed, const float *__restrict__ dpacked,
                   const float *__restrict__ stats) {
  __shared__ __align__(16) float qs[KEYS * SROW];
  __shared__ __align__(16) float dos[KEYS * SROW];
  __shared__ __align__(16) float ks[ROWS * SROW];  /* this block's keys, for dQ */
  __shared__ __align__(16) float dss[ROWS * DSROW]; /* dS * SCALE: [key][query row] */
  __shared__ float lse2s[KEYS], deltas[KEYS];
  const int kb = (int)(blockIdx.x / NB); /* the first key blocks see the most queries */
  const long long b = blockIdx.x % NB;
  long long oq, ok, ov;
  batch_offsets(b, &oq, &ok, &ov);
  const int lane = threadIdx.x % LANES, off = lane * PER, part = off + lane * PAD;
  const int jr = threadIdx.x / LANES, j = kb * ROWS + jr;
  const int key = j < TK ? j : TK - 1;
  float kr[PER], vr[PER], dk[PER], dv[PER];
#pragma unroll
  for (int d = 0; d < PER; ++d) {
    kr[d] = k[ok + (long long)key * KT + (long long)(off + d) * KD] * SCALE2;
    vr[d] = v[ov + (long long)key * VT + (long long)(off + d) * VD];
    dk[d] = dv[d] = 0.0f;
  }
  for (int r = 0; r < ROWS; r += KEYS) load_block(ks + r * SROW, k, ok, kb * ROWS + r, TK, KT, KD);
  /* The dQ tile of this thread: query rows 4 * (t / TILES_D).., dims 4 * (t % TILES_D).. */
  const int tq = 4 * (threadIdx.x / (D / 4)), td = 4 * (threadIdx.x % (D / 4));
  const bool tiles = threadIdx.x < (KEYS / 4) * (D / 4);
  float *dq = dst + b * (TQ + 2 * TK) * D;
  const long long rows = b * TQ;
  /* Under a causal mask the query blocks before this key block see none of its keys. */
  for (int i0 = CAUSAL ? (kb * ROWS / KEYS) * KEYS : 0; i0 < TQ; i0 += KEYS) {
    __syncthreads();
    load_block(qs, q, oq, i0, TQ, QT, QD);
    load_block(dos, dpacked, rows * (D + 1), i0, TQ, D + 1, 1); /* dO: dpacked's rows */
    for (int r = threadIdx.x; r < KEYS; r += THREADS) {
      const bool in = i0 + r < TQ;
      lse2s[r] = in ? stats[2 * (rows + i0 + r)] : INFINITY; /* P = 0 past the end */
      deltas[r] = in ? stats[2 * (rows + i0 + r) + 1] : 0.0f;
    }
    __syncthreads();
#pragma unroll 1
    for (int c0 = 0; c0 < KEYS; c0 += CHUNK) {
      float s[CHUNK], dp[CHUNK];
#pragma unroll
      for (int c = 0; c < CHUNK; ++c) s[c] = dp[c] = 0.0f;
#pragma unroll
      for (int d = 0; d < PER; d += 4) {
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) {
          const float4 x = *(const float4 *)&qs[(c0 + c) * SROW + part + d];
          const float4 y = *(const float4 *)&dos[(c0 + c) * SROW + part + d];
          s[c] = dot4(s[c], &kr[d], x);
          dp[c] = dot4(dp[c], &vr[d], y);
        }
      }
      float p[CHUNK];
#pragma unroll
      for (int c = 0; c < CHUNK; ++c) {
        const int r = c0 + c;
        const bool masked = (CAUSAL && i0 + r < key) || j >= TK;
        /* Every lane shuffles, outside the mask's branch: a shuffle waits for all the lanes of
           the warp (inside it, the first version hung). */
        const float score = lanes_sum(s[c]), dprob = lanes_sum(dp[c]);
        p[c] = masked ? 0.0f : exp2f(score - lse2s[r]);
        s[c] = p[c] * (dprob - deltas[r]); /* dS */
        if (lane == 0) dss[jr * DSROW + r] = s[c] * SCALE;
      }
      RELOAD_SHARED();
#pragma unroll
      for (int c = 0; c < CHUNK; ++c) {
#pragma unroll
        for (int d = 0; d < PER; d += 4) {
          const float4 x = *(const float4 *)&qs[(c0 + c) * SROW + part + d];
          const float4 y = *(const float4 *)&dos[(c0 + c) * SROW + part + d];
          dk[d] += s[c] * x.x;
          dk[d + 1] += s[c] * x.y;
          dk[d + 2] += s[c] * x.z;
          dk[d + 3] += s[c] * x.w;
          dv[d] += p[c] * y.x;
          dv[d + 1] += p[c] * y.y;
          dv[d + 2] += p[c] * y.z;
          dv[d + 3] += p[c] * y.w;
        }
      }
    }
    __syncthreads();
    if (tiles) { /* dQ[i0 + tq.., td..] += dS[.., keys] K[keys, td..] */
      float acc[4][4] = {};
      const int kmax = min(ROWS, TK - kb * ROWS);
#pragma unroll 4
      for (int jj = 0; jj < kmax; ++jj) {
        const float4 a = *(const float4 *)&dss[jj * DSROW + tq];
        const float4 x = *(const float4 *)&ks[AT(jj, td)];
        const float av[4] = {a.x, a.y, a.z, a.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[r][e] = fmaf(av[r], xv[e], acc[r][e]);
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (i0 + tq + r >= TQ) break;
        float *row = dq + (long long)(i0 + tq + r) * D + td;
#pragma unroll
        for (int e = 0; e < 4; ++e) atomicAdd(row + e, acc[r][e]);
      }
    }
  }
  if (j >= TK) return;
  float *out = dst + b * (TQ + 2 * TK) * D + (long long)(TQ + j) * D;
#pragma unroll
  for (int d = 0; d < PER; ++d) {
    out[off + d] = dk[d] * SCALE;
    out[TK * D + off + d] = dv[d];
  }
}
""".replace("LOG2E_F", f"{LOG2E!r}f")


# -- the library step ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlashAttention:
    """The `LibraryStep` of one call's kernels: their source, launches and scratch."""

    part: str
    source: str
    launch: tuple[tuple[str, int, int], ...]  # (kernel, thread blocks, threads) in order
    stats_bytes: int

    @property
    def scratch_bytes(self) -> int:
        return self.stats_bytes + ALIGN if self.stats_bytes else 0

    def load(self, ordinal: int) -> Issuer:
        """The issuer on GPU `ordinal`, its kernels compiled (NVRTC) now, outside any capture."""
        return Issuer(self, _module(self.source, ordinal))


@functools.cache
def _module(source: str, ordinal: int) -> Any:
    import cupy

    with cupy.cuda.Device(ordinal):
        module = cupy.RawModule(code=source, options=("-std=c++17",))
        module.compile()
    return module


class Issuer:
    """Launches one call's kernels on the current stream (see `accy.kernel.call.LibraryStep`)."""

    def __init__(self, step: FlashAttention, module: Any):
        self.step = step
        self.kernels = [
            (module.get_function(name), grid, block) for name, grid, block in step.launch
        ]

    def bind(self, stream: int) -> None:
        """Nothing to bind: the kernels launch on CuPy's current stream, which the backend
        makes `stream` around `issue`."""

    def issue(self, dst: int, operands: Sequence[int], scratch: int) -> None:
        import numpy as np

        pointers = [np.uint64(dst), *(np.uint64(p) for p in operands)]
        if self.step.part == "backward":
            pointers.append(np.uint64(-(-scratch // ALIGN) * ALIGN))
        for kernel, grid, block in self.kernels:
            kernel((grid,), (block,), tuple(pointers))
