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
ACCY_MATH(rint) ACCY_MATH(asin) ACCY_MATH(acos) ACCY_MATH(atan)
ACCY_MATH(sinh) ACCY_MATH(cosh) ACCY_MATH(asinh) ACCY_MATH(acosh) ACCY_MATH(atanh)
ACCY_MATH(erf) ACCY_MATH(erfc) ACCY_MATH(lgamma)
#define ACCY_MATH2(name) float name##f(float, float); double name(double, double);
ACCY_MATH2(pow) ACCY_MATH2(atan2) ACCY_MATH2(fmod) ACCY_MATH2(copysign)
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
ACCY_FN uint64_t accy_double_bits(double x) {
  uint64_t bits;
  memcpy(&bits, &x, 8);
  return bits;
}
ACCY_FN double accy_double_from_bits(uint64_t bits) {
  double x;
  memcpy(&x, &bits, 8);
  return x;
}
#define accy_round_f16(x) ((float)(_Float16)(x))
/* exp, with an input below -104 (-746 in double), whose exp is +0, replaced by 0 before the
   call and the result by +0 after it: libmvec's vector exp sends a vector with any lane
   outside its fast range (|x| > 87 in float) through a scalar call per lane, and a masked
   softmax's -inf lanes made that most of its exp loop's time (4 to 7 times the unmasked
   loop's). The same bits as exp(x), NaN included (!(NaN < t) keeps it). Masked by bits, not
   by two ?: on one condition, which GCC's jump threading folds back into exp(x). */
ACCY_FN float accy_expf(float x) {
  const uint32_t keep = 0u - (uint32_t)!(x < -104.0f);
  const float e = expf(accy_float_from_bits(accy_float_bits(x) & keep));
  return accy_float_from_bits(accy_float_bits(e) & keep);
}
ACCY_FN double accy_exp(double x) {
  const uint64_t keep = 0ull - (uint64_t)!(x < -746.0);
  const double e = exp(accy_double_from_bits(accy_double_bits(x) & keep));
  return accy_double_from_bits(accy_double_bits(e) & keep);
}
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
ACCY_FN uint64_t accy_double_bits(double x) { return (uint64_t)__double_as_longlong(x); }
ACCY_FN double accy_double_from_bits(uint64_t bits) {
  return __longlong_as_double((long long)bits);
}
/* No vector math library here: exp is exp (the CPU's accy_expf guards libmvec's). */
ACCY_FN float accy_expf(float x) { return expf(x); }
ACCY_FN double accy_exp(double x) { return exp(x); }
/* exp(x) for x <= 0 added to a sum that holds exp(0) = 1: a softmax row's running sum
   (accy.backends.cuda.reductions.OnlineSum). One multiply and the base-2 exponential unit
   (2 ulp), where expf takes about 12 instructions, which bound the cross-entropy over GPT-2's
   50,304 classes (its forward chain took 389 us with expf, 260 with this). Rounding
   x * log2(e) adds a relative error of |x| 2^-24 to a term whose share of the sum is
   p = exp(x) / sum; the shares' sum of p |x| is at most log(n) for n terms, so a row of up to
   2^20 terms stays within about 2^-20 (relative) of its exact sum (the rescalings by
   exp(old max - new max) err alike). exp(-inf) is +0, NaN stays NaN. */
ACCY_FN float accy_softmax_expf(float x) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * 1.4426950408889634f));
  return e;
}

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
/* Round to nearest even, as the reference's round_to_bf16; NaN stays a (quiet) NaN. GPUs
   from sm_80 on round in one instruction: a bf16 chain rounds after every operation (as the
   reference does), so the software rounding made such kernels compute-bound. */
ACCY_FN uint16_t accy_bf16_store(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint16_t bits;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
  return bits;
#else
  uint32_t bits = accy_float_bits(x);
  if (x != x) return (uint16_t)((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
#endif
}
ACCY_FN float accy_round_bf16(float x) {
  return accy_bf16_load(accy_bf16_store(x));
}

/* Written with exp of a non-positive number, so that neither branch overflows (and through
   accy_expf: a saturated input is -|x| < -104 there). */
ACCY_FN float accy_logisticf(float x) {
  const float e = accy_expf(-fabsf(x));
  return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
ACCY_FN double accy_logistic(double x) {
  const double e = accy_exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

/* GELU's tanh approximation and its derivative: the reference's operations in its order
   (accy.core.kinds.elementwise: _gelu_tanh, _gelu_tanh_slope). */
#define ACCY_GELU_SCALE 0.7978845608028654
#define ACCY_GELU_CUBIC 0.044715
ACCY_FN float accy_gelu_tanhf(float x) {
  const float u = (float)ACCY_GELU_SCALE * (x + (float)ACCY_GELU_CUBIC * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
ACCY_FN double accy_gelu_tanh(double x) {
  const double u = ACCY_GELU_SCALE * (x + ACCY_GELU_CUBIC * x * x * x);
  return 0.5 * x * (1.0 + tanh(u));
}
ACCY_FN float accy_gelu_tanh_slopef(float x) {
  const float t = tanhf((float)ACCY_GELU_SCALE * (x + (float)ACCY_GELU_CUBIC * x * x * x));
  const float du = (float)ACCY_GELU_SCALE * (1.0f + (float)(3 * ACCY_GELU_CUBIC) * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}
ACCY_FN double accy_gelu_tanh_slope(double x) {
  const double t = tanh(ACCY_GELU_SCALE * (x + ACCY_GELU_CUBIC * x * x * x));
  const double du = ACCY_GELU_SCALE * (1.0 + 3 * ACCY_GELU_CUBIC * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

/* erf_inv, digamma and trigamma: the algorithms of accy.core.kinds.special (the reference),
   step for step, in double precision. */
ACCY_FN double accy_erf_inv(double x) {
  if (!(fabs(x) < 1.0)) return fabs(x) == 1.0 ? x * INFINITY : NAN;
  const double w = -log((1.0 - x) * (1.0 + x));
  double y;
  if (w < 5.0) {
    const double v = w - 2.5;
    double p = 2.81022636e-08;
    p = 3.43273939e-07 + p * v; p = -3.5233877e-06 + p * v; p = -4.39150654e-06 + p * v;
    p = 0.00021858087 + p * v; p = -0.00125372503 + p * v; p = -0.00417768164 + p * v;
    p = 0.246640727 + p * v; p = 1.50140941 + p * v;
    y = p * x;
  } else {
    const double v = sqrt(w) - 3.0;
    double q = -0.000200214257;
    q = 0.000100950558 + q * v; q = 0.00134934322 + q * v; q = -0.00367342844 + q * v;
    q = 0.00573950773 + q * v; q = -0.0076224613 + q * v; q = 0.00943887047 + q * v;
    q = 1.00167406 + q * v; q = 2.83297682 + q * v;
    y = q * x;
  }
  /* Two Newton steps on erf(y) = x. */
  y = y - (erf(y) - x) / (1.1283791670955126 * exp(-y * y));
  y = y - (erf(y) - x) / (1.1283791670955126 * exp(-y * y));
  return y;
}
#define ACCY_PI 3.141592653589793
ACCY_FN double accy_digamma(double x) {
  if (x != x || (x <= 0.0 && x == floor(x))) return NAN;
  double shift = 0.0, steps = 0.0;
  if (x < 0.5) { shift = -ACCY_PI / tan(ACCY_PI * x); x = 1.0 - x; }
  while (x < 10.0) { steps = steps + 1.0 / x; x = x + 1.0; }
  const double r = 1.0 / (x * x);
  const double series =
      r * (1.0 / 12 - r * (1.0 / 120 - r * (1.0 / 252 - r * (1.0 / 240 - r * (1.0 / 132)))));
  return shift - steps + (log(x) - 0.5 / x - series);
}
ACCY_FN double accy_trigamma(double x) {
  if (x != x || (x <= 0.0 && x == floor(x))) return NAN;
  double shift = 0.0, sign = 1.0, steps = 0.0;
  if (x < 0.5) {
    const double s = sin(ACCY_PI * x);
    shift = ACCY_PI * ACCY_PI / (s * s); sign = -1.0; x = 1.0 - x;
  }
  while (x < 10.0) { steps = steps + 1.0 / (x * x); x = x + 1.0; }
  const double r = 1.0 / (x * x);
  const double series =
      (1.0 / x) * r * (1.0 / 6 - r * (1.0 / 30 - r * (1.0 / 42 - r * (1.0 / 30 - r * (5.0 / 66)))));
  return shift + sign * (steps + (1.0 / x + 0.5 * r + series));
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
