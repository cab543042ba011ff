"""Where does the time of GPT-2's bf16 GELU kernels go? Times the generated forward
(accy_k1780: bias add + GELU, 25M elements) and backward (accy_k12389) kernels of the bf16
step, as generated (from `tools/gpt2_profile.py --dump`, saved in gelu_kernels.cu beside this
file) and in variants: tanhf replaced by the one-instruction `tanh.approx.f32`, the rounding to
bf16 after every operation removed (stores still round), both. Prints microseconds, GB/s and
how many outputs differ from the generated kernel's (in bf16 units in the last place).

    PYTHONPATH=src python3 tools/device/gelu_variants.py
"""

from __future__ import annotations

import pathlib
import re

import cupy
import numpy as np

from accy.backends.cuda.prelude import PRELUDE

N = 8 * 1024 * 3072
# The kernels as generated, after the prelude accy writes before every program's kernels.
SOURCE = PRELUDE + (pathlib.Path(__file__).parent / "gelu_kernels.cu").read_text()
FAST_TANH = """
static __device__ __forceinline__ float accy_fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""


def variant(fast_tanh: bool, round_each: bool) -> str:
    text = SOURCE
    if fast_tanh:
        text = text.replace("tanhf(", "accy_fast_tanh(")
        text = text.replace('extern "C" __global__', FAST_TANH + 'extern "C" __global__', 1)
    if not round_each:  # in the kernels only, not in the prelude that defines it
        head, kernels = text.split('extern "C"', 1)
        text = head + 'extern "C"' + re.sub(r"accy_round_bf16\(", "(", kernels)
    return text


def time_kernel(kernel, grid, args, repeats=50) -> float:
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(3):
        kernel((grid,), (256,), args)
    start.record()
    for _ in range(repeats):
        kernel((grid,), (256,), args)
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) * 1e3 / repeats


def main() -> None:
    rng = cupy.random.default_rng(0)
    h = (rng.standard_normal(N, dtype=cupy.float32) * 2).astype(cupy.float32)
    h16 = (h.view(cupy.uint32) >> 16).astype(cupy.uint16)
    dy16 = ((rng.standard_normal(N, dtype=cupy.float32)).view(cupy.uint32) >> 16).astype(
        cupy.uint16
    )
    bias = rng.standard_normal(3072, dtype=cupy.float32) * 0.1
    reference: dict[str, cupy.ndarray] = {}
    print(f"{'kernel':10s} {'variant':28s} {'grid':>5s} {'us':>8s} {'GB/s':>7s} {'differ':>8s}")
    for fast_tanh, round_each in ((False, True), (True, True), (False, False), (True, False)):
        name = ("fast tanh" if fast_tanh else "tanhf") + (
            ", round each op" if round_each else ", round at store"
        )
        module = cupy.RawModule(code=variant(fast_tanh, round_each), options=("-std=c++17",))
        for kernel_name, what, traffic in (
            ("accy_k1780", "forward", 4 * N),
            ("accy_k12389", "backward", 6 * N),
        ):
            kernel = module.get_function(kernel_name)
            out = cupy.zeros(N, dtype=cupy.uint16)
            if what == "forward":
                io = cupy.array([h16.data.ptr, bias.data.ptr, out.data.ptr], dtype=cupy.uint64)
            else:
                out[:] = h16
                io = cupy.array([dy16.data.ptr, out.data.ptr, bias.data.ptr], dtype=cupy.uint64)
            args = (io, cupy.uint64(0), cupy.uint64(0))
            for grid in (4224, 1056):
                if what == "backward":
                    out[:] = h16
                us = time_kernel(kernel, grid, args, repeats=1 if what == "backward" else 50)
                if what == "backward":  # in place: time on a fresh copy each run
                    times = []
                    for _ in range(20):
                        out[:] = h16
                        times.append(time_kernel(kernel, grid, args, repeats=1))
                    us = float(np.median(times))
                    out[:] = h16
                    kernel((grid,), (256,), args)
                else:
                    kernel((grid,), (256,), args)
                key = f"{what}"
                if key not in reference:
                    reference[key] = out.copy()
                    differ = 0
                else:
                    differ = int(cupy.count_nonzero(out != reference[key]))
                print(
                    f"{what:10s} {name:28s} {grid:5d} {us:8.1f} {traffic / us / 1e3:7.0f} "
                    f"{differ:8d}"
                )


if __name__ == "__main__":
    main()
