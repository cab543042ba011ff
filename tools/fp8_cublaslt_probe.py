"""Which ways of calling `cublasLtMatmul` for an FP8 GEMM this GPU's cuBLASLt takes (on a GPU).

    PYTHONPATH=src python tools/fp8_cublaslt_probe.py

One E4M3 x E4M3 -> bf16 GEMM (random operands, result poisoned before each call) called 16
ways: B's scale pointer 4 or 256 bytes past A's x scale modes set or not x {in place (one
descriptor for C and D, C == D), C another pointer with D's descriptor, D a descriptor of its
own with C == D (as accy calls it), both}; each line says cuBLASLt's status and,
where it ran, the error against NumPy. Then accy's own step (`accy.backends.cuda.fp8.refusal`)
for the forward and a gradient GEMM, and `torch._scaled_mm` on the same operands. cuBLASLt's
log (level 5) is printed for torch's call and for the first refused call with aligned scales.
On the H200 (cuBLASLt 13.1) every call with B's scale 4 bytes past A's was refused (status 15)
and every one with it 256 bytes past ran (`bench/results/fp8-h200-bf16.md`).
"""

from __future__ import annotations

import ctypes
from ctypes import c_int, c_int8, c_size_t, c_void_p

import cupy
import ml_dtypes
import numpy as np

import accy
from accy.backends.cuda import cublaslt
from accy.backends.cuda import fp8 as cuda_fp8
from accy.nn import fp8

M, N, K = 128, 64, 96
BF16, E4M3 = cublaslt.CUDA_TYPES["bf16"], cublaslt.CUDA_TYPES["float8_e4m3fn"]


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def main() -> None:
    lib, handle = cublaslt.handle(0)
    lib.cublasLtLoggerSetLevel.argtypes = [c_int]
    print("cublasLtGetVersion", lib.cublasLtGetVersion())
    rng = np.random.default_rng(0)
    first = rng.normal(size=(M, K)).astype(ml_dtypes.float8_e4m3fn)  # [m, k]
    second = rng.normal(size=(N, K)).astype(ml_dtypes.float8_e4m3fn)  # [n, k]
    exact = first.astype(np.float64) @ second.astype(np.float64).T  # [m, n]
    a, b = cupy.asarray(second.view(np.uint8)), cupy.asarray(first.view(np.uint8))
    scales = cupy.ones(128, cupy.float32)  # A's scale at +0, B's at +4 or +256 bytes
    workspace = cupy.zeros(cuda_fp8.WORKSPACE_BYTES, cupy.uint8)
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def layout(data: int, rows: int, cols: int) -> c_void_p:
        made = c_void_p()
        assert lib.cublasLtMatrixLayoutCreate(ctypes.byref(made), data, rows, cols, rows) == 0
        return made

    def attempt(scale_modes, own_d, c_is_d, aligned, on=handle) -> tuple[int, float]:
        desc = c_void_p()
        assert lib.cublasLtMatmulDescCreate(ctypes.byref(desc), cublaslt.COMPUTE_32F, 0) == 0
        b_scale = scales.data.ptr + (256 if aligned else 4)
        settings = [
            (cuda_fp8.TRANSA, c_int(cuda_fp8.OP_T)),
            (cuda_fp8.TRANSB, c_int(cuda_fp8.OP_N)),
            (cuda_fp8.A_SCALE, c_void_p(scales.data.ptr)),
            (cuda_fp8.B_SCALE, c_void_p(b_scale)),
            (cuda_fp8.FAST_ACCUMULATE, c_int8(1)),
        ]
        if scale_modes:
            settings += [(cuda_fp8.A_SCALE_MODE, c_int(0)), (cuda_fp8.B_SCALE_MODE, c_int(0))]
        for attribute, value in settings:
            status = lib.cublasLtMatmulDescSetAttribute(
                desc, attribute, ctypes.byref(value), ctypes.sizeof(value)
            )
            assert status == 0, (attribute, status)
        layouts = [layout(E4M3, K, N), layout(E4M3, K, M), layout(BF16, N, M)]
        c_layout = layouts[2]
        d_layout = layout(BF16, N, M) if own_d else c_layout
        out = cupy.full(M * N, 0x7FC0, cupy.uint16)  # bf16 NaN: every element must be written
        other = cupy.zeros(M * N, cupy.uint16)
        c = out if c_is_d else other
        status = lib.cublasLtMatmul(
            on,
            desc,
            ctypes.byref(alpha),
            c_void_p(a.data.ptr),
            layouts[0],
            c_void_p(b.data.ptr),
            layouts[1],
            ctypes.byref(beta),
            c_void_p(c.data.ptr),
            c_layout,
            c_void_p(out.data.ptr),
            d_layout,
            None,
            c_void_p(workspace.data.ptr),
            c_size_t(cuda_fp8.WORKSPACE_BYTES),
            c_void_p(0),
        )
        cupy.cuda.runtime.deviceSynchronize()
        if status != 0:
            return status, float("nan")
        got = bf16_to_f32(out.get()).reshape(M, N).astype(np.float64)
        return 0, float(np.linalg.norm(got - exact) / np.linalg.norm(exact))

    calls = {
        (False, True): "in place (one descriptor, C == D)",
        (False, False): "C another pointer, one descriptor",
        (True, True): "D its own descriptor, C == D (accy)",
        (True, False): "D its own descriptor, C another pointer",
    }
    logged = False
    for aligned in (False, True):
        for scale_modes in (False, True):
            for (own_d, c_is_d), name in calls.items():
                status, error = attempt(scale_modes, own_d, c_is_d, aligned)
                print(
                    f"B scale {'at +256' if aligned else 'at +4  '}, scale modes "
                    f"{'set  ' if scale_modes else 'unset'}, {name}: status {status}, "
                    f"relative error {error:.2e}",
                    flush=True,
                )
                if status != 0 and aligned and not logged:
                    logged = True
                    print("---- cuBLASLt log of that call", flush=True)
                    lib.cublasLtLoggerSetLevel(5)
                    attempt(scale_modes, own_d, c_is_d, aligned)
                    lib.cublasLtLoggerSetLevel(0)
                    print("---- end of log", flush=True)

    forward = fp8.Signature(
        ("k",), (("m", "k"), ("k", "n")), ("float8_e4m3fn",) * 2, "float8_e5m2", "bf16"
    )
    gradient = fp8.Signature(
        ("n",), (("m", "n"), ("k", "n")), ("float8_e5m2", "float8_e4m3fn"), "float8_e5m2", "f32"
    )
    for s, dtype in ((forward, accy.bf16), (gradient, accy.f32)):
        x, w = (accy.spec(dtype, dict.fromkeys(layout, 64)) for layout in s.layouts)
        step = cuda_fp8.describe(s, (x, w), fp8.result_type(s, x, w))
        why = cuda_fp8.refusal(step)
        print(
            f"accy step {step.first.format} x {step.second.format} -> {step.out}:",
            "runs" if why is None else f"declined: {why}",
            flush=True,
        )

    import torch

    x8 = torch.from_numpy(first.view(np.uint8)).cuda().view(torch.float8_e4m3fn)
    w8 = torch.from_numpy(second.view(np.uint8)).cuda().view(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    print("---- cuBLASLt log of torch._scaled_mm", flush=True)
    lib.cublasLtLoggerSetLevel(5)
    y = torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    lib.cublasLtLoggerSetLevel(0)
    print("---- end of log", flush=True)
    error = np.linalg.norm(y.float().cpu().numpy() - exact) / np.linalg.norm(exact)
    print(f"torch._scaled_mm: relative error {error:.2e}", flush=True)

    if logged:  # an aligned call was refused: try torch's cuBLAS handle (a cuBLASLt handle too)
        status, error = attempt(True, True, True, True, c_void_p(torch.cuda.current_blas_handle()))
        print(f"torch's handle, aligned, torch's call: status {status}, error {error:.2e}")


if __name__ == "__main__":
    main()
