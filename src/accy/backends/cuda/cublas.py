"""cuBLAS through its C API (ctypes), so that GEMMs can be captured into a CUDA graph.

CuPy refuses its own cuBLAS calls while a stream is being captured; cuBLAS itself does not. A
`Cublas` handle is bound to the capturing stream, has a workspace of its own (so that it never
allocates during capture), and issues `cublasGemmEx`, `cublasGemmStridedBatchedEx` or
`cublasGemmBatchedEx`. f16 and bf16 operands (`CUDA_R_16F`, `CUDA_R_16BF`) are multiplied on
tensor cores with float32 accumulation (`CUBLAS_COMPUTE_32F`) into an f32 or a 16-bit result.
f32 GEMMs compute in true float32 unless the executable was compiled with `precision="tf32"`
(`accy.compile(program, device="cuda", precision="tf32")`), which lets cuBLAS use TF32 tensor
cores: about 7x faster on an H200, with about 1e-3 relative error instead of 1e-6.

A `Gemm` with an `epilogue` (a bias added to the product: `accy.backends.cuda.epilogues`) goes
through cuBLASLt instead, on the same stream and workspace.
"""

from __future__ import annotations

import ctypes
from ctypes import c_int, c_longlong, c_size_t, c_void_p

from ...errors import AccyError
from .cublaslt import load_library
from .epilogues import EpilogueGemms
from .schedule import Gemm

CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF = 0, 1, 2, 14  # cudaDataType
DATA_TYPES = {"f32": CUDA_R_32F, "f64": CUDA_R_64F, "f16": CUDA_R_16F, "bf16": CUDA_R_16BF}
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70  # cublasComputeType_t
GEMM_DEFAULT = -1  # cublasGemmAlgo_t
WORKSPACE_BYTES = 32 << 20  # what NVIDIA recommends for Hopper
LIBRARIES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so")

GEMM_ARGS = [c_void_p, c_int, c_int, c_int, c_int, c_int, c_void_p]
OPERAND = [c_void_p, c_int, c_int]  # pointer, data type, leading dimension
STRIDED = [c_void_p, c_int, c_int, c_longlong]
TAIL = [c_void_p, c_void_p, c_int, c_int]  # beta, C, C type, ldc


def gemm_types(g: Gemm, tf32: bool = False) -> tuple[int, int, int, str]:
    """(operand data type, result data type, compute type, scalar dtype) of `g`: alpha and
    beta are float for every compute type but f64's. TF32 applies to f32 GEMMs only.

    >>> from accy.backends.cuda.schedule import Address, Gemm
    >>> at = Address(0)
    >>> gemm_types(Gemm("bf16", 0, 0, 2, 2, 2, at, 2, at, 2, at, 2, out="f32"))
    (14, 0, 68, 'f32')
    >>> gemm_types(Gemm("f32", 0, 0, 2, 2, 2, at, 2, at, 2, at, 2), tf32=True)
    (0, 0, 77, 'f32')
    """
    data, out = DATA_TYPES[g.dtype], DATA_TYPES[g.out or g.dtype]
    if g.dtype == "f64":
        return data, out, COMPUTE_64F, "f64"
    fast = tf32 and g.dtype == "f32"
    return data, out, COMPUTE_32F_FAST_TF32 if fast else COMPUTE_32F, "f32"


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
        self.lib = load_library("cublas", LIBRARIES)
        _declare(self.lib)
        self.handle = c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        status = self.lib.cublasSetWorkspace_v2(self.handle, workspace, WORKSPACE_BYTES)
        self._check(status, "cublasSetWorkspace")
        self.epilogues = EpilogueGemms(workspace, WORKSPACE_BYTES)
        self._one = {"f32": ctypes.c_float(1.0), "f64": ctypes.c_double(1.0)}
        self._zero = {"f32": ctypes.c_float(0.0), "f64": ctypes.c_double(0.0)}

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise AccyError(f"{what} failed with cuBLAS status {status}")

    def bind(self, stream: int) -> None:
        """Issue the following calls on `stream` (the one being captured)."""
        self._check(self.lib.cublasSetStream_v2(self.handle, stream), "cublasSetStream")
        self.epilogues.bind(stream)

    def gemm(
        self,
        g: Gemm,
        a: int,
        b: int,
        c: int,
        tf32: bool = False,
        bias: int | None = None,
        aux: int | None = None,
    ) -> None:
        """Issue `g`; `a`, `b`, `c` are device addresses: of the matrices, or with
        `g.arrays` of the pointer arrays. `tf32` lets an f32 GEMM use TF32 tensor cores.
        `bias`, `aux`: the addresses of `g`'s bias vector and aux matrix, for a GEMM with an
        epilogue that has them."""
        if g.epilogue:
            self.epilogues.issue(g, a, b, c, bias, aux)
            return
        data, out, compute, scalar = gemm_types(g, tf32)
        one, zero = ctypes.byref(self._one[scalar]), ctypes.byref(self._zero[scalar])
        head = (self.handle, g.transa, g.transb, g.m, g.n, g.k, one)
        tail = (compute, GEMM_DEFAULT)
        if g.arrays is not None or g.batch == 1:
            operands = (a, data, g.lda, b, data, g.ldb, zero, c, out, g.ldc)
            if g.arrays is None:
                status = self.lib.cublasGemmEx(*head, *operands, *tail)
            else:
                status = self.lib.cublasGemmBatchedEx(*head, *operands, g.batch, *tail)
        else:
            strided = (a, data, g.lda, g.stride_a, b, data, g.ldb, g.stride_b, zero)
            output = (c, out, g.ldc, g.stride_c, g.batch)
            status = self.lib.cublasGemmStridedBatchedEx(*head, *strided, *output, *tail)
        self._check(status, f"cuBLAS GEMM {g.m}x{g.n}x{g.k} (batch {g.batch})")
