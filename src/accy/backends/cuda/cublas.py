"""cuBLAS through its C API (ctypes), so that GEMMs can be captured into a CUDA graph.

CuPy refuses its own cuBLAS calls while a stream is being captured; cuBLAS itself does not. A
`Cublas` handle is bound to the capturing stream, has a workspace of its own (so that it never
allocates during capture), and issues `cublasGemmEx`, `cublasGemmStridedBatchedEx` or
`cublasGemmBatchedEx`. f32 GEMMs compute in true float32 unless `ACCY_CUDA_TF32=1` (read when a
fragment's graph is captured) lets cuBLAS use TF32 tensor cores: about 7x faster on an H200,
with about 1e-3 relative error instead of 1e-6.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import c_int, c_longlong, c_size_t, c_void_p

from ...errors import AccyError, RuntimeUnavailable
from .schedule import Gemm

CUDA_R_32F, CUDA_R_64F = 0, 1  # cudaDataType
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70  # cublasComputeType_t
GEMM_DEFAULT = -1  # cublasGemmAlgo_t
WORKSPACE_BYTES = 32 << 20  # what NVIDIA recommends for Hopper
LIBRARIES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")

GEMM_ARGS = [c_void_p, c_int, c_int, c_int, c_int, c_int, c_void_p]
OPERAND = [c_void_p, c_int, c_int]  # pointer, data type, leading dimension
STRIDED = [c_void_p, c_int, c_int, c_longlong]
TAIL = [c_void_p, c_void_p, c_int, c_int]  # beta, C, C type, ldc


def tf32_allowed() -> bool:
    """Whether f32 GEMMs may use TF32 tensor cores (`ACCY_CUDA_TF32=1`).

    >>> import os
    >>> tf32_allowed() == (os.environ.get("ACCY_CUDA_TF32") == "1")
    True
    """
    return os.environ.get("ACCY_CUDA_TF32", "0") == "1"


def _load() -> ctypes.CDLL:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception:  # not installed, or no cuBLAS wheel: try the loader's search path
        pass
    for name in LIBRARIES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeUnavailable(f"cuBLAS is not installed (none of {', '.join(LIBRARIES)} loads)")


def _declare(lib: ctypes.CDLL) -> None:
    signatures = {
        "cublasCreate_v2": [c_void_p],
        "cublasDestroy_v2": [c_void_p],
        "cublasSetStream_v2": [c_void_p, c_void_p],
        "cublasSetWorkspace_v2": [c_void_p, c_void_p, c_size_t],
        "cublasGemmEx": [*GEMM_ARGS, *OPERAND, *OPERAND, *TAIL, c_int, c_int],
        "cublasGemmStridedBatchedEx": [
            *GEMM_ARGS,
            *STRIDED,
            *STRIDED,
            c_void_p,
            c_void_p,
            c_int,
            c_int,
            c_longlong,
            c_int,
            c_int,
            c_int,
        ],
        "cublasGemmBatchedEx": [*GEMM_ARGS, *OPERAND, *OPERAND, *TAIL, c_int, c_int, c_int],
    }
    for name, arguments in signatures.items():
        function = getattr(lib, name)
        function.argtypes = arguments
        function.restype = c_int


class Cublas:
    """One cuBLAS handle with its own workspace (`workspace` is a device pointer to
    `WORKSPACE_BYTES` that the caller keeps alive)."""

    def __init__(self, workspace: int):
        self.lib = _load()
        _declare(self.lib)
        self.handle = c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        status = self.lib.cublasSetWorkspace_v2(self.handle, workspace, WORKSPACE_BYTES)
        self._check(status, "cublasSetWorkspace")
        self._one = {"f32": ctypes.c_float(1.0), "f64": ctypes.c_double(1.0)}
        self._zero = {"f32": ctypes.c_float(0.0), "f64": ctypes.c_double(0.0)}

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise AccyError(f"{what} failed with cuBLAS status {status}")

    def bind(self, stream: int) -> None:
        """Issue the following calls on `stream` (the one being captured)."""
        self._check(self.lib.cublasSetStream_v2(self.handle, stream), "cublasSetStream")

    def gemm(self, g: Gemm, a: int, b: int, c: int) -> None:
        """Issue `g`; `a`, `b`, `c` are device addresses: of the matrices, or with
        `g.arrays` of the pointer arrays."""
        data = CUDA_R_32F if g.dtype == "f32" else CUDA_R_64F
        compute = COMPUTE_64F
        if g.dtype == "f32":
            compute = COMPUTE_32F_FAST_TF32 if tf32_allowed() else COMPUTE_32F
        one, zero = ctypes.byref(self._one[g.dtype]), ctypes.byref(self._zero[g.dtype])
        head = (self.handle, g.transa, g.transb, g.m, g.n, g.k, one)
        tail = (compute, GEMM_DEFAULT)
        if g.arrays is not None or g.batch == 1:
            operands = (a, data, g.lda, b, data, g.ldb, zero, c, data, g.ldc)
            if g.arrays is None:
                status = self.lib.cublasGemmEx(*head, *operands, *tail)
            else:
                status = self.lib.cublasGemmBatchedEx(*head, *operands, g.batch, *tail)
        else:
            strided = (a, data, g.lda, g.stride_a, b, data, g.ldb, g.stride_b, zero)
            output = (c, data, g.ldc, g.stride_c, g.batch)
            status = self.lib.cublasGemmStridedBatchedEx(*head, *strided, *output, *tail)
        self._check(status, f"cuBLAS GEMM {g.m}x{g.n}x{g.k} (batch {g.batch})")
