"""The CUDA backend's prelude: the CUDA C dialect (`accy.codegen.c.dialect.CUDA`), then what
only this backend's kernels use: warp shuffles, vectors of adjacent values, the bits of a
rounded bf16 and atomic updates of 1-byte values."""

from __future__ import annotations

from ...codegen.c.dialect import CUDA

DEVICE_HELPERS = r"""
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

/* The bits of a float already rounded to bf16 (accy_round_bf16): its high half, a shift
   where accy_bf16_store would convert again (accy.backends.cuda.vectors). */
ACCY_FN uint16_t accy_bf16_bits(float rounded) {
  return (uint16_t)(accy_float_bits(rounded) >> 16);
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

PRELUDE = CUDA.prelude + DEVICE_HELPERS
