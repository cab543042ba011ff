"""The C every generated translation unit starts with, one text per target.

A prelude is the target's own definitions (`GCC_TARGET`, `CUDA_TARGET`: integer types, the
infinities, the function qualifier `ACCY_FN`, bit casts, the half type) followed by the helpers
written once for every target (`HELPERS`): index clamping, saturating conversion, bf16, logistic.
It is include-guarded, so that any number of programs and kernels share one translation unit.
"""

from __future__ import annotations

GCC_TARGET = r"""
/* No system headers: parsing <math.h>, <stdint.h> and <string.h> is a third of the compile
   time of a small program. These are the few names generated code uses, declared with glibc's
   types (a translation unit that includes the headers first keeps their macros). GCC still
   treats the math and memory functions as its builtins (sqrtf inlines, memcpy of 4 bytes is a
   move). */
typedef __INT8_TYPE__ int8_t;
typedef __INT16_TYPE__ int16_t;
typedef __INT32_TYPE__ int32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __UINT64_TYPE__ uint64_t;
typedef __SIZE_TYPE__ size_t;
void *memcpy(void *, const void *, size_t);
void *memset(void *, int, size_t);
#define ACCY_MATH(name) float name##f(float); double name(double);
ACCY_MATH(exp) ACCY_MATH(log) ACCY_MATH(log1p) ACCY_MATH(expm1)
ACCY_MATH(sin) ACCY_MATH(cos) ACCY_MATH(tan) ACCY_MATH(tanh)
ACCY_MATH(sqrt) ACCY_MATH(fabs) ACCY_MATH(floor) ACCY_MATH(ceil)
ACCY_MATH(rint)
float powf(float, float);
double pow(double, double);
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#endif
#ifndef INT64_MIN
#define INT64_MIN (-9223372036854775807LL - 1)
#endif

#define ACCY_FN static inline
ACCY_FN uint32_t accy_float_bits(float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  return bits;
}
ACCY_FN float accy_float_from_bits(uint32_t bits) {
  float x;
  memcpy(&x, &bits, 4);
  return x;
}
#define accy_round_f16(x) ((float)(_Float16)(x))
"""

CUDA_TARGET = r"""
/* Needs no header under NVRTC (no CUDA include path at run time), and compiles with
   `nvcc -ptx` too. */
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
ACCY_FN uint32_t accy_float_bits(float x) { return __float_as_uint(x); }
ACCY_FN float accy_float_from_bits(uint32_t bits) { return __uint_as_float(bits); }

/* Half precision through PTX's round-to-nearest-even `cvt` (cuda_fp16.h needs include paths). */
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
/* The f16 storage type: 16 bits that convert to and from float as C's _Float16 does. */
struct __align__(2) accy_half {
  unsigned short bits;
  accy_half() = default;
  __device__ accy_half(float x) : bits(accy_float_to_half(x)) {}
  __device__ accy_half(double x) : bits(accy_double_to_half(x)) {}
  template <typename T>
  __device__ accy_half(T x) : bits(accy_float_to_half((float)x)) {}
  __device__ operator float() const { return accy_half_to_float(bits); }
};
#define accy_round_f16(x) ((float)(accy_half)(x))
"""

HELPERS = r"""
#define ACCY_CLAMP(i, high) ((i) < 0 ? 0 : (i) > (high) ? (high) : (i))
/* float -> integer: truncate, NaN -> 0, saturate at the bounds (as the reference does). */
#define ACCY_SATURATE(x, low, high, T) \
  ((x) != (x) ? (T)0 : (x) <= (low) ? (T)(low) : (x) >= (high) ? (T)(high) : (T)(x))

ACCY_FN float accy_bf16_load(uint16_t bits) {
  return accy_float_from_bits((uint32_t)bits << 16);
}
/* Round to nearest even, as the reference's round_to_bf16; NaN stays a (quiet) NaN. */
ACCY_FN uint16_t accy_bf16_store(float x) {
  uint32_t bits = accy_float_bits(x);
  if (x != x) return (uint16_t)((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}
ACCY_FN float accy_round_bf16(float x) {
  return accy_bf16_load(accy_bf16_store(x));
}

/* Written with exp of a non-positive number, so that neither branch overflows. */
ACCY_FN float accy_logisticf(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
ACCY_FN double accy_logistic(double x) {
  const double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}
"""


def prelude(target: str) -> str:
    """The include-guarded prelude of a target's definitions `target`.

    >>> text = prelude(GCC_TARGET)
    >>> text.startswith("#ifndef ACCY_PRELUDE") and text.count("accy_logisticf(float x)")
    1
    """
    return (
        "#ifndef ACCY_PRELUDE\n#define ACCY_PRELUDE 1\n"
        + target.strip()
        + "\n"
        + HELPERS
        + "#endif /* ACCY_PRELUDE */\n"
    )
