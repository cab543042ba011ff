"""On the GPU: the conv workload's loss and gradients at the CUDA scale, compiled with cuDNN
convolutions and with the composition (ACCY_CUDNN_CONV=0), in f32 and bf16: which convs cuDNN
ran (library steps) or declined and why, agreement of the two, and the median step of each.
Run by tools/device/conv.sh from the repo root (PYTHONPATH=src:.:/tmp/site)."""

from __future__ import annotations

import logging
import os
import time

import cupy
import numpy as np

from accy.backends.cuda import compile_program, cudnn_conv
from accy.backends.cuda.executable import CudaExecutable
from accy.backends.cuda.schedule import Library
from bench.systems.accy_system import device_array
from bench.workloads import WORKLOADS


def _host(a) -> np.ndarray:
    a = a.get() if hasattr(a, "get") else np.asarray(a)
    return a.astype(np.float32) if a.dtype.itemsize == 2 else a.astype(np.float32)


def _median_step(run, args, steps: int = 20) -> float:
    for _ in range(3):
        run(*args)
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run(*args)
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    workload = WORKLOADS["conv"]
    flops = workload.flops_per_step("cuda")
    for dtype in ("f32", "bf16"):
        program = workload.value_and_grad("cuda", dtype)
        args = [device_array(a) for a in workload.make_inputs("cuda", dtype=dtype)]
        results = {}
        for label, switch in (("cudnn", "1"), ("composition", "0")):
            os.environ["ACCY_CUDNN_CONV"] = switch
            start = time.perf_counter()
            compiled = compile_program(program)
            executable = CudaExecutable(compiled, 0)
            outputs = [_host(o) for o in executable(*args)]
            first = time.perf_counter() - start
            libraries = [a.symbol for a in compiled.schedule.actions if isinstance(a, Library)]
            ms = _median_step(executable, args)
            results[label] = outputs
            print(
                f"conv {dtype} {label}: {len(libraries)} cuDNN steps, first call {first:.2f} s, "
                f"step {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s"
            )
        worst = max(
            float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))
            for a, b in zip(results["cudnn"], results["composition"], strict=True)
        )
        print(f"conv {dtype}: cudnn vs composition, worst normwise difference {worst:.2e}")
    os.environ["ACCY_CUDNN_CONV"] = "1"
    for where, reason in cudnn_conv.decline_reasons().items():
        if "ACCY_CUDNN_CONV=0" not in reason:
            print(f"declined: {where}: {reason.splitlines()[0][:300]}")


if __name__ == "__main__":
    main()
