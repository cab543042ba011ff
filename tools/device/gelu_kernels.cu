#ifndef ACCY_PRELUDE
#define ACCY_PRELUDE 1
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

/* Written with exp of a non-positive number, so that neither branch overflows. */
ACCY_FN float accy_logisticf(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
ACCY_FN double accy_logistic(double x) {
  const double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
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
#endif /* ACCY_PRELUDE */

#ifndef ACCY_CUDA_PRELUDE
#define ACCY_CUDA_PRELUDE 1
/* Warp shuffles of every compute type (1-byte values travel as int). */
template <typename T>
ACCY_FN T accy_shfl_down(T x, int delta) {
  return __shfl_down_sync(0xffffffffu, x, delta);
}
ACCY_FN uint8_t accy_shfl_down(uint8_t x, int delta) {
  return (uint8_t)__shfl_down_sync(0xffffffffu, (int)x, delta);
}

/* `N` adjacent values loaded or stored as one struct: one instruction per 16 bytes
   (accy.backends.cuda.vectors), aligned to the whole vector up to 16 bytes. */
template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) accy_vector {
  T v[N];
};

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


extern "C" __global__ void __launch_bounds__(256) accy_k1780(void *const *__restrict__ io, char *__restrict__ ws, char *__restrict__ scratch) {
  const uint16_t *v0 = (const uint16_t *)((char *)io[0]);
  const float *__restrict__ v1 = (const float *)(char *)((char *)io[1]);
  uint16_t *__restrict__ v2 = (uint16_t *)((char *)io[2]);
  const bool vectorized = (((size_t)v0 & 15) | ((size_t)v1 & 15) | ((size_t)v2 & 15)) == 0;
  const int64_t vector_end = vectorized ? 25165824LL : 0LL;
  for (int64_t q = (int64_t)blockIdx.x * 256 + threadIdx.x; q < vector_end / 8; q += (int64_t)gridDim.x * 256) {
    const int64_t i = q * 8;
    const unsigned int i_u = (unsigned int)i;
    const int64_t i0 = (int64_t)(i_u / 3145728u);
    const int64_t i1 = (int64_t)(i_u / 3072u % 1024u);
    const int64_t i2 = (int64_t)(i_u % 3072u);
    const accy_vector<uint16_t, 8> t0 = *(const accy_vector<uint16_t, 8> *)(v0 + i0 * 3145728 + i1 * 3072 + i2);
    const float t1 = accy_bf16_load(t0.v[0]);
    const accy_vector<float, 8> t2 = *(const accy_vector<float, 8> *)(v1 + i2);
    const float t3 = t2.v[0];
    const float t4 = accy_round_bf16((float)(t3));
    const float t5 = accy_round_bf16(t1 + t4);
    const float t6 = accy_round_bf16(t5 * 0.5f);
    const float t7 = accy_round_bf16(t5 * t5);
    const float t8 = accy_round_bf16(t7 * t5);
    const float t9 = accy_round_bf16(t8 * 0.044677734375f);
    const float t10 = accy_round_bf16(t5 + t9);
    const float t11 = accy_round_bf16(t10 * 0.796875f);
    const float t12 = accy_round_bf16(tanhf(t11));
    const float t13 = accy_round_bf16(t12 + 1.0f);
    const float t14 = accy_round_bf16(t6 * t13);
    accy_vector<uint16_t, 8> t15;
    t15.v[0] = accy_bf16_store(t14);
    const float t16 = accy_bf16_load(t0.v[1]);
    const float t17 = t2.v[1];
    const float t18 = accy_round_bf16((float)(t17));
    const float t19 = accy_round_bf16(t16 + t18);
    const float t20 = accy_round_bf16(t19 * 0.5f);
    const float t21 = accy_round_bf16(t19 * t19);
    const float t22 = accy_round_bf16(t21 * t19);
    const float t23 = accy_round_bf16(t22 * 0.044677734375f);
    const float t24 = accy_round_bf16(t19 + t23);
    const float t25 = accy_round_bf16(t24 * 0.796875f);
    const float t26 = accy_round_bf16(tanhf(t25));
    const float t27 = accy_round_bf16(t26 + 1.0f);
    const float t28 = accy_round_bf16(t20 * t27);
    t15.v[1] = accy_bf16_store(t28);
    const float t29 = accy_bf16_load(t0.v[2]);
    const float t30 = t2.v[2];
    const float t31 = accy_round_bf16((float)(t30));
    const float t32 = accy_round_bf16(t29 + t31);
    const float t33 = accy_round_bf16(t32 * 0.5f);
    const float t34 = accy_round_bf16(t32 * t32);
    const float t35 = accy_round_bf16(t34 * t32);
    const float t36 = accy_round_bf16(t35 * 0.044677734375f);
    const float t37 = accy_round_bf16(t32 + t36);
    const float t38 = accy_round_bf16(t37 * 0.796875f);
    const float t39 = accy_round_bf16(tanhf(t38));
    const float t40 = accy_round_bf16(t39 + 1.0f);
    const float t41 = accy_round_bf16(t33 * t40);
    t15.v[2] = accy_bf16_store(t41);
    const float t42 = accy_bf16_load(t0.v[3]);
    const float t43 = t2.v[3];
    const float t44 = accy_round_bf16((float)(t43));
    const float t45 = accy_round_bf16(t42 + t44);
    const float t46 = accy_round_bf16(t45 * 0.5f);
    const float t47 = accy_round_bf16(t45 * t45);
    const float t48 = accy_round_bf16(t47 * t45);
    const float t49 = accy_round_bf16(t48 * 0.044677734375f);
    const float t50 = accy_round_bf16(t45 + t49);
    const float t51 = accy_round_bf16(t50 * 0.796875f);
    const float t52 = accy_round_bf16(tanhf(t51));
    const float t53 = accy_round_bf16(t52 + 1.0f);
    const float t54 = accy_round_bf16(t46 * t53);
    t15.v[3] = accy_bf16_store(t54);
    const float t55 = accy_bf16_load(t0.v[4]);
    const float t56 = t2.v[4];
    const float t57 = accy_round_bf16((float)(t56));
    const float t58 = accy_round_bf16(t55 + t57);
    const float t59 = accy_round_bf16(t58 * 0.5f);
    const float t60 = accy_round_bf16(t58 * t58);
    const float t61 = accy_round_bf16(t60 * t58);
    const float t62 = accy_round_bf16(t61 * 0.044677734375f);
    const float t63 = accy_round_bf16(t58 + t62);
    const float t64 = accy_round_bf16(t63 * 0.796875f);
    const float t65 = accy_round_bf16(tanhf(t64));
    const float t66 = accy_round_bf16(t65 + 1.0f);
    const float t67 = accy_round_bf16(t59 * t66);
    t15.v[4] = accy_bf16_store(t67);
    const float t68 = accy_bf16_load(t0.v[5]);
    const float t69 = t2.v[5];
    const float t70 = accy_round_bf16((float)(t69));
    const float t71 = accy_round_bf16(t68 + t70);
    const float t72 = accy_round_bf16(t71 * 0.5f);
    const float t73 = accy_round_bf16(t71 * t71);
    const float t74 = accy_round_bf16(t73 * t71);
    const float t75 = accy_round_bf16(t74 * 0.044677734375f);
    const float t76 = accy_round_bf16(t71 + t75);
    const float t77 = accy_round_bf16(t76 * 0.796875f);
    const float t78 = accy_round_bf16(tanhf(t77));
    const float t79 = accy_round_bf16(t78 + 1.0f);
    const float t80 = accy_round_bf16(t72 * t79);
    t15.v[5] = accy_bf16_store(t80);
    const float t81 = accy_bf16_load(t0.v[6]);
    const float t82 = t2.v[6];
    const float t83 = accy_round_bf16((float)(t82));
    const float t84 = accy_round_bf16(t81 + t83);
    const float t85 = accy_round_bf16(t84 * 0.5f);
    const float t86 = accy_round_bf16(t84 * t84);
    const float t87 = accy_round_bf16(t86 * t84);
    const float t88 = accy_round_bf16(t87 * 0.044677734375f);
    const float t89 = accy_round_bf16(t84 + t88);
    const float t90 = accy_round_bf16(t89 * 0.796875f);
    const float t91 = accy_round_bf16(tanhf(t90));
    const float t92 = accy_round_bf16(t91 + 1.0f);
    const float t93 = accy_round_bf16(t85 * t92);
    t15.v[6] = accy_bf16_store(t93);
    const float t94 = accy_bf16_load(t0.v[7]);
    const float t95 = t2.v[7];
    const float t96 = accy_round_bf16((float)(t95));
    const float t97 = accy_round_bf16(t94 + t96);
    const float t98 = accy_round_bf16(t97 * 0.5f);
    const float t99 = accy_round_bf16(t97 * t97);
    const float t100 = accy_round_bf16(t99 * t97);
    const float t101 = accy_round_bf16(t100 * 0.044677734375f);
    const float t102 = accy_round_bf16(t97 + t101);
    const float t103 = accy_round_bf16(t102 * 0.796875f);
    const float t104 = accy_round_bf16(tanhf(t103));
    const float t105 = accy_round_bf16(t104 + 1.0f);
    const float t106 = accy_round_bf16(t98 * t105);
    t15.v[7] = accy_bf16_store(t106);
    *(accy_vector<uint16_t, 8> *)(v2 + i) = t15;
  }
  for (int64_t i = vector_end + (int64_t)blockIdx.x * 256 + threadIdx.x; i < 25165824LL; i += (int64_t)gridDim.x * 256) {
    const unsigned int i_u = (unsigned int)i;
    const int64_t i0 = (int64_t)(i_u / 3145728u);
    const int64_t i1 = (int64_t)(i_u / 3072u % 1024u);
    const int64_t i2 = (int64_t)(i_u % 3072u);
    const float t107 = accy_bf16_load(v0[i0 * 3145728 + i1 * 3072 + i2]);
    const float t108 = v1[i2];
    const float t109 = accy_round_bf16((float)(t108));
    const float t110 = accy_round_bf16(t107 + t109);
    const float t111 = accy_round_bf16(t110 * 0.5f);
    const float t112 = accy_round_bf16(t110 * t110);
    const float t113 = accy_round_bf16(t112 * t110);
    const float t114 = accy_round_bf16(t113 * 0.044677734375f);
    const float t115 = accy_round_bf16(t110 + t114);
    const float t116 = accy_round_bf16(t115 * 0.796875f);
    const float t117 = accy_round_bf16(tanhf(t116));
    const float t118 = accy_round_bf16(t117 + 1.0f);
    const float t119 = accy_round_bf16(t111 * t118);
    v2[i] = accy_bf16_store(t119);
  }
  (void)io;
  (void)ws;
  (void)scratch;
}

extern "C" __global__ void __launch_bounds__(256) accy_k12389(void *const *__restrict__ io, char *__restrict__ ws, char *__restrict__ scratch) {
  const uint16_t *__restrict__ v0 = (const uint16_t *)((char *)io[0]);
  const uint16_t *v1 = (const uint16_t *)((char *)io[1]);
  const float *__restrict__ v2 = (const float *)(char *)((char *)io[2]);
  uint16_t *v3 = (uint16_t *)((char *)io[1]);
  const bool vectorized = (((size_t)v0 & 15) | ((size_t)v1 & 15) | ((size_t)v2 & 15) | ((size_t)v3 & 15)) == 0;
  const int64_t vector_end = vectorized ? 25165824LL : 0LL;
  for (int64_t q = (int64_t)blockIdx.x * 256 + threadIdx.x; q < vector_end / 8; q += (int64_t)gridDim.x * 256) {
    const int64_t i = q * 8;
    const unsigned int i_u = (unsigned int)i;
    const int64_t i0 = (int64_t)(i_u / 3145728u);
    const int64_t i1 = (int64_t)(i_u / 3072u % 1024u);
    const int64_t i2 = (int64_t)(i_u % 3072u);
    const accy_vector<uint16_t, 8> t0 = *(const accy_vector<uint16_t, 8> *)(v0 + i0 * 3145728 + i1 * 3072 + i2);
    const float t1 = accy_bf16_load(t0.v[0]);
    const accy_vector<uint16_t, 8> t2 = *(const accy_vector<uint16_t, 8> *)(v1 + i0 * 3145728 + i1 * 3072 + i2);
    const float t3 = accy_bf16_load(t2.v[0]);
    const accy_vector<float, 8> t4 = *(const accy_vector<float, 8> *)(v2 + i2);
    const float t5 = t4.v[0];
    const float t6 = accy_round_bf16((float)(t5));
    const float t7 = accy_round_bf16(t3 + t6);
    const float t8 = accy_round_bf16(t7 * t7);
    const float t9 = accy_round_bf16(t8 * t7);
    const float t10 = accy_round_bf16(t9 * 0.044677734375f);
    const float t11 = accy_round_bf16(t7 + t10);
    const float t12 = accy_round_bf16(t11 * 0.796875f);
    const float t13 = accy_round_bf16(tanhf(t12));
    const float t14 = accy_round_bf16(t13 + 1.0f);
    const float t15 = accy_round_bf16(t1 * t14);
    const float t16 = accy_round_bf16(t15 * 0.5f);
    const float t17 = accy_round_bf16(t7 * 0.5f);
    const float t18 = accy_round_bf16(t1 * t17);
    const float t19 = accy_round_bf16(t13 * t13);
    const float t20 = accy_round_bf16(1.0f - t19);
    const float t21 = accy_round_bf16(t18 * t20);
    const float t22 = accy_round_bf16(t21 * 0.796875f);
    const float t23 = accy_round_bf16(t16 + t22);
    const float t24 = accy_round_bf16(t22 * 0.044677734375f);
    const float t25 = accy_round_bf16(t24 * t8);
    const float t26 = accy_round_bf16(t23 + t25);
    const float t27 = accy_round_bf16(t24 * t7);
    const float t28 = accy_round_bf16(t27 * t7);
    const float t29 = accy_round_bf16(t26 + t28);
    const float t30 = accy_round_bf16(t29 + t28);
    accy_vector<uint16_t, 8> t31;
    t31.v[0] = accy_bf16_store(t30);
    const float t32 = accy_bf16_load(t0.v[1]);
    const float t33 = accy_bf16_load(t2.v[1]);
    const float t34 = t4.v[1];
    const float t35 = accy_round_bf16((float)(t34));
    const float t36 = accy_round_bf16(t33 + t35);
    const float t37 = accy_round_bf16(t36 * t36);
    const float t38 = accy_round_bf16(t37 * t36);
    const float t39 = accy_round_bf16(t38 * 0.044677734375f);
    const float t40 = accy_round_bf16(t36 + t39);
    const float t41 = accy_round_bf16(t40 * 0.796875f);
    const float t42 = accy_round_bf16(tanhf(t41));
    const float t43 = accy_round_bf16(t42 + 1.0f);
    const float t44 = accy_round_bf16(t32 * t43);
    const float t45 = accy_round_bf16(t44 * 0.5f);
    const float t46 = accy_round_bf16(t36 * 0.5f);
    const float t47 = accy_round_bf16(t32 * t46);
    const float t48 = accy_round_bf16(t42 * t42);
    const float t49 = accy_round_bf16(1.0f - t48);
    const float t50 = accy_round_bf16(t47 * t49);
    const float t51 = accy_round_bf16(t50 * 0.796875f);
    const float t52 = accy_round_bf16(t45 + t51);
    const float t53 = accy_round_bf16(t51 * 0.044677734375f);
    const float t54 = accy_round_bf16(t53 * t37);
    const float t55 = accy_round_bf16(t52 + t54);
    const float t56 = accy_round_bf16(t53 * t36);
    const float t57 = accy_round_bf16(t56 * t36);
    const float t58 = accy_round_bf16(t55 + t57);
    const float t59 = accy_round_bf16(t58 + t57);
    t31.v[1] = accy_bf16_store(t59);
    const float t60 = accy_bf16_load(t0.v[2]);
    const float t61 = accy_bf16_load(t2.v[2]);
    const float t62 = t4.v[2];
    const float t63 = accy_round_bf16((float)(t62));
    const float t64 = accy_round_bf16(t61 + t63);
    const float t65 = accy_round_bf16(t64 * t64);
    const float t66 = accy_round_bf16(t65 * t64);
    const float t67 = accy_round_bf16(t66 * 0.044677734375f);
    const float t68 = accy_round_bf16(t64 + t67);
    const float t69 = accy_round_bf16(t68 * 0.796875f);
    const float t70 = accy_round_bf16(tanhf(t69));
    const float t71 = accy_round_bf16(t70 + 1.0f);
    const float t72 = accy_round_bf16(t60 * t71);
    const float t73 = accy_round_bf16(t72 * 0.5f);
    const float t74 = accy_round_bf16(t64 * 0.5f);
    const float t75 = accy_round_bf16(t60 * t74);
    const float t76 = accy_round_bf16(t70 * t70);
    const float t77 = accy_round_bf16(1.0f - t76);
    const float t78 = accy_round_bf16(t75 * t77);
    const float t79 = accy_round_bf16(t78 * 0.796875f);
    const float t80 = accy_round_bf16(t73 + t79);
    const float t81 = accy_round_bf16(t79 * 0.044677734375f);
    const float t82 = accy_round_bf16(t81 * t65);
    const float t83 = accy_round_bf16(t80 + t82);
    const float t84 = accy_round_bf16(t81 * t64);
    const float t85 = accy_round_bf16(t84 * t64);
    const float t86 = accy_round_bf16(t83 + t85);
    const float t87 = accy_round_bf16(t86 + t85);
    t31.v[2] = accy_bf16_store(t87);
    const float t88 = accy_bf16_load(t0.v[3]);
    const float t89 = accy_bf16_load(t2.v[3]);
    const float t90 = t4.v[3];
    const float t91 = accy_round_bf16((float)(t90));
    const float t92 = accy_round_bf16(t89 + t91);
    const float t93 = accy_round_bf16(t92 * t92);
    const float t94 = accy_round_bf16(t93 * t92);
    const float t95 = accy_round_bf16(t94 * 0.044677734375f);
    const float t96 = accy_round_bf16(t92 + t95);
    const float t97 = accy_round_bf16(t96 * 0.796875f);
    const float t98 = accy_round_bf16(tanhf(t97));
    const float t99 = accy_round_bf16(t98 + 1.0f);
    const float t100 = accy_round_bf16(t88 * t99);
    const float t101 = accy_round_bf16(t100 * 0.5f);
    const float t102 = accy_round_bf16(t92 * 0.5f);
    const float t103 = accy_round_bf16(t88 * t102);
    const float t104 = accy_round_bf16(t98 * t98);
    const float t105 = accy_round_bf16(1.0f - t104);
    const float t106 = accy_round_bf16(t103 * t105);
    const float t107 = accy_round_bf16(t106 * 0.796875f);
    const float t108 = accy_round_bf16(t101 + t107);
    const float t109 = accy_round_bf16(t107 * 0.044677734375f);
    const float t110 = accy_round_bf16(t109 * t93);
    const float t111 = accy_round_bf16(t108 + t110);
    const float t112 = accy_round_bf16(t109 * t92);
    const float t113 = accy_round_bf16(t112 * t92);
    const float t114 = accy_round_bf16(t111 + t113);
    const float t115 = accy_round_bf16(t114 + t113);
    t31.v[3] = accy_bf16_store(t115);
    const float t116 = accy_bf16_load(t0.v[4]);
    const float t117 = accy_bf16_load(t2.v[4]);
    const float t118 = t4.v[4];
    const float t119 = accy_round_bf16((float)(t118));
    const float t120 = accy_round_bf16(t117 + t119);
    const float t121 = accy_round_bf16(t120 * t120);
    const float t122 = accy_round_bf16(t121 * t120);
    const float t123 = accy_round_bf16(t122 * 0.044677734375f);
    const float t124 = accy_round_bf16(t120 + t123);
    const float t125 = accy_round_bf16(t124 * 0.796875f);
    const float t126 = accy_round_bf16(tanhf(t125));
    const float t127 = accy_round_bf16(t126 + 1.0f);
    const float t128 = accy_round_bf16(t116 * t127);
    const float t129 = accy_round_bf16(t128 * 0.5f);
    const float t130 = accy_round_bf16(t120 * 0.5f);
    const float t131 = accy_round_bf16(t116 * t130);
    const float t132 = accy_round_bf16(t126 * t126);
    const float t133 = accy_round_bf16(1.0f - t132);
    const float t134 = accy_round_bf16(t131 * t133);
    const float t135 = accy_round_bf16(t134 * 0.796875f);
    const float t136 = accy_round_bf16(t129 + t135);
    const float t137 = accy_round_bf16(t135 * 0.044677734375f);
    const float t138 = accy_round_bf16(t137 * t121);
    const float t139 = accy_round_bf16(t136 + t138);
    const float t140 = accy_round_bf16(t137 * t120);
    const float t141 = accy_round_bf16(t140 * t120);
    const float t142 = accy_round_bf16(t139 + t141);
    const float t143 = accy_round_bf16(t142 + t141);
    t31.v[4] = accy_bf16_store(t143);
    const float t144 = accy_bf16_load(t0.v[5]);
    const float t145 = accy_bf16_load(t2.v[5]);
    const float t146 = t4.v[5];
    const float t147 = accy_round_bf16((float)(t146));
    const float t148 = accy_round_bf16(t145 + t147);
    const float t149 = accy_round_bf16(t148 * t148);
    const float t150 = accy_round_bf16(t149 * t148);
    const float t151 = accy_round_bf16(t150 * 0.044677734375f);
    const float t152 = accy_round_bf16(t148 + t151);
    const float t153 = accy_round_bf16(t152 * 0.796875f);
    const float t154 = accy_round_bf16(tanhf(t153));
    const float t155 = accy_round_bf16(t154 + 1.0f);
    const float t156 = accy_round_bf16(t144 * t155);
    const float t157 = accy_round_bf16(t156 * 0.5f);
    const float t158 = accy_round_bf16(t148 * 0.5f);
    const float t159 = accy_round_bf16(t144 * t158);
    const float t160 = accy_round_bf16(t154 * t154);
    const float t161 = accy_round_bf16(1.0f - t160);
    const float t162 = accy_round_bf16(t159 * t161);
    const float t163 = accy_round_bf16(t162 * 0.796875f);
    const float t164 = accy_round_bf16(t157 + t163);
    const float t165 = accy_round_bf16(t163 * 0.044677734375f);
    const float t166 = accy_round_bf16(t165 * t149);
    const float t167 = accy_round_bf16(t164 + t166);
    const float t168 = accy_round_bf16(t165 * t148);
    const float t169 = accy_round_bf16(t168 * t148);
    const float t170 = accy_round_bf16(t167 + t169);
    const float t171 = accy_round_bf16(t170 + t169);
    t31.v[5] = accy_bf16_store(t171);
    const float t172 = accy_bf16_load(t0.v[6]);
    const float t173 = accy_bf16_load(t2.v[6]);
    const float t174 = t4.v[6];
    const float t175 = accy_round_bf16((float)(t174));
    const float t176 = accy_round_bf16(t173 + t175);
    const float t177 = accy_round_bf16(t176 * t176);
    const float t178 = accy_round_bf16(t177 * t176);
    const float t179 = accy_round_bf16(t178 * 0.044677734375f);
    const float t180 = accy_round_bf16(t176 + t179);
    const float t181 = accy_round_bf16(t180 * 0.796875f);
    const float t182 = accy_round_bf16(tanhf(t181));
    const float t183 = accy_round_bf16(t182 + 1.0f);
    const float t184 = accy_round_bf16(t172 * t183);
    const float t185 = accy_round_bf16(t184 * 0.5f);
    const float t186 = accy_round_bf16(t176 * 0.5f);
    const float t187 = accy_round_bf16(t172 * t186);
    const float t188 = accy_round_bf16(t182 * t182);
    const float t189 = accy_round_bf16(1.0f - t188);
    const float t190 = accy_round_bf16(t187 * t189);
    const float t191 = accy_round_bf16(t190 * 0.796875f);
    const float t192 = accy_round_bf16(t185 + t191);
    const float t193 = accy_round_bf16(t191 * 0.044677734375f);
    const float t194 = accy_round_bf16(t193 * t177);
    const float t195 = accy_round_bf16(t192 + t194);
    const float t196 = accy_round_bf16(t193 * t176);
    const float t197 = accy_round_bf16(t196 * t176);
    const float t198 = accy_round_bf16(t195 + t197);
    const float t199 = accy_round_bf16(t198 + t197);
    t31.v[6] = accy_bf16_store(t199);
    const float t200 = accy_bf16_load(t0.v[7]);
    const float t201 = accy_bf16_load(t2.v[7]);
    const float t202 = t4.v[7];
    const float t203 = accy_round_bf16((float)(t202));
    const float t204 = accy_round_bf16(t201 + t203);
    const float t205 = accy_round_bf16(t204 * t204);
    const float t206 = accy_round_bf16(t205 * t204);
    const float t207 = accy_round_bf16(t206 * 0.044677734375f);
    const float t208 = accy_round_bf16(t204 + t207);
    const float t209 = accy_round_bf16(t208 * 0.796875f);
    const float t210 = accy_round_bf16(tanhf(t209));
    const float t211 = accy_round_bf16(t210 + 1.0f);
    const float t212 = accy_round_bf16(t200 * t211);
    const float t213 = accy_round_bf16(t212 * 0.5f);
    const float t214 = accy_round_bf16(t204 * 0.5f);
    const float t215 = accy_round_bf16(t200 * t214);
    const float t216 = accy_round_bf16(t210 * t210);
    const float t217 = accy_round_bf16(1.0f - t216);
    const float t218 = accy_round_bf16(t215 * t217);
    const float t219 = accy_round_bf16(t218 * 0.796875f);
    const float t220 = accy_round_bf16(t213 + t219);
    const float t221 = accy_round_bf16(t219 * 0.044677734375f);
    const float t222 = accy_round_bf16(t221 * t205);
    const float t223 = accy_round_bf16(t220 + t222);
    const float t224 = accy_round_bf16(t221 * t204);
    const float t225 = accy_round_bf16(t224 * t204);
    const float t226 = accy_round_bf16(t223 + t225);
    const float t227 = accy_round_bf16(t226 + t225);
    t31.v[7] = accy_bf16_store(t227);
    *(accy_vector<uint16_t, 8> *)(v3 + i) = t31;
  }
  for (int64_t i = vector_end + (int64_t)blockIdx.x * 256 + threadIdx.x; i < 25165824LL; i += (int64_t)gridDim.x * 256) {
    const unsigned int i_u = (unsigned int)i;
    const int64_t i0 = (int64_t)(i_u / 3145728u);
    const int64_t i1 = (int64_t)(i_u / 3072u % 1024u);
    const int64_t i2 = (int64_t)(i_u % 3072u);
    const float t228 = accy_bf16_load(v0[i0 * 3145728 + i1 * 3072 + i2]);
    const float t229 = accy_bf16_load(v1[i0 * 3145728 + i1 * 3072 + i2]);
    const float t230 = v2[i2];
    const float t231 = accy_round_bf16((float)(t230));
    const float t232 = accy_round_bf16(t229 + t231);
    const float t233 = accy_round_bf16(t232 * t232);
    const float t234 = accy_round_bf16(t233 * t232);
    const float t235 = accy_round_bf16(t234 * 0.044677734375f);
    const float t236 = accy_round_bf16(t232 + t235);
    const float t237 = accy_round_bf16(t236 * 0.796875f);
    const float t238 = accy_round_bf16(tanhf(t237));
    const float t239 = accy_round_bf16(t238 + 1.0f);
    const float t240 = accy_round_bf16(t228 * t239);
    const float t241 = accy_round_bf16(t240 * 0.5f);
    const float t242 = accy_round_bf16(t232 * 0.5f);
    const float t243 = accy_round_bf16(t228 * t242);
    const float t244 = accy_round_bf16(t238 * t238);
    const float t245 = accy_round_bf16(1.0f - t244);
    const float t246 = accy_round_bf16(t243 * t245);
    const float t247 = accy_round_bf16(t246 * 0.796875f);
    const float t248 = accy_round_bf16(t241 + t247);
    const float t249 = accy_round_bf16(t247 * 0.044677734375f);
    const float t250 = accy_round_bf16(t249 * t233);
    const float t251 = accy_round_bf16(t248 + t250);
    const float t252 = accy_round_bf16(t249 * t232);
    const float t253 = accy_round_bf16(t252 * t232);
    const float t254 = accy_round_bf16(t251 + t253);
    const float t255 = accy_round_bf16(t254 + t253);
    v3[i] = accy_bf16_store(t255);
  }
  (void)io;
  (void)ws;
  (void)scratch;
}
