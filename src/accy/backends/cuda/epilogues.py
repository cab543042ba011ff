"""GEMMs with a fused epilogue, through cuBLASLt: `CUBLASLT_EPILOGUE_BIAS`, `GELU_AUX_BIAS`
and `DGELU` (`accy.lower.gemm_epilogues` matches them; GELU is its tanh approximation there and
in cuBLASLt).

The plan fuses a loop that adds a bias vector to a GEMM's product into the GEMM's step
(`accy.lower.gemm_epilogues`); `steps.dot` then schedules one `Gemm` whose `epilogue` is
"bias": in cuBLAS's column-major terms D[m, n] = op(A) op(B) + bias[m] (each of the row-major
product's rows gets the vector added: it holds one value per column there). cuBLASLt adds the
bias to the f32 accumulator and rounds once to the result's dtype; the loop it replaces rounded
the product to bf16, added the (bf16) bias in f32 and rounded again. So the results can differ
by one rounding of the product (half a bf16 unit of it), and the fused ones are the closer to
the exact sum.

cuBLASLt takes the bias in the result's dtype only: with a bf16 D it answered
CUBLAS_STATUS_INVALID_VALUE (7) for an f32 bias on the H200 (cuBLASLt 13.1), so the step
converts the bias first (a small kernel into its scratch; mixed precision keeps f32 masters).

`GELU_AUX_BIAS` also writes the biased product (rounded to the result's dtype) as its "aux"
matrix, the GELU's input that the backward pass reads, laid out as the result; `DGELU` reads
it and multiplies the product by GELU's derivative there.

A GEMM cuBLASLt refuses (`refusal`: it runs once on buffers of its own, outside any capture)
is scheduled as the plain GEMM followed by the epilogue's loops as kernels of their own.

Measured on the H200 at GPT-2's fc shape (8192 x 3072 x 768, bf16, one CUDA graph of 50 calls):
plain 57.0 us, BIAS 58.0 us, GELU_BIAS 66.1, GELU_AUX_BIAS 77.0; the dgrad GEMM plain 57.1,
DGELU 79.9, DGELU_BGRAD 226.3 (`bench/results/gpt2-h200-bf16.md`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from ctypes import c_int, c_int64, c_size_t, c_void_p
from typing import Any

from ...caches import memoized
from ...errors import AccyError
from .cublaslt import (
    BIAS_DATA_TYPE,
    BIAS_POINTER,
    CUDA_TYPES,
    EPILOGUE,
    EPILOGUE_AUX_LD,
    EPILOGUE_AUX_POINTER,
    TRANSA,
    TRANSB,
    check,
    handle,
    matmul_descriptor,
    matrix_layout,
    set_attribute,
)
from .schedule import Gemm

log = logging.getLogger("accy.epilogues")
EPILOGUES = {"bias": 4, "gelu_aux_bias": 164, "dgelu": 192}  # cublasLtEpilogue_t
WITH_BIAS = frozenset({"bias", "gelu_aux_bias"})
WITH_AUX = frozenset({"gelu_aux_bias", "dgelu"})
DTYPES = ("bf16", "f16")
CUDA_DTYPES = {**CUDA_TYPES, "f16": 2}


def takes(g: Gemm) -> bool:
    """Whether `g`'s shape is one the fused path is made for: a single GEMM (fixed addresses)
    of 16-bit floats into the same dtype. cuBLASLt may still refuse it (`refusal`)."""
    return g.batch == 1 and g.arrays is None and g.dtype in DTYPES and g.out in ("", g.dtype)


@memoized("gemm epilogue refusals", "kernels_max_entries")
def refusal(g: Gemm) -> str | None:
    """Why cuBLASLt does not run `g` with its epilogue on the current GPU, or None when it does:
    it runs once on zeroed buffers of its own."""
    import cupy

    try:
        issuer = Issuer(g, handle(cupy.cuda.Device().id))
        issuer.warm_up()
    except AccyError as error:
        log.warning(
            "GEMM %s with a %s epilogue declined (plain GEMM, then a loop): %s",
            f"{g.m}x{g.n}x{g.k}",
            g.epilogue,
            error,
        )
        return str(error)
    return None


def refusal_here(g: Gemm) -> str | None:
    """`refusal` where a GPU is at hand; None (taken) where none is, as when CUDA code is
    generated on a machine without one (the GPU's load checks again: `Issuer.warm_up`)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
    except Exception:  # no CuPy, no driver: nothing to ask
        return None
    return refusal(g)


class Issuer:
    """The cuBLASLt descriptor and layouts of one `Gemm` with an epilogue; `issue` enqueues it."""

    def __init__(self, g: Gemm, library: tuple[ctypes.CDLL, c_void_p]):
        if g.epilogue not in EPILOGUES or not takes(g):
            raise AccyError(
                f"no cuBLASLt epilogue GEMM for {g} (single GEMMs of bf16 or f16 with one of "
                f"the epilogues {', '.join(EPILOGUES)})"
            )
        self.g = g
        self.lib, self.handle = library
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        data = CUDA_DTYPES[g.dtype]
        self.desc = matmul_descriptor(self.lib)
        self._set(TRANSA, c_int(g.transa))
        self._set(TRANSB, c_int(g.transb))
        self._set(EPILOGUE, c_int(EPILOGUES[g.epilogue]))
        if g.epilogue in WITH_BIAS:
            self._set(BIAS_DATA_TYPE, c_int(data))
        if g.epilogue in WITH_AUX:  # laid out as the result (its dtype: cuBLASLt's default)
            self._set(EPILOGUE_AUX_LD, c_int64(g.ldc))
        a_rows, a_cols = (g.m, g.k) if g.transa == 0 else (g.k, g.m)
        b_rows, b_cols = (g.k, g.n) if g.transb == 0 else (g.n, g.k)
        result = (data, g.m, g.n, g.ldc)
        shapes = ((data, a_rows, a_cols, g.lda), (data, b_rows, b_cols, g.ldb), result, result)
        self.layouts = [matrix_layout(self.lib, *shape) for shape in shapes]

    def _set(self, attribute: int, value: Any) -> None:
        set_attribute(self.lib, self.desc, attribute, value)

    def matmul(
        self,
        a: int,
        b: int,
        c: int,
        bias: int | None,
        aux: int | None,
        workspace: int,
        size: int,
        stream: int,
    ):
        """`cublasLtMatmul` of the GEMM; its status."""
        for pointer, attribute, needed in (
            (bias, BIAS_POINTER, WITH_BIAS),
            (aux, EPILOGUE_AUX_POINTER, WITH_AUX),
        ):
            if self.g.epilogue in needed:
                if pointer is None:
                    raise AccyError(
                        f"internal: the {self.g.epilogue} GEMM {self.g} lacks a pointer"
                    )
                self._set(attribute, c_void_p(pointer))
        la, lb, lc, ld = self.layouts
        return self.lib.cublasLtMatmul(
            self.handle,
            self.desc,
            ctypes.byref(self.alpha),
            c_void_p(a),
            la,
            c_void_p(b),
            lb,
            ctypes.byref(self.beta),
            c_void_p(c),
            lc,
            c_void_p(c),
            ld,
            None,
            c_void_p(workspace),
            c_size_t(size),
            c_void_p(stream),
        )

    def warm_up(self) -> None:
        """One call outside any capture, on zeroed buffers of its own; `AccyError` with
        cuBLASLt's status where it refuses."""
        import cupy

        g = self.g
        a = cupy.zeros(g.lda * (g.k if g.transa == 0 else g.m), cupy.uint16)
        b = cupy.zeros(g.ldb * (g.n if g.transb == 0 else g.k), cupy.uint16)
        c = cupy.zeros(g.ldc * g.n, cupy.uint16)
        aux = cupy.zeros(g.ldc * g.n, cupy.uint16)
        bias = cupy.zeros(g.m, cupy.uint16)
        workspace = cupy.zeros(WARM_UP_WORKSPACE, cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        pointers = (a.data.ptr, b.data.ptr, c.data.ptr, bias.data.ptr, aux.data.ptr)
        status = self.matmul(*pointers, workspace.data.ptr, WARM_UP_WORKSPACE, stream.ptr)
        stream.synchronize()
        check(status, f"cublasLtMatmul {g.m}x{g.n}x{g.k} with a {g.epilogue} epilogue")


WARM_UP_WORKSPACE = 32 << 20  # cuBLAS's (`cublas.WORKSPACE_BYTES`): what the calls get


class EpilogueGemms:
    """The epilogue GEMMs of one cuBLAS handle: an `Issuer` per `Gemm` record (made on first
    use), issued on the handle's stream with its workspace."""

    def __init__(self, workspace: int, size: int):
        self.workspace, self.size = workspace, size
        self.stream = 0
        self.library: tuple[ctypes.CDLL, c_void_p] | None = None
        self._issuers: dict[Gemm, Issuer] = {}

    def bind(self, stream: int) -> None:
        """Issue on `stream`. Called before a capture begins, so the cuBLASLt handle is made
        here, outside it (a fragment loaded from the disk cache was not compiled in this
        process, where `refusal` would have made it)."""
        self.stream = stream
        if self.library is None:
            import cupy

            with contextlib.suppress(AccyError):  # no cuBLASLt: no epilogue GEMM either
                self.library = handle(cupy.cuda.Device().id)

    def issue(self, g: Gemm, a: int, b: int, c: int, bias: int | None, aux: int | None) -> None:
        issuer = self._issuers.get(g)
        if issuer is None:
            if self.library is None:
                raise AccyError(f"cuBLASLt is not loaded for the {g.epilogue} GEMM {g}")
            issuer = self._issuers[g] = Issuer(g, self.library)
        status = issuer.matmul(a, b, c, bias, aux, self.workspace, self.size, self.stream)
        check(status, f"cublasLtMatmul {g.m}x{g.n}x{g.k} with a {g.epilogue} epilogue")
