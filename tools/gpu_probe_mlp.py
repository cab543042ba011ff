"""Where does the GPU mlp step's time go? Times the whole value_and_grad step and each of its
GEMM shapes alone through accy.compile(device="cuda"), with CUDA events (median of 200)."""

from __future__ import annotations

import sys

import cupy
import numpy as np

sys.path.insert(0, ".")
import accy  # noqa: E402
from bench.workloads.mlp import loss, specs  # noqa: E402


def timed(fn, args, repeats=200):
    for _ in range(20):
        fn(*args)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn(*args)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def main():
    ext = {"batch": 2048, "in": 512, "hidden": 512, "out": 10}
    rng = np.random.default_rng(0)
    program = accy.value_and_grad(accy.trace.define("mlp", specs(ext), loss), wrt=(1, 2))
    inputs = [
        cupy.asarray(rng.standard_normal(t.extents).astype(np.float32) * 0.05)
        for t in program.parameter_types
    ]
    print(f"whole step: {timed(accy.compile(program, device='cuda'), inputs) * 1e3:.1f} us")
    print(accy.lower.explain(program))
    f32, spec = accy.f32, accy.spec
    shapes = [
        ("x.w1 2048x512x512", spec(f32, b=2048, i=512), spec(f32, i=512, h=512), "i"),
        ("h.w2 2048x512x10", spec(f32, b=2048, h=512), spec(f32, h=512, o=10), "h"),
        ("dW2 h^T.d 512x2048x10", spec(f32, b=2048, h=512), spec(f32, b=2048, o=10), "b"),
        ("dh d.w2^T 2048x10x512", spec(f32, b=2048, o=10), spec(f32, h=512, o=10), "o"),
        ("dW1 x^T.dh 512x2048x512", spec(f32, b=2048, i=512), spec(f32, b=2048, h=512), "b"),
    ]
    for name, a, b, axis in shapes:
        p = accy.trace.define("gemm", [a, b], lambda bb, v, axis=axis: v[0].contract(v[1], axis))
        args = [cupy.asarray(rng.standard_normal(t.extents).astype(np.float32)) for t in (a, b)]
        print(f"{name}: {timed(accy.compile(p, device='cuda'), args) * 1e3:.1f} us")
    x = cupy.asarray(rng.standard_normal((2048, 512)).astype(np.float32))
    w = cupy.asarray(rng.standard_normal((512, 512)).astype(np.float32))
    print(f"cupy matmul 2048x512x512: {timed(cupy.matmul, [x, w]) * 1e3:.1f} us")


if __name__ == "__main__":
    main()
