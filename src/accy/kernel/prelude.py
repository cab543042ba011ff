"""Helper functions every generated kernel may call, shared by the C and CUDA C lowerings.

The prelude is guarded, so several kernels can sit in one translation unit. It needs no header
under CUDA (NVRTC has none) and only <math.h> in C; the few differences (bit casts, infinities)
sit behind `__CUDACC__`, which both nvcc and NVRTC define.
"""

from __future__ import annotations

_BACKEND = """\
#if defined(__CUDACC__)
#define ACCY_FN static __device__ __forceinline__
#define ACCY_INF_F32 __int_as_float(0x7f800000)
#define ACCY_NAN_F32 __int_as_float(0x7fc00000)
#define ACCY_INF_F64 __longlong_as_double(0x7ff0000000000000LL)
#define ACCY_NAN_F64 __longlong_as_double(0x7ff8000000000000LL)
ACCY_FN unsigned int accy_f32_bits(float x) { return __float_as_uint(x); }
ACCY_FN float accy_f32_from_bits(unsigned int bits) { return __uint_as_float(bits); }
#else
#include <math.h>
#define ACCY_FN static inline
#define ACCY_INF_F32 ((float)INFINITY)
#define ACCY_NAN_F32 ((float)NAN)
#define ACCY_INF_F64 ((double)INFINITY)
#define ACCY_NAN_F64 ((double)NAN)
/* A union is C's sanctioned way to reinterpret bits (memcpy would need <string.h>). */
ACCY_FN unsigned int accy_f32_bits(float x) {
  union { float f; unsigned int u; } v;
  v.f = x;
  return v.u;
}
ACCY_FN float accy_f32_from_bits(unsigned int bits) {
  union { float f; unsigned int u; } v;
  v.u = bits;
  return v.f;
}
#endif
"""

# Half precision by hand: cuda_fp16.h is not available to NVRTC without include paths, and one
# implementation for both backends is tested once, on the CPU.
_HALF = """\
ACCY_FN float accy_f16_to_f32(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16;
  unsigned int exponent = (h >> 10) & 0x1fu;
  unsigned int mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return accy_f32_from_bits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0u) {
    float magnitude = (float)mantissa * 5.9604644775390625e-8f; /* subnormal: m * 2^-24 */
    return sign ? -magnitude : magnitude;
  }
  return accy_f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
ACCY_FN unsigned short accy_f32_to_f16(float x) {
  unsigned int bits = accy_f32_bits(x);
  unsigned int sign = (bits >> 16) & 0x8000u;
  unsigned int magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);  /* NaN */
  if (magnitude >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u); /* >= 65520: inf */
  if (magnitude < 0x38800000u) {
    /* Below 2^-14 the result is subnormal: a multiple of 2^-24, rounded half to even. */
    float units = accy_f32_from_bits(magnitude) * 16777216.0f;
    return (unsigned short)(sign | (unsigned int)rintf(units));
  }
  /* Rebias the exponent (127 -> 15) and round 23 mantissa bits to 10, half to even. */
  unsigned int rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return (unsigned short)(sign | ((rounded - 0x38000000u) >> 13));
}
ACCY_FN float accy_bf16_to_f32(unsigned short h) {
  return accy_f32_from_bits((unsigned int)h << 16);
}
ACCY_FN unsigned short accy_f32_to_bf16(float x) {
  unsigned int bits = accy_f32_bits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);
  return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
ACCY_FN float accy_round_f16(float x) { return accy_f16_to_f32(accy_f32_to_f16(x)); }
ACCY_FN float accy_round_bf16(float x) { return accy_bf16_to_f32(accy_f32_to_bf16(x)); }
"""

_MATH = """\
/* Written with exp of a non-positive number so that neither branch overflows. */
ACCY_FN float accy_logisticf(float x) {
  float e = expf(-fabsf(x));
  return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
ACCY_FN double accy_logistic(double x) {
  double e = exp(-fabs(x));
  return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}
"""

# Integer division as accy defines it: truncation, 0 for a zero divisor, and the one overflowing
# quotient (MIN / -1) wrapping instead of trapping.
_DIVISION = """\
ACCY_FN int accy_div_i32(int a, int b) {
  return b == 0 ? 0 : (b == -1 ? (int)(0u - (unsigned int)a) : a / b);
}
ACCY_FN long long accy_div_i64(long long a, long long b) {
  return b == 0 ? 0 : (b == -1 ? (long long)(0ull - (unsigned long long)a) : a / b);
}
ACCY_FN unsigned char accy_div_u8(unsigned char a, unsigned char b) {
  return b == 0 ? (unsigned char)0 : (unsigned char)(a / b);
}
"""

# Float-to-integer casts saturate (and send NaN to 0): C leaves out-of-range conversions
# undefined, and a kernel must not have undefined behaviour on any input.
# (integer dtype, C type, lowest, highest, the float bounds outside which the cast saturates)
_SATURATING = (
    ("i32", "int", "(-2147483647 - 1)", "2147483647", "-2147483648.0", "2147483648.0"),
    ("i64", "long long", "(-9223372036854775807LL - 1LL)", "9223372036854775807LL",
     "-9223372036854775808.0", "9223372036854775808.0"),
    ("u8", "unsigned char", "0", "255", "-1.0", "256.0"),
)  # fmt: skip
_FLOATS = (("f32", "float", "f"), ("f64", "double", ""))


def _saturating_cast(source: tuple[str, str, str], target: tuple[str, ...]) -> str:
    family, ftype, suffix = source
    name, itype, lowest, highest, below, above = target
    return (
        f"ACCY_FN {itype} accy_{family}_to_{name}({ftype} x) {{\n"
        f"  if (x != x) return ({itype})0;\n"
        f"  if (x <= {below}{suffix}) return ({itype}){lowest};\n"
        f"  if (x >= {above}{suffix}) return ({itype}){highest};\n"
        f"  return ({itype})x;\n"
        f"}}\n"
    )


_CASTS = "".join(_saturating_cast(s, t) for s in _FLOATS for t in _SATURATING)

PRELUDE = (
    "#ifndef ACCY_KERNEL_PRELUDE\n#define ACCY_KERNEL_PRELUDE 1\n"
    + _BACKEND
    + _HALF
    + _MATH
    + _DIVISION
    + _CASTS
    + "#endif /* ACCY_KERNEL_PRELUDE */\n"
)
