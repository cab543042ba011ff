"""accy's own float32 GEMM for CPUs with AVX-512F, called where BLAS's `sgemm` would be.

NumPy's OpenBLAS may be held to its AVX2 kernels (`OPENBLAS_CORETYPE=Haswell`, which some
environments set), and XLA, with AVX-512 kernels of its own, then runs a transformer's GEMMs
about 1.7x faster. This module builds, once per machine (the disk cache's `gemm` folder), a
small library with a cblas-compatible `sgemm`: BLIS's loop order (panels of B of `KC` x `NC`
packed once per block, micro-panels of A of `MR` rows), a 12 x 32 micro-kernel holding its
24 accumulators in zmm registers and fused multiply-adds (as every BLAS's sgemm). What it does
not serve (column-major calls, alpha != 1 or beta != 0, fewer than 16 columns, where its
32-wide tiles would be mostly padding) it hands to the BLAS's own `sgemm`.

Where the BLAS runs AVX-512 kernels of its own (`Blas.runs_avx512`: OpenBLAS not held to AVX2),
float32 GEMMs keep its sgemm, which measured faster than this kernel on a Zen 4, and only the
bf16 GEMM (`accy_gemm_mixed`, reading and rounding bf16 itself) is the kernel's.

The generated programs call it through the same pointer as BLAS's (`NativeLibrary` hands it
over at load time), so the choice costs no code generation and no compile of the program:
`accy.config.cpu_gemm_kernel` (on by default) picks it for programs compiled from then on.
Results depend on the GEMM's shape alone, never on the thread that runs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import math
import subprocess
import threading
from pathlib import Path

from ...codegen import cache
from ...codegen.compiler import find_compiler
from ...config import config
from ...core.types import f64
from ...errors import CompileError
from ...lower.plan import Plan
from .blas import Blas
from .toolchain import cpu_identity

CACHE = cache.Cache("gemm")
VERSION = "accy-gemm-2"
# -O1 with the vectorizer (dynamic cost model): a third less compile time than -O2 (the build
# is part of a cold first call) and the same speed: the micro-kernel's loops over its rows are
# unrolled by pragmas (its accumulators stay in registers) and the packing loops of runtime
# lengths are vectorized (left scalar, char-gpt's bf16 step took 15% longer).
FLAGS = (
    "-O1",
    "-ftree-vectorize",
    "-fvect-cost-model=dynamic",
    "-march=native",
    "-fPIC",
    "-shared",
    "-std=gnu11",
    "-pipe",
    "-nostdlib",
)

SOURCE = r"""
/* accy's float32 GEMM (AVX-512F): row-major C = A B, A m x k and B k x n, each maybe
   transposed; operands float32 or bfloat16 (converted as they are packed), the result float32 or
   rounded once to bfloat16 as it is stored. */
typedef long int64_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
typedef unsigned long size_t;
void *aligned_alloc(size_t alignment, size_t size);
void *memcpy(void *restrict to, const void *restrict from, size_t size);

typedef float v16 __attribute__((vector_size(64), aligned(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
enum { MR = 12, NR = 32, KC = 256, NC = 1024, ROW_MAJOR = 101, TRANS = 112 };

static inline v16 fma16(v16 a, v16 b, v16 c) {
  return __builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4);
}

static inline float bf16_load(uint16_t bits) {
  const uint32_t wide = (uint32_t)bits << 16;
  float x;
  memcpy(&x, &wide, 4);
  return x;
}

/* Round to nearest even; NaN stays a quiet NaN (the generated code's accy_bf16_store). */
static inline uint16_t bf16_store(float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  if (x != x) return (uint16_t)((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

/* Where a tile's sums go: `c` (float32) gets them, plus what it holds where `accumulate`; on
   the last pass over k with `rounded` set, they go, rounded, to `rounded` instead. */
typedef struct {
  float *c;
  uint16_t *rounded;
  int64_t ldc;
  int accumulate, last;
} Target;

/* acc's first R rows = A (R x kc, element (i, p) at a[i * rs + p * cs]) times b (kc x NR,
   packed). */
#define ACCY_MULTIPLY(rs, cs, R)                                                              \
  _Pragma("GCC unroll 16") for (int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = (v16){0};     \
  for (int64_t p = 0; p < kc; ++p) {                                                          \
    const v16 b0 = *(const v16 *)b, b1 = *(const v16 *)(b + 16);                              \
    _Pragma("GCC unroll 16") for (int i = 0; i < R; ++i) {                                    \
      const v16 ai = (v16){0} + a[i * (rs) + p * (cs)];                                       \
      acc[i][0] = fma16(ai, b0, acc[i][0]);                                                   \
      acc[i][1] = fma16(ai, b1, acc[i][1]);                                                   \
    }                                                                                         \
    b += NR;                                                                                  \
  }

static void store(v16 acc[MR][2], Target t, int64_t i0, int64_t j0, int64_t rows, int64_t cols);

/* The MR x NR tile at (i0, j0) of the target gets A times b (kc x NR), A's micro-panel read
   where `lda` is 0 from a (kc x MR, packed), else from MR full float32 rows (element (i, p)
   at a[i * lda + p]); only the tile's first rows x cols elements are written. A last block
   of 4 or 8 rows (packed) multiplies only those: 64 rows are 5 blocks and 4 rows, not 6. */
static void kernel(int64_t kc, const float *restrict a, int64_t lda, const float *restrict b,
                   Target t, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  v16 acc[MR][2];
  if (lda) {
    ACCY_MULTIPLY(lda, 1, MR)
  } else if (rows <= 4) {
    ACCY_MULTIPLY(1, MR, 4)
  } else if (rows <= 8) {
    ACCY_MULTIPLY(1, MR, 8)
  } else {
    ACCY_MULTIPLY(1, MR, MR)
  }
  store(acc, t, i0, j0, rows, cols);
}

static void store(v16 acc[MR][2], Target t, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  float *c = t.c + i0 * t.ldc + j0;
  if (rows == MR && cols == NR && !(t.last && t.rounded)) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      v16u *row = (v16u *)(c + i * t.ldc);
      if (t.accumulate) {
        row[0] += acc[i][0];
        row[1] += acc[i][1];
      } else {
        row[0] = acc[i][0];
        row[1] = acc[i][1];
      }
    }
    return;
  }
  float tile[MR * NR] __attribute__((aligned(64)));
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    *(v16 *)(tile + i * NR) = acc[i][0];
    *(v16 *)(tile + i * NR + 16) = acc[i][1];
  }
  if (t.accumulate)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) tile[i * NR + j] += c[i * t.ldc + j];
  if (t.last && t.rounded) {
    uint16_t *out = t.rounded + i0 * t.ldc + j0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) out[i * t.ldc + j] = bf16_store(tile[i * NR + j]);
  } else {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) c[i * t.ldc + j] = tile[i * NR + j];
  }
}

/* Packing, for float32 (f32) and bfloat16 (bf16) operands. pack_b: B[p0 : p0 + kc, j0 : j0 + nc]
   as panels of NR columns, each kc x NR, zero-padded. pack_a: A[i0 : i0 + rows, p0 : p0 + kc]
   as kc x MR, zero-padded. */
#define ACCY_PACKING(suffix, T, LOAD)                                                         \
  static void pack_b_##suffix(int trans, const T *b, int64_t ldb, int64_t p0, int64_t kc,     \
                              int64_t j0, int64_t nc, float *restrict out) {                 \
    for (int64_t q = 0; q < nc; q += NR) {                                                    \
      const int64_t w = nc - q < NR ? nc - q : NR;                                            \
      float *restrict panel = out + q * kc;                                                   \
      if (!trans) {                                                                           \
        for (int64_t p = 0; p < kc; ++p) {                                                    \
          const T *from = b + (p0 + p) * ldb + j0 + q;                                        \
          float *to = panel + p * NR;                                                         \
          if (w == NR) {                                                                      \
            for (int64_t j = 0; j < NR; ++j) to[j] = LOAD(from[j]);                           \
          } else {                                                                            \
            for (int64_t j = 0; j < w; ++j) to[j] = LOAD(from[j]);                            \
            for (int64_t j = w; j < NR; ++j) to[j] = 0;                                       \
          }                                                                                   \
        }                                                                                     \
      } else { /* B(p, j) is b[j * ldb + p] */                                                \
        for (int64_t j = 0; j < w; ++j) {                                                     \
          const T *from = b + (j0 + q + j) * ldb + p0;                                        \
          for (int64_t p = 0; p < kc; ++p) panel[p * NR + j] = LOAD(from[p]);                 \
        }                                                                                     \
        for (int64_t j = w; j < NR; ++j)                                                      \
          for (int64_t p = 0; p < kc; ++p) panel[p * NR + j] = 0;                             \
      }                                                                                       \
    }                                                                                         \
  }                                                                                           \
  static void pack_a_##suffix(int trans, const T *a, int64_t lda, int64_t i0, int64_t rows,   \
                              int64_t p0, int64_t kc, float *restrict out) {                 \
    if (!trans) {                                                                             \
      for (int64_t i = 0; i < rows; ++i) {                                                    \
        const T *from = a + (i0 + i) * lda + p0;                                              \
        for (int64_t p = 0; p < kc; ++p) out[p * MR + i] = LOAD(from[p]);                     \
      }                                                                                       \
    } else { /* A(i, p) is a[p * lda + i] */                                                  \
      for (int64_t p = 0; p < kc; ++p) {                                                      \
        const T *from = a + (p0 + p) * lda + i0;                                              \
        for (int64_t i = 0; i < rows; ++i) out[p * MR + i] = LOAD(from[i]);                   \
      }                                                                                       \
    }                                                                                         \
    for (int64_t i = rows; i < MR; ++i)                                                       \
      for (int64_t p = 0; p < kc; ++p) out[p * MR + i] = 0;                                   \
  }

#define ACCY_SAME(x) (x)
ACCY_PACKING(f32, float, ACCY_SAME)
ACCY_PACKING(bf16, uint16_t, bf16_load)

static void pack_b(int bf16, int trans, const void *b, int64_t ldb, int64_t p0, int64_t kc,
                   int64_t j0, int64_t nc, float *out) {
  if (bf16) pack_b_bf16(trans, b, ldb, p0, kc, j0, nc, out);
  else pack_b_f32(trans, b, ldb, p0, kc, j0, nc, out);
}

static void pack_a(int bf16, int trans, const void *a, int64_t lda, int64_t i0, int64_t rows,
                   int64_t p0, int64_t kc, float *out) {
  if (bf16) pack_a_bf16(trans, a, lda, i0, rows, p0, kc, out);
  else pack_a_f32(trans, a, lda, i0, rows, p0, kc, out);
}

/* MR rows of kc bf16 values (a row every lda) as MR contiguous float32 rows of kc. */
static void rows_bf16(const uint16_t *a, int64_t lda, int64_t kc, float *restrict out) {
  for (int i = 0; i < MR; ++i)
    for (int64_t p = 0; p < kc; ++p) out[i * kc + p] = bf16_load(a[i * lda + p]);
}

/* Each thread's packing buffers, allocated on its first GEMM and kept. */
static __thread float *b_buffer, *a_buffer;

static int buffers(void) {
  if (!b_buffer) b_buffer = aligned_alloc(64, sizeof(float) * KC * NC);
  if (!a_buffer) a_buffer = aligned_alloc(64, sizeof(float) * KC * MR);
  return b_buffer && a_buffer;
}

/* flags: bit 0 A transposed, bit 1 B transposed, bit 2 A bfloat16, bit 3 B bfloat16. */
static void gemm(int flags, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                 const void *b, int64_t ldb, float *c, uint16_t *rounded, int64_t ldc) {
  const int transa = flags & 1, transb = (flags >> 1) & 1;
  const int a_bf16 = (flags >> 2) & 1, b_bf16 = (flags >> 3) & 1;
  for (int64_t j0 = 0; j0 < n; j0 += NC) {
    const int64_t nc = n - j0 < NC ? n - j0 : NC;
    for (int64_t p0 = 0; p0 < k; p0 += KC) {
      const int64_t kc = k - p0 < KC ? k - p0 : KC;
      const Target target = {c, rounded, ldc, p0 > 0, p0 + kc >= k};
      pack_b(b_bf16, transb, b, ldb, p0, kc, j0, nc, b_buffer);
      for (int64_t i0 = 0; i0 < m; i0 += MR) {
        const int64_t rows = m - i0 < MR ? m - i0 : MR;
        /* MR full rows of A are read in place (float32) or converted into float32 rows, a
           contiguous copy of each (bf16); a last partial block and a transposed A (a cache
           line a step of k there) are packed (converted, zero-padded) */
        const int rowwise = !transa && rows == MR;
        const float *panel = a_buffer;
        int64_t stride = 0;
        if (rowwise && !a_bf16) {
          panel = (const float *)a + i0 * lda + p0;
          stride = lda;
        } else if (rowwise) {
          rows_bf16((const uint16_t *)a + i0 * lda + p0, lda, kc, a_buffer);
          stride = kc;
        } else {
          pack_a(a_bf16, transa, a, lda, i0, rows, p0, kc, a_buffer);
        }
        for (int64_t q = 0; q < nc; q += NR) {
          const int64_t cols = nc - q < NR ? nc - q : NR;
          kernel(kc, panel, stride, b_buffer + q * kc, target, i0, j0 + q, rows, cols);
        }
      }
    }
  }
}

/* The same product as plain loops: where the packing buffers could not be allocated. */
static void unpacked(int flags, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                     const void *b, int64_t ldb, float *c, uint16_t *rounded, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const int64_t at = flags & 1 ? p * lda + i : i * lda + p;
        const int64_t bt = flags & 2 ? j * ldb + p : p * ldb + j;
        const float x = flags & 4 ? bf16_load(((const uint16_t *)a)[at]) : ((const float *)a)[at];
        const float y = flags & 8 ? bf16_load(((const uint16_t *)b)[bt]) : ((const float *)b)[bt];
        sum += x * y;
      }
      if (rounded) rounded[i * ldc + j] = bf16_store(sum);
      else c[i * ldc + j] = sum;
    }
}

/* A product of float32 or bfloat16 operands (`flags` as gemm's) into float32 `c`, or rounded
   into bfloat16 `rounded` (then `c`, as large, holds the sums between passes over k). */
void accy_gemm_mixed(int flags, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                     const void *b, int64_t ldb, float *c, uint16_t *rounded, int64_t ldc) {
  if (k < 1 || !buffers()) unpacked(flags, m, n, k, a, lda, b, ldb, c, rounded, ldc);
  else gemm(flags, m, n, k, a, lda, b, ldb, c, rounded, ldc);
}

#define ACCY_SGEMM(name, blasint)                                                             \
  static void (*name##_blas)(int, int, int, blasint, blasint, blasint, float, const float *,  \
                             blasint, const float *, blasint, float, float *, blasint);       \
  void name##_fallback(void *blas) { name##_blas = blas; }                                    \
  void name(int order, int ta, int tb, blasint m, blasint n, blasint k, float alpha,          \
            const float *a, blasint lda, const float *b, blasint ldb, float beta, float *c,   \
            blasint ldc) {                                                                    \
    if (order != ROW_MAJOR || alpha != 1.0f || beta != 0.0f || n < 16 || k < 1 ||             \
        !buffers()) {                                                                         \
      name##_blas(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);               \
      return;                                                                                 \
    }                                                                                         \
    gemm((ta == TRANS) | (tb == TRANS) << 1, m, n, k, a, lda, b, ldb, c, 0, ldc);             \
  }

ACCY_SGEMM(accy_sgemm64, int64_t)
ACCY_SGEMM(accy_sgemm32, int32_t)
"""


def cpu_has_avx512() -> bool:
    """True where the CPU runs AVX-512F instructions (what the kernel needs).

    >>> isinstance(cpu_has_avx512(), bool)
    True
    """
    return " avx512f " in f" {cpu_identity().replace(chr(10), ' ')} "


def _compile(output: Path) -> None:
    compiler = find_compiler()
    source = output.with_suffix(".c")
    source.write_text(SOURCE)
    command = [compiler.path, *FLAGS, str(source), "-o", str(output)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(
            f"the C compiler rejected accy's GEMM kernel (a bug in accy; set "
            f"ACCY_CPU_GEMM_KERNEL=0 to use the BLAS's sgemm instead): {' '.join(command)}\n"
            f"{result.stderr[-4000:]}"
        )


KERNEL = "accy's AVX-512 kernel (accy.backends.cpu.gemm)"
SMALLEST_GEMM_WORK = 1 << 26
"""The fewest multiply-adds (of one run's GEMMs) for which a program uses the kernel: building
its library takes about 0.2 s of a core once per cache, which a program of small GEMMs (an
attention's 256 x 256 x 64 products: a few million) would wait for and not win back soon."""
MIXED_GEMM_SMALLEST_N = 16
"""The fewest columns of a bf16 product that `accy_gemm_mixed` computes (narrower ones are
packed to float32 and go to the sgemm, which hands them to BLAS)."""
MIXED_GEMM_DECLARATIONS = """
typedef void (*accy_gemm_mixed_t)(int, int64_t, int64_t, int64_t, const void *, int64_t,
                                  const void *, int64_t, float *, uint16_t *, int64_t);
ACCY_STATE accy_gemm_mixed_t accy_gemm_mixed;

#if ACCY_OWNER
void accy_set_gemm_mixed(void *gemm) {
  accy_gemm_mixed = (accy_gemm_mixed_t)gemm;
}
#endif
"""
"""What a program built for the kernel declares: the bf16 GEMM's pointer, set at load time."""
_LOCK = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}  # by cache key: opened once, never closed


def _entry() -> str:
    return cache.key(VERSION, find_compiler().identity, cpu_identity(), " ".join(FLAGS), SOURCE)


def _library() -> ctypes.CDLL:
    entry = _entry()
    with _LOCK:
        if entry not in _loaded:
            _loaded[entry] = CACHE.load(entry, _compile, lambda path: ctypes.CDLL(str(path)))
        return _loaded[entry]


def _build_quietly() -> None:
    # A failure is raised again, where it can be reported, when the library is loaded.
    with contextlib.suppress(Exception):
        _library()


def prepare_library() -> bool:
    """Build the kernel's library into the disk cache now (or find it there), where the CPU runs
    AVX-512F; True when it is ready. A per-machine artifact like an installed BLAS: a harness
    that empties the cache per run may build it once and keep its folder (`bench/README.md`).

    >>> prepare_library() == cpu_has_avx512()
    True
    """
    if not cpu_has_avx512():
        return False
    # Built into the cache in use now, also when this process opened the library from another
    # cache already (`_library` opens it once per process).
    CACHE.build(_entry(), _compile)
    _library()
    return True


def calls_sgemm(source: str) -> bool:
    """True when generated C `source` calls the kernel's float32 or bf16 GEMM.

    >>> calls_sgemm("accy_sgemm(101, 111, 111, 2, 2, 2, ...);"), calls_sgemm("int x;")
    (True, False)
    """
    return "accy_sgemm(" in source or "accy_gemm_mixed(" in source


def start_building(blas: Blas | None, source: str) -> None:
    """Start building the kernel's library in the background (beside the program's own compile,
    on another core) where `source`, built with `blas`, will call it; `with_gemm_kernel` waits
    for it."""
    if blas is not None and blas.sgemm_kernel == KERNEL and calls_sgemm(source) and not _loaded:
        threading.Thread(target=_build_quietly, name="accy-gemm-build", daemon=True).start()


def gemm_work(plan: Plan) -> int:
    """The multiply-adds of one run of `plan`'s float GEMMs (those of scan bodies and branches
    counted once).

    >>> import accy
    >>> from accy.lower.plan import build_plan
    >>> p = accy.trace.define("mm", [accy.spec(accy.f32, m=4, k=3), accy.spec(accy.f32, k=3, n=5)],
    ...                       lambda b, a: a[0].contract(a[1], "k"))
    >>> gemm_work(build_plan(p))
    60
    """
    total = 0
    for step in plan.steps:
        if step.kind == "dot" and step.op.type.dtype != f64:
            g = step.detail
            total += math.prod(g.batch_extents) * g.m * g.n * g.k
        for inner in (step.body, *step.branches):
            total += 0 if inner is None else gemm_work(inner)
        total += sum(gemm_work(member.body) for member in step.members if member.body)
    return total


def choose_gemm_kernel(blas: Blas, plan: Plan) -> Blas:
    """`blas`, marked to have its `sgemm` replaced by accy's kernel at load time, where the CPU
    has AVX-512F, `accy.config.cpu_gemm_kernel` is on and `plan`'s GEMMs have at least
    `SMALLEST_GEMM_WORK` multiply-adds (the generated source records the choice, so programs
    built either way are different libraries); `blas` itself otherwise.

    >>> import accy
    >>> from accy.backends.cpu.blas import find_blas
    >>> from accy.lower.plan import build_plan
    >>> p = accy.trace.define("x2", [accy.spec(accy.f32, n=4)], lambda b, a: a[0] * 2.0)
    >>> blas = find_blas()
    >>> blas is None or choose_gemm_kernel(blas, build_plan(p)).sgemm_kernel  # no GEMM
    ''
    """
    if not (config.cpu_gemm_kernel and cpu_has_avx512()):
        return blas
    if gemm_work(plan) < SMALLEST_GEMM_WORK:
        return blas
    return dataclasses.replace(blas, sgemm_kernel=KERNEL)


def with_gemm_kernel(blas: Blas, source: str) -> Blas:
    """`blas` with its `sgemm` address replaced by the kernel's where `choose_gemm_kernel`
    marked it and `source` calls it (the kernel hands what it does not serve to `blas`'s own
    `sgemm`).

    >>> from accy.backends.cpu.blas import find_blas
    >>> blas = find_blas()
    >>> blas is None or with_gemm_kernel(blas, "int x;") == blas  # no GEMM: unchanged
    True
    """
    if blas.sgemm_kernel != KERNEL or not calls_sgemm(source):
        return blas
    # A BLAS with AVX-512 kernels of its own runs large float32 GEMMs faster than this kernel
    # (OpenBLAS's SkylakeX sgemm on a Zen 4: a transformer block 0.7x the kernel's time); the
    # bf16 GEMM, which reads and rounds bf16 itself, is the kernel's either way.
    sgemm = blas.sgemm if blas.runs_avx512 else kernel_sgemm(blas)
    mixed = ctypes.cast(_library().accy_gemm_mixed, ctypes.c_void_p).value
    return dataclasses.replace(blas, sgemm=sgemm, mixed_gemm=mixed)


def kernel_sgemm(blas: Blas) -> int:
    """The address of the kernel's cblas-compatible `sgemm` for `blas`'s integer width, which
    hands what it does not serve to `blas`'s own `sgemm` (the library is built or loaded).

    >>> from accy.backends.cpu.blas import find_blas
    >>> blas = find_blas()
    >>> blas is None or not cpu_has_avx512() or kernel_sgemm(blas) != blas.sgemm
    True
    """
    library = _library()
    name = "accy_sgemm64" if blas.integer_bits == 64 else "accy_sgemm32"
    getattr(library, f"{name}_fallback")(ctypes.c_void_p(blas.sgemm))
    return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


__all__ = [
    "KERNEL",
    "SMALLEST_GEMM_WORK",
    "MIXED_GEMM_DECLARATIONS",
    "MIXED_GEMM_SMALLEST_N",
    "calls_sgemm",
    "choose_gemm_kernel",
    "cpu_has_avx512",
    "kernel_sgemm",
    "gemm_work",
    "prepare_library",
    "start_building",
    "with_gemm_kernel",
]
