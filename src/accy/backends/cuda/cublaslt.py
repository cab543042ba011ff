"""cuBLASLt through its C API (ctypes): the library, one handle per GPU, matmul descriptors and
matrix layouts, shared by the FP8 GEMMs (`accy.backends.cuda.fp8`) and the GEMMs with fused
epilogues (`accy.backends.cuda.epilogues`).

`cublasLtMatmul` is given no algorithm by either: cuBLASLt chooses one for the actual pointers
(their alignment included) when the call is issued, which is once, while the program's graph is
captured. A caller runs each GEMM once outside any capture first (on buffers of its own), so
that a configuration cuBLASLt refuses shows up as an error at load, not inside a capture.
"""

from __future__ import annotations

import ctypes
from ctypes import c_int, c_int64, c_size_t, c_uint64, c_void_p
from typing import Any

from ...caches import memoized
from ...errors import AccyError, RuntimeUnavailable

LIBRARIES = ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")
CUDA_TYPES = {"f32": 0, "bf16": 14, "float8_e4m3fn": 28, "float8_e5m2": 29}  # cudaDataType
COMPUTE_32F = 68  # cublasComputeType_t
OP_N, OP_T = 0, 1  # cublasOperation_t

# cublasLtMatmulDescAttributes_t (cublasLt.h of CUDA 12 and 13)
TRANSA, TRANSB = 3, 4
EPILOGUE, BIAS_POINTER = 7, 8
EPILOGUE_AUX_POINTER, EPILOGUE_AUX_LD = 11, 12
A_SCALE, B_SCALE = 17, 18
EPILOGUE_AUX_DATA_TYPE = 22
FAST_ACCUMULATE = 25
BIAS_DATA_TYPE = 26
A_SCALE_MODE, B_SCALE_MODE = 31, 32  # of cuBLASLt 12.8 and later


def load_library(name: str, sonames: tuple[str, ...]) -> ctypes.CDLL:
    """NVIDIA's library `name` ("cublas", "cublasLt"): its wheel's, else the first of
    `sonames` on the loader's search path."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return ctypes.CDLL(load_nvidia_dynamic_lib(name).abs_path)
    except Exception:  # not installed, or no such wheel: try the loader's search path
        pass
    for soname in sonames:
        try:
            return ctypes.CDLL(soname)
        except OSError:
            continue
    raise RuntimeUnavailable(f"{name} is not installed (none of {', '.join(sonames)} loads)")


def _declare(lib: ctypes.CDLL) -> None:
    signatures = {
        "cublasLtCreate": [c_void_p],
        "cublasLtMatmulDescCreate": [c_void_p, c_int, c_int],
        "cublasLtMatmulDescSetAttribute": [c_void_p, c_int, c_void_p, c_size_t],
        "cublasLtMatrixLayoutCreate": [c_void_p, c_int, c_uint64, c_uint64, c_int64],
        "cublasLtMatmul": [c_void_p] * 12 + [c_void_p, c_void_p, c_size_t, c_void_p],
    }
    for name, arguments in signatures.items():
        function = getattr(lib, name)
        function.argtypes = arguments
        function.restype = c_int
    lib.cublasLtGetVersion.argtypes = []
    lib.cublasLtGetVersion.restype = c_size_t


def check(status: int, what: str) -> None:
    """Raise `AccyError` naming `what` unless cuBLAS(Lt) answered success (0)."""
    if status != 0:
        raise AccyError(f"{what} failed with cuBLAS status {status}")


@memoized("cublaslt handles", "kernels_max_entries")
def handle(ordinal: int) -> tuple[ctypes.CDLL, c_void_p]:
    """The process's cuBLASLt library and handle on GPU `ordinal` (made once)."""
    import cupy

    lib = load_library("cublasLt", LIBRARIES)
    _declare(lib)
    made = c_void_p()
    with cupy.cuda.Device(ordinal):
        check(lib.cublasLtCreate(ctypes.byref(made)), "cublasLtCreate")
    return lib, made


def matmul_descriptor(lib: ctypes.CDLL) -> c_void_p:
    """A new matmul descriptor: f32 compute, f32 scalars (alpha and beta)."""
    desc = c_void_p()
    check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, 0), "desc")
    return desc


def set_attribute(lib: ctypes.CDLL, desc: c_void_p, attribute: int, value: Any) -> None:
    """Set matmul attribute `attribute` of `desc` to the ctypes `value`."""
    status = lib.cublasLtMatmulDescSetAttribute(
        desc, attribute, ctypes.byref(value), ctypes.sizeof(value)
    )
    check(status, f"cublasLtMatmulDescSetAttribute({attribute})")


def matrix_layout(lib: ctypes.CDLL, data: int, rows: int, cols: int, ld: int) -> c_void_p:
    """A column-major layout of `rows` x `cols` elements of cudaDataType `data`."""
    layout = c_void_p()
    status = lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), data, rows, cols, ld)
    check(status, "cublasLtMatrixLayoutCreate")
    return layout
