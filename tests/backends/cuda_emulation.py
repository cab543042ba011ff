"""Run one generated CUDA kernel on the CPU, to check its indexing and its block protocol
without a GPU: each block is 256 `std::thread`s sharing a `std::barrier` (`__syncthreads`),
blocks run one after another in a shuffled order (any order is one the GPU may take), and
`__shared__` variables are statics (one block at a time uses them). Only the few prelude
helpers that column and copy kernels use are defined (bf16 loads and rounding, `accy_vector`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

PRELUDE = r"""
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
struct Dim { unsigned x; };
thread_local Dim threadIdx, blockIdx, gridDim;
static std::barrier<> *accy_emulated_barrier;
#define __syncthreads() accy_emulated_barrier->arrive_and_wait()
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)
#define __shared__ static
#define __launch_bounds__(n)
#define __global__
#define __restrict__ __restrict
static unsigned atomicAdd(unsigned *p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline float accy_float_from_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t accy_float_bits(float x) { uint32_t b; memcpy(&b, &x, 4); return b; }
static inline float accy_bf16_load(uint16_t bits) {
  return accy_float_from_bits((uint32_t)bits << 16);
}
static inline uint16_t accy_bf16_store(float x) {
  uint32_t bits = accy_float_bits(x);
  if (x != x) return (uint16_t)((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}
static inline float accy_round_bf16(float x) { return accy_bf16_load(accy_bf16_store(x)); }
static inline uint16_t accy_bf16_bits(float rounded) {
  return (uint16_t)(accy_float_bits(rounded) >> 16);
}
template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) accy_vector { T v[N]; };
"""

# argv: input file, input bytes, output bytes, grid, byte shift of both buffers, output file,
# runs. Every run writes <output file>.<run>; the counters below scratch must end at zero.
MAIN = r"""
int main(int argc, char **argv) {
  const long in_bytes = atol(argv[2]), out_bytes = atol(argv[3]);
  const int grid = atoi(argv[4]), shift = atoi(argv[5]), runs = atoi(argv[7]);
  char *in = (char *)aligned_alloc(64, in_bytes + 64) + shift;
  FILE *f = fopen(argv[1], "rb");
  if (fread(in, 1, in_bytes, f) != (size_t)in_bytes) return 2;
  fclose(f);
  const long below = 1 << 20, above = 64 << 20;
  char *region = (char *)aligned_alloc(64, below + above);
  memset(region, 0, below + above);
  char *scratch = region + below;
  for (int run = 0; run < runs; ++run) {
    char *out = (char *)aligned_alloc(64, out_bytes + 64) + shift;
    memset(out, 0xff, out_bytes);
    // argv[8]: the kernel's table, "buffer:byte offset" per entry (buffer 0 in, 1 out).
    std::vector<void *> io;
    for (const char *entry = argv[8]; *entry;) {
      char *end;
      const long buffer = strtol(entry, &end, 10), offset = strtol(end + 1, &end, 10);
      io.push_back((buffer ? out : in) + offset);
      entry = *end ? end + 1 : end;
    }
    std::vector<int> order(grid);
    for (int i = 0; i < grid; ++i) order[i] = i;
    std::mt19937 rng(run);
    std::shuffle(order.begin(), order.end(), rng);
    for (int b : order) {
      std::barrier<> barrier(256);
      accy_emulated_barrier = &barrier;
      std::vector<std::thread> threads;
      for (int t = 0; t < 256; ++t) {
        threads.emplace_back([&, t] {
          threadIdx.x = t;
          blockIdx.x = b;
          gridDim.x = grid;
          KERNEL(io.data(), nullptr, scratch);
        });
      }
      for (auto &thread : threads) thread.join();
    }
    char name[4096];
    snprintf(name, sizeof name, "%s.%d", argv[6], run);
    FILE *g = fopen(name, "wb");
    fwrite(out, 1, out_bytes, g);
    fclose(g);
  }
  for (long i = 0; i < below / 4; ++i) {
    const unsigned counter = ((unsigned *)region)[i];
    if (counter) { printf("counter %ld is %u after the runs\n", i, counter); return 1; }
  }
  return 0;
}
"""

KERNEL = re.compile(
    r'extern "C" __global__ void __launch_bounds__\(256\) (\w+)\([^)]*\) \{\n.*?\n\}', re.S
)


def emulate_kernel(
    source: str,
    name: str,
    grid: int,
    x: np.ndarray,
    out_dtype,
    out_shape,
    shift: int = 0,
    runs: int = 2,
    table: tuple[tuple[int, int], ...] = ((0, 0), (1, 0)),
) -> list[np.ndarray]:
    """Run kernel `name` of `source` on the CPU over `grid` blocks, `runs` times in different
    block orders, with both buffers `shift` bytes off alignment; each run's output. `table`
    is the kernel's `io`: (buffer, byte offset) per entry, buffer 0 the input `x` and 1 the
    output (by default io[0] is x, io[1] the output). Skips without a C++20 compiler."""
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler to emulate CUDA kernels")
    kernel = next(m.group(0) for m in KERNEL.finditer(source) if m.group(1) == name)
    kernel = kernel.replace(name, "KERNEL", 1)
    out_bytes = int(np.prod(out_shape)) * np.dtype(out_dtype).itemsize
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder)
        (path / "k.cpp").write_text(PRELUDE + kernel + MAIN)
        built = subprocess.run(
            [
                compiler,
                "-std=c++20",
                "-O1",
                "-pthread",
                "-w",
                str(path / "k.cpp"),
                "-o",
                str(path / "k"),
            ],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0 and "barrier" in built.stderr:
            pytest.skip("the C++ compiler has no std::barrier (C++20)")
        assert built.returncode == 0, built.stderr[-2000:]
        np.ascontiguousarray(x).tofile(path / "in.bin")
        ran = subprocess.run(
            [
                str(path / "k"),
                str(path / "in.bin"),
                str(x.nbytes),
                str(out_bytes),
                str(grid),
                str(shift),
                str(path / "out"),
                str(runs),
                ",".join(f"{buffer}:{offset}" for buffer, offset in table),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        return [
            np.fromfile(path / f"out.{run}", dtype=out_dtype).reshape(out_shape)
            for run in range(runs)
        ]
