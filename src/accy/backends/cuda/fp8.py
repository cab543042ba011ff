"""FP8 GEMMs on CUDA: the `LibraryStep` of `accy.nn.fp8_matmul`, through cuBLASLt.

One step quantises both operands and multiplies them (`Fp8Gemm`), in three small kernels and one
`cublasLtMatmul`, all on the program's stream inside its CUDA graph. Its operands are the two
matrices and their amaxes (f32 scalars the program computed, `accy.nn.fp8.amax_of`):

- `fp8_scale` (a thread an operand: scale = fp8_max / amax or 1, and the inverse scale); per
  operand, `fp8_quantize_*` (x times the scale, rounded to E4M3 or E5M2 to nearest, ties to
  even, saturating), written K-contiguous: Hopper's FP8 GEMMs take only the "TN" layout, so an
  operand whose contracted axes come first is transposed on the way (64 x 64 tiles through
  shared memory). Each thread loads 16 bytes at a time where the operand's address allows
  (else one element), as the quantisation must run near the memory's bandwidth to leave FP8 a
  gain: one element a thread ran at 0.4-1.1 TB/s on the H200;
- `cublasLtMatmul` with CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2 operands, f32 compute, the inverse
  scales as CUBLASLT_MATMUL_DESC_A_SCALE_POINTER / B_SCALE_POINTER (per-tensor scalars,
  CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F), the result in bf16 or f32;
  fast accumulation for the forward (E4M3 x E4M3) GEMM only, as Transformer Engine does.

The rounding is integer arithmetic on the float's bits (no cuda_fp8.h), the same numbers as
`accy.core.types.saturate_to_float8`, so the quantised operands are bitwise the reference's.
The kernels compile with NVRTC (CuPy) when a program using them is loaded; the cuBLASLt handle
and descriptors are made then too, and the GEMM runs once outside any capture. Declines (the
composition runs) for f16 operands, operand layouts other than [free..., contracted...] or
[contracted..., free...], extents that are not multiples of 16 (cuBLASLt's FP8 alignment), and
GEMMs that cuBLASLt refuses on the GPU at hand (`refusal`, logged).

Measured on an H200 with CUDA 13 (`bench/results/fp8-h200-bf16.md`): cuBLASLt answers
CUBLAS_STATUS_NOT_SUPPORTED (15) for an FP8 GEMM whose scale pointers sit 4 or 12 bytes past a
256-byte boundary, whatever else the call does, so each inverse scale starts its own block of
the scratch. Hopper's FP8 tensor cores keep about 14 significant bits of the running sum
(truncating), fast accumulation or not: results differ from an f32 sum of the same float8
products by up to 1.3e-4 of the terms' magnitude at k = 48 (measured), not f32's 1e-5.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from ctypes import c_int, c_size_t, c_void_p
from dataclasses import dataclass
from typing import Any

from ...caches import memoized
from ...core.types import TensorType, dtype_named, float8_format
from ...errors import AccyError
from ...kernel.call import KernelCall
from . import binaries
from .cublaslt import (
    A_SCALE,
    A_SCALE_MODE,
    B_SCALE,
    B_SCALE_MODE,
    CUDA_TYPES,
    FAST_ACCUMULATE,
    OP_N,
    OP_T,
    TRANSA,
    TRANSB,
    check,
    handle,
    matmul_descriptor,
    matrix_layout,
    set_attribute,
)
from .cudnn import ALIGN

log = logging.getLogger("accy.fp8")
WORKSPACE_BYTES = 8 << 20  # cuBLASLt's: FP8 GEMMs of these sizes need no more
QUANTIZE_BLOCKS = 16 * 1056  # at most this many blocks of a grid-stride quantisation (H200)
THREADS = 256
TILE = 64  # the transposing quantisation's tile: TILE x TILE values a block
ELEMENT_TYPES = {"bf16": "unsigned short", "f32": "float"}
SCALAR_32F = 0  # cublasLtMatmulMatrixScale_t: one f32 scale per operand
SCALE_MODES_SINCE = 120800  # cublasLtGetVersion() of the first library with scale modes


@dataclass(frozen=True)
class Operand:
    """How one operand is quantised: its dtype, float8 format, and whether it is stored
    [contracted, free] (transposed on the way to [free, contracted])."""

    dtype: str
    format: str
    transposed: bool


@dataclass(frozen=True)
class Fp8Gemm:
    """The `LibraryStep` of one FP8 GEMM: result [m, n] (row-major) = first [m, k] times
    second [n, k]ᵀ, each operand quantised as `Operand` says."""

    m: int
    n: int
    k: int
    first: Operand
    second: Operand
    out: str

    @property
    def offsets(self) -> dict[str, int]:
        """Byte offsets in the (aligned) scratch: scales, the quantised operands, cuBLASLt's
        workspace."""
        sizes = {
            "scales": 2 * ALIGN,  # per operand, at its own boundary (cuBLASLt refuses
            # FP8 GEMMs whose scale pointers are not): the inverse scale, then the scale
            "first": self.m * self.k,
            "second": self.n * self.k,
            "workspace": WORKSPACE_BYTES,
        }
        offsets, at = {}, 0
        for name, size in sizes.items():
            offsets[name] = at
            at += -(-size // ALIGN) * ALIGN
        offsets["end"] = at
        return offsets

    @property
    def scratch_bytes(self) -> int:
        return self.offsets["end"] + ALIGN  # the scratch given may start off a boundary

    @property
    def fast_accumulate(self) -> bool:
        return self.first.format == self.second.format == "float8_e4m3fn"

    def load(self, ordinal: int) -> Issuer:
        """The issuer on GPU `ordinal`: kernels compiled, cuBLASLt's algorithm chosen."""
        return Issuer(self, _module(ordinal), handle(ordinal))


def kernel_factory(s: Any) -> Callable[[Sequence[TensorType], TensorType], KernelCall | None]:
    """The `kernels["cuda"]` entry of FP8 GEMM signature `s` (`accy.nn.fp8.Signature`)."""

    def factory(types: Sequence[TensorType], result: TensorType) -> KernelCall | None:
        step = describe(s, tuple(types[:2]), result)
        if step is None or refusal(step) is not None:
            return None
        digest = hashlib.sha256(repr(step).encode()).hexdigest()[:16]
        names = ("dst", "a", "b", "amax_a", "amax_b")
        parameters = list(zip(names, (result, *types), strict=True))
        description = f"FP8 GEMM {step.m}x{step.n}x{step.k} ({step.first.format} x " + (
            f"{step.second.format} -> {step.out})"
        )
        symbol = f"accy_fp8_gemm_{digest}"
        return KernelCall.of_library(s.target, symbol, parameters, description, step)

    return factory


def describe(s: Any, types: tuple[TensorType, ...], result: TensorType) -> Fp8Gemm | None:
    """The step of GEMM `s` on operands of `types`, or None where cuBLASLt's FP8 path does not
    take it (the composition runs).

    >>> from accy import bf16, spec
    >>> from accy.nn.fp8 import Signature
    >>> s = Signature(("k",), (("m", "k"), ("k", "n")), ("float8_e4m3fn",) * 2, "float8_e5m2",
    ...               "bf16")
    >>> step = describe(s, (spec(bf16, m=32, k=64), spec(bf16, k=64, n=16)), spec(bf16, m=32, n=16))
    >>> step.m, step.n, step.k, step.first.transposed, step.second.transposed
    (32, 16, 64, False, True)
    """
    a, b = types
    if a.dtype.name not in ELEMENT_TYPES or a.dtype != b.dtype:
        return None
    if result.dtype.name not in ("bf16", "f32"):
        return None
    first = _operand(a, s.axes, s.formats[0])
    second = _operand(b, s.axes, s.formats[1])
    if first is None or second is None:
        return None
    k = math.prod(a.extent(n) for n in s.axes)
    m, n = a.size // max(k, 1), b.size // max(k, 1)
    if 0 in (m, n, k) or any(extent % 16 for extent in (m, n, k)):
        return None
    return Fp8Gemm(m, n, k, first, second, result.dtype.name)


@memoized("fp8 gemm refusals", "kernels_max_entries")
def refusal(step: Fp8Gemm) -> str | None:
    """Why cuBLASLt does not run `step` on the current GPU (its load's error: `Issuer` runs
    the GEMM once), or None when it does. A refused GEMM runs as the composition."""
    import cupy

    try:
        step.load(cupy.cuda.Device().id)
    except AccyError as error:
        log.warning("FP8 GEMM %s declined (the composition runs): %s", step, error)
        return str(error)
    return None


def _operand(t: TensorType, contracted: tuple[str, ...], format: str) -> Operand | None:
    free = tuple(a for a in t.axes if a not in contracted)
    if t.axes == free + contracted:
        return Operand(t.dtype.name, format, False)
    if t.axes == contracted + free:
        return Operand(t.dtype.name, format, True)
    return None


# -- the kernels ----------------------------------------------------------------------------------

_PRELUDE = r"""
#define THREADS 256
#define TILE 64
#define CHUNK_bf16 8
#define CHUNK_f32 4
__device__ __forceinline__ float load_bf16(const unsigned short *x, long long i) {
  return __uint_as_float(((unsigned)x[i]) << 16);
}
__device__ __forceinline__ float load_f32(const float *x, long long i) { return x[i]; }

// 16 bytes of an operand, loaded at once (a uint4): CHUNK_bf16 or CHUNK_f32 values.
__device__ __forceinline__ unsigned word(const uint4 &c, int i) {
  return i == 0 ? c.x : i == 1 ? c.y : i == 2 ? c.z : c.w;
}
__device__ __forceinline__ float chunk_bf16(const uint4 &c, int i) {
  unsigned w = word(c, i >> 1);
  return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
}
__device__ __forceinline__ float chunk_f32(const uint4 &c, int i) {
  return __uint_as_float(word(c, i));
}
__device__ __forceinline__ bool aligned16(const void *p) {
  return ((unsigned long long)p & 15) == 0;
}
// The float8 bytes of one chunk, stored at once: byte j of the chunk is q's byte j.
struct packed_f32 { unsigned x; };
typedef uint2 packed_bf16;
__device__ __forceinline__ void pack(packed_f32 &p, int j, unsigned byte) {
  p.x |= byte << (8 * j);
}
__device__ __forceinline__ void pack(uint2 &p, int j, unsigned byte) {
  if (j < 4) p.x |= byte << (8 * j);
  else p.y |= byte << (8 * (j - 4));
}

// The format's nearest value to v (ties to even), saturating at its largest finite value, as
// its bits: MANT mantissa bits, exponent bias BIAS, smallest normal exponent 1 - BIAS.
template <int MANT, int BIAS, int MAXBITS>
__device__ __forceinline__ unsigned char to_float8(float v, float largest) {
  unsigned sign = (__float_as_uint(v) >> 24) & 0x80u;
  float a = fabsf(v);
  if (a != a) return (unsigned char)(sign | 0x7fu);
  a = fminf(a, largest);
  float smallest_normal = __uint_as_float((unsigned)(127 + 1 - BIAS) << 23);
  if (a < smallest_normal) {  // subnormal: multiples of 2^(1 - BIAS - MANT)
    float steps = a * __uint_as_float((unsigned)(127 - (1 - BIAS - MANT)) << 23);
    return (unsigned char)(sign | (unsigned)__float2int_rn(steps));
  }
  unsigned bits = __float_as_uint(a);
  const int drop = 23 - MANT;
  bits += ((1u << (drop - 1)) - 1u) + ((bits >> drop) & 1u);
  bits &= ~((1u << drop) - 1u);
  unsigned exponent = (bits >> 23) - 127 + BIAS;
  unsigned result = (exponent << MANT) | ((bits >> drop) & ((1u << MANT) - 1u));
  return (unsigned char)(sign | (result > MAXBITS ? MAXBITS : result));
}
__device__ __forceinline__ unsigned char to_e4m3(float v) {
  return to_float8<3, 7, 0x7e>(v, 448.0f);
}
__device__ __forceinline__ unsigned char to_e5m2(float v) {
  return to_float8<2, 15, 0x7b>(v, 57344.0f);
}

// Thread o (0 or 1): operand o's inverse scale and scale from its amax, at scales + o * stride
// (the inverse first: cuBLASLt's scale pointer, aligned). A NaN amax gives a scale of 1.
extern "C" __global__ void fp8_scale(
    const float *amax0, const float *amax1, float largest0, float largest1, float *scales,
    int stride) {
  int o = threadIdx.x;
  if (o > 1) return;
  float m = o ? *amax1 : *amax0, largest = o ? largest1 : largest0;
  float scale = (m > 0.0f && m <= 3.402823466e38f) ? largest / m : 1.0f;
  scales[o * stride] = 1.0f / scale;
  scales[o * stride + 1] = scale;
}
"""

_PER_FORMAT = r"""
// A grid-stride over 16-byte chunks where x is aligned to 16 bytes (CHUNK_TYPE bytes out: q is
// aligned to 8), then element by element.
extern "C" __global__ void fp8_quantize_TYPE_FORMAT(
    const ELEMENT *x, long long n, const float *scales, unsigned char *q) {
  float scale = scales[1];
  long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long step = (long long)gridDim.x * blockDim.x;
  long long chunks = aligned16(x) ? n / CHUNK_TYPE : 0;
  for (long long i = first; i < chunks; i += step) {
    uint4 c = ((const uint4 *)x)[i];
    packed_TYPE p = {};
#pragma unroll
    for (int j = 0; j < CHUNK_TYPE; ++j) pack(p, j, to_FORMAT(chunk_TYPE(c, j) * scale));
    ((packed_TYPE *)q)[i] = p;
  }
  for (long long i = chunks * CHUNK_TYPE + first; i < n; i += step)
    q[i] = to_FORMAT(load_TYPE(x, i) * scale);
}

// x [rows, cols] -> q [cols, rows]: a block moves one TILE x TILE tile through shared memory,
// quantised on the way in (16-byte loads where x and cols allow) and written out 8 bytes at a
// time where rows is a multiple of 8 (q is aligned to 8).
extern "C" __global__ void fp8_quantize_transposed_TYPE_FORMAT(
    const ELEMENT *x, long long rows, long long cols, const float *scales, unsigned char *q) {
  __shared__ uint2 words[TILE * (TILE + 8) / 8];  // 8-byte aligned for the stores below
  unsigned char(*tile)[TILE + 8] = (unsigned char(*)[TILE + 8])words;  // [col][row], as q
  float scale = scales[1];
  long long r0 = (long long)blockIdx.y * TILE, c0 = (long long)blockIdx.x * TILE;
  bool whole_chunks = aligned16(x) && cols % CHUNK_TYPE == 0;
  for (int i = threadIdx.x; i < TILE * TILE / CHUNK_TYPE; i += THREADS) {
    int row = i / (TILE / CHUNK_TYPE), col = (i % (TILE / CHUNK_TYPE)) * CHUNK_TYPE;
    long long r = r0 + row, c = c0 + col;
    if (r >= rows) continue;
    if (whole_chunks && c + CHUNK_TYPE <= cols) {
      uint4 v = *(const uint4 *)(x + r * cols + c);
#pragma unroll
      for (int j = 0; j < CHUNK_TYPE; ++j)
        tile[col + j][row] = to_FORMAT(chunk_TYPE(v, j) * scale);
    } else {
      for (int j = 0; j < CHUNK_TYPE && c + j < cols; ++j)
        tile[col + j][row] = to_FORMAT(load_TYPE(x, r * cols + c + j) * scale);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < TILE * TILE / 8; i += THREADS) {
    int col = i / (TILE / 8), row = (i % (TILE / 8)) * 8;
    long long c = c0 + col, r = r0 + row;
    if (c >= cols) continue;
    unsigned char *out = q + c * rows + r;
    if (rows % 8 == 0 && r + 8 <= rows) {
      *(uint2 *)out = *(const uint2 *)&tile[col][row];
    } else {
      for (int j = 0; j < 8 && r + j < rows; ++j) out[j] = tile[col][row + j];
    }
  }
}
"""

FORMATS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def kernel_source() -> str:
    """The CUDA C of every FP8 quantisation kernel (each element type, each format)."""
    parts = [_PRELUDE]
    for type_name, element in ELEMENT_TYPES.items():
        for short in FORMATS.values():
            source = _PER_FORMAT.replace("TYPE", type_name).replace("ELEMENT", element)
            parts.append(source.replace("FORMAT", short))
    return "\n".join(parts)


@memoized("fp8 gemm modules", "kernels_max_entries")
def _module(ordinal: int) -> Any:
    import cupy

    with cupy.cuda.Device(ordinal):
        return binaries.module(kernel_source(), ("-std=c++17",), ordinal)


# -- cuBLASLt -------------------------------------------------------------------------------------


class Issuer:
    """Enqueues one `Fp8Gemm` on the bound stream (see `accy.kernel.call.LibraryStep`); the
    quantisation kernels launch on CuPy's current stream, which the caller makes that stream.

    `cublasLtMatmul` is given no algorithm: cuBLASLt chooses one for the actual pointers
    (their alignment included) when the call is issued, which is once, while the program's
    graph is captured. Loading runs it once on buffers of its own (`_warm_up`), with fast
    accumulation where Transformer Engine uses it and, should cuBLASLt refuse that, without."""

    def __init__(self, step: Fp8Gemm, module: Any, library: tuple[ctypes.CDLL, c_void_p]):
        self.step = step
        self.lib, self.handle = library
        self.stream = 0
        self.find_kernels(module)
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._describe_matmul()
        self._warm_up()

    def find_kernels(self, module: Any) -> None:
        """The quantisation kernels of the step, from `module` (compiled `kernel_source`)."""
        step = self.step
        self.scale = module.get_function("fp8_scale")
        self.quantize = {}
        for name, operand in (("first", step.first), ("second", step.second)):
            kind = "quantize_transposed" if operand.transposed else "quantize"
            short = FORMATS[operand.format]
            self.quantize[name] = module.get_function(f"fp8_{kind}_{operand.dtype}_{short}")

    def _describe_matmul(self) -> None:
        s, lib = self.step, self.lib
        self.desc = matmul_descriptor(lib)
        self._set(TRANSA, c_int(OP_T))
        self._set(TRANSB, c_int(OP_N))
        if lib.cublasLtGetVersion() >= SCALE_MODES_SINCE:  # the default, set as torch sets it
            self._set(A_SCALE_MODE, c_int(SCALAR_32F))
            self._set(B_SCALE_MODE, c_int(SCALAR_32F))
        result = (CUDA_TYPES[s.out], s.n, s.m, s.n)  # the result, n x m column-major
        shapes = (
            (CUDA_TYPES[s.second.format], s.k, s.n, s.k),  # cuBLAS's A: second, k x n, T
            (CUDA_TYPES[s.first.format], s.k, s.m, s.k),  # cuBLAS's B: first, k x m, N
            result,  # C
            result,  # D: a descriptor of its own (see `_matmul`)
        )
        self.layouts = [matrix_layout(lib, *shape) for shape in shapes]

    def _warm_up(self) -> None:
        """One matmul outside any capture, on zeroed buffers: the configuration cuBLASLt
        runs (fast accumulation or not) is found here, not inside a capture."""
        import cupy

        s = self.step
        first = cupy.zeros(s.m * s.k, cupy.uint8)
        second = cupy.zeros(s.n * s.k, cupy.uint8)
        result = cupy.zeros(s.m * s.n * (4 if s.out == "f32" else 2), cupy.uint8)
        scales = cupy.ones(2 * ALIGN // 4, cupy.float32)
        workspace = cupy.zeros(WORKSPACE_BYTES, cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        statuses = []
        for fast in (s.fast_accumulate, False)[: 1 + s.fast_accumulate]:
            self._set(FAST_ACCUMULATE, ctypes.c_int8(1 if fast else 0))
            pointers = (first.data.ptr, second.data.ptr, result.data.ptr, scales.data.ptr)
            status = self._matmul(*pointers, workspace.data.ptr, stream.ptr)
            stream.synchronize()
            statuses.append(status)
            if status == 0:
                self.fast = fast
                return
        raise AccyError(
            f"cuBLASLt runs no FP8 GEMM for {s} (cublasLtMatmul statuses {statuses}, with and "
            "without fast accumulation)"
        )

    def _set(self, attribute: int, value: Any) -> None:
        set_attribute(self.lib, self.desc, attribute, value)

    def _matmul(self, first: int, second: int, dst: int, scales: int, workspace: int, stream):
        """`cublasLtMatmul` of the quantised operands at `first` and `second` into `dst`, the
        inverse scales at `scales` (first's) and `scales` + ALIGN (second's); its status."""
        self._set(A_SCALE, c_void_p(scales + ALIGN))  # cuBLAS's A is the second operand
        self._set(B_SCALE, c_void_p(scales))
        a, b, c, d = self.layouts
        # C is D (beta is 0: C is never read), D with a descriptor of its own as torch gives it;
        # one descriptor for both ran as well on the H200 once the scale pointers were aligned.
        return self.lib.cublasLtMatmul(
            self.handle,
            self.desc,
            ctypes.byref(self.alpha),
            c_void_p(second),
            a,
            c_void_p(first),
            b,
            ctypes.byref(self.beta),
            c_void_p(dst),
            c,
            c_void_p(dst),
            d,
            None,
            c_void_p(workspace),
            c_size_t(WORKSPACE_BYTES),
            c_void_p(stream),
        )

    def bind(self, stream: int) -> None:
        """The stream `cublasLtMatmul` is issued on."""
        self.stream = stream

    def issue(self, dst: int, operands: Sequence[int], scratch: int) -> None:
        import numpy as np

        s = self.step
        base = -(-scratch // ALIGN) * ALIGN
        at = {name: base + offset for name, offset in s.offsets.items()}
        x = [np.uint64(pointer) for pointer in operands[:2]]
        amaxes = [np.uint64(pointer) for pointer in operands[2:]]
        n = [np.int64(s.m * s.k), np.int64(s.n * s.k)]
        largest = [np.float32(float8_format(o.format).max) for o in (s.first, s.second)]
        self.scale((1,), (32,), (*amaxes, *largest, np.uint64(at["scales"]), np.int32(ALIGN // 4)))
        sizes = {"first": (s.m, s.k), "second": (s.n, s.k)}
        for index, name in enumerate(("first", "second")):
            operand, quantize = getattr(s, name), self.quantize[name]
            free, k = sizes[name]
            scales, target = np.uint64(at["scales"] + index * ALIGN), np.uint64(at[name])
            if operand.transposed:  # stored [k, free]: tiles to [free, k]
                grid = (-(-free // TILE), -(-k // TILE))
                rows, cols = np.int64(k), np.int64(free)
                quantize(grid, (THREADS,), (x[index], rows, cols, scales, target))
            else:
                chunk = 16 // dtype_named(operand.dtype).itemsize  # values a thread loads
                blocks = min(-(-(free * k) // (THREADS * chunk)), QUANTIZE_BLOCKS)
                quantize((blocks,), (THREADS,), (x[index], n[index], scales, target))
        self._set(FAST_ACCUMULATE, ctypes.c_int8(1 if self.fast else 0))
        status = self._matmul(
            at["first"], at["second"], dst, at["scales"], at["workspace"], self.stream
        )
        check(status, f"cublasLtMatmul FP8 {s.m}x{s.n}x{s.k}")
