"""The CUDA prelude: the C dialect of the CPU expression generator, defined for the device.

`accy.backends.cpu.expressions` writes C with a few names of its own (`ACCY_CPU_CLAMP`,
`accy_cpu_round_f16`, `accy_cpu_bf16_load`, ...), C99's `INFINITY`/`NAN`/`int64_t`, and
`_Float16` for half-precision storage. This prelude gives each of them a device meaning, so the
same expression code serves both backends: `_Float16` becomes a 2-byte struct that converts to
and from float (through PTX's round-to-nearest-even `cvt`), and the helpers become
`__device__` functions. It needs no header under NVRTC (no CUDA include path at run time) and
compiles with `nvcc -ptx` too, which CI uses to check generated code.

Beyond the dialect: warp and block reductions, and atomic adds on 1-byte values.
"""

from __future__ import annotations

PRELUDE = r"""
/* accy CUDA prelude: the CPU expression dialect on the device. */
#ifndef ACCY_CUDA_PRELUDE
#define ACCY_CUDA_PRELUDE 1
#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#define INT64_MIN (-9223372036854775807LL - 1LL)
#else
#include <stdint.h>
#endif
#undef INFINITY
#undef NAN
/* Constant expressions, so that they may initialize __device__ arrays. */
#define INFINITY __builtin_bit_cast(float, 0x7f800000u)
#define NAN __builtin_bit_cast(float, 0x7fc00000u)

#define ACCY_FN static __device__ __forceinline__
#define ACCY_CPU_CLAMP(i, high) ((i) < 0 ? 0 : (i) > (high) ? (high) : (i))
/* float -> integer: truncate, NaN -> 0, saturate at the bounds (as the reference does). */
#define ACCY_CPU_SATURATE(x, low, high, T) \
  ((x) != (x) ? (T)0 : (x) <= (low) ? (T)(low) : (x) >= (high) ? (T)(high) : (T)(x))

ACCY_FN float accy_half_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
ACCY_FN unsigned short accy_float_to_half(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
ACCY_FN unsigned short accy_double_to_half(double d) {
  unsigned short h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d));
  return h;
}

/* Half-precision storage: what C's _Float16 is to the CPU backend. */
struct __align__(2) accy_half {
  unsigned short bits;
  accy_half() = default;
  __device__ accy_half(float x) : bits(accy_float_to_half(x)) {}
  __device__ accy_half(double x) : bits(accy_double_to_half(x)) {}
  template <typename T>
  __device__ accy_half(T x) : bits(accy_float_to_half((float)x)) {}
  __device__ operator float() const { return accy_half_to_float(bits); }
};
#define _Float16 accy_half
#define accy_cpu_round_f16(x) ((float)(_Float16)(x))

ACCY_FN float accy_cpu_bf16_load(uint16_t bits) {
  return __uint_as_float((uint32_t)bits << 16);
}
/* Round to nearest even, as the reference's round_to_bf16; NaN stays a (quiet) NaN. */
ACCY_FN uint16_t accy_cpu_bf16_store(float x) {
  uint32_t bits = __float_as_uint(x);
  if (x != x) return (uint16_t)((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}
ACCY_FN float accy_cpu_round_bf16(float x) {
  return accy_cpu_bf16_load(accy_cpu_bf16_store(x));
}
/* Written with exp of a non-positive number, so that neither branch overflows. */
ACCY_FN float accy_cpu_logisticf(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
ACCY_FN double accy_cpu_logistic(double x) {
  const double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

/* Warp shuffles of every compute type (1-byte values travel as int). */
template <typename T>
ACCY_FN T accy_shfl_down(T x, int delta) {
  return __shfl_down_sync(0xffffffffu, x, delta);
}
ACCY_FN uint8_t accy_shfl_down(uint8_t x, int delta) {
  return (uint8_t)__shfl_down_sync(0xffffffffu, (int)x, delta);
}

/* Atomic updates of one byte, through a compare-and-swap of its aligned 32-bit word (the
   other three bytes are written back unchanged). */
ACCY_FN void accy_atomic_add_u8(uint8_t *address, uint8_t value) {
  unsigned int *word = (unsigned int *)((size_t)address & ~(size_t)3);
  const unsigned int shift = ((unsigned int)(size_t)address & 3u) * 8u;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    const unsigned int byte = ((assumed >> shift) + value) & 0xffu;
    old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
  } while (assumed != old);
}
ACCY_FN void accy_atomic_or_u8(uint8_t *address, uint8_t value) {
  unsigned int *word = (unsigned int *)((size_t)address & ~(size_t)3);
  atomicOr(word, (unsigned int)value << (((unsigned int)(size_t)address & 3u) * 8u));
}
#endif /* ACCY_CUDA_PRELUDE */
"""
