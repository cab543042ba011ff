"""A built shared object opened for one executable, and closed when nothing uses it any more.

Each `NativeLibrary` opens its file with its own `dlopen`; the dynamic loader counts the opens of
one file, so executables sharing a library each hold one count, and the code is unmapped when
the last `NativeLibrary` of that file is collected (`dlclose`). Whoever calls into the library
holds its `NativeLibrary`, so closing can never pull code out from under a call.

OpenMP threads that wait for work spin by default; when the machine's cores are busy with other
processes, a spinning thread holds a core that the thread it waits for needs, and a parallel
loop can take tens of times longer than a serial one. Unless the user chose otherwise, accy asks
for passive waiting before the OpenMP runtime first loads (its work per parallel loop is large
enough that the cost of waking a sleeping thread does not matter). The OpenMP runtime is never
unloaded (`pin_openmp_runtime`): its idle worker threads live on after a parallel loop.
"""

from __future__ import annotations

import _ctypes
import ctypes
import os
from pathlib import Path
from typing import Any

from ...config import config
from .blas import Blas

OPENMP_RUNTIMES = ("libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so")
_pinned: set[str] = set()


def pin_openmp_runtime() -> None:
    """Mark every OpenMP runtime loaded so far as never to be unloaded: closing the last
    library that uses it must not unmap code its worker threads are waiting in."""
    for name in OPENMP_RUNTIMES:
        if name in _pinned:
            continue
        try:
            ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_NODELETE)
        except OSError:
            continue  # not loaded (yet)
        _pinned.add(name)


def _holding_gil(function: Any, *argtypes: Any) -> Any:
    """`function` (a ctypes function of the library) as one that keeps the GIL while it runs."""
    address = ctypes.cast(function, ctypes.c_void_p).value
    return ctypes.PYFUNCTYPE(None, *argtypes)(address)


class NativeLibrary:
    """The shared object at `path`, opened with its entry points' argument types set and its
    BLAS handed over; closed when this object is collected."""

    def __init__(self, path: Path, blas: Blas | None):
        config.set_environment("OMP_WAIT_POLICY", "PASSIVE", keep_existing=True)
        self.path = path
        self._library = ctypes.CDLL(str(path))
        pin_openmp_runtime()
        self.run = self._library.accy_run
        self.run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.run.restype = None
        self.run_arrays = self._library.accy_run_arrays
        self.run_arrays.argtypes = [ctypes.c_void_p]
        self.run_arrays.restype = None
        # The same two entry points called without releasing the GIL: for programs shorter
        # than the GIL's release and re-acquisition, which the GIL then also serializes.
        self.run_holding_gil = _holding_gil(self.run, ctypes.c_void_p, ctypes.c_void_p)
        self.run_arrays_holding_gil = _holding_gil(self.run_arrays, ctypes.c_void_p)
        if blas is not None:
            pointers = (blas.sgemm, blas.dgemm, blas.set_threads, blas.get_threads)
            self._library.accy_set_blas(*(ctypes.c_void_p(p) for p in pointers))
        if blas is not None and blas.mixed_gemm:  # accy's own GEMM kernel (`cpu.gemm`)
            self._library.accy_set_gemm_mixed(ctypes.c_void_p(blas.mixed_gemm))

    def set_shared(self, shared: ctypes.c_void_p) -> None:
        """Hand the library the process's shared block (`compile.SHARED`)."""
        self._library.accy_set_shared(shared)

    # dlclose is bound here, as a default: at interpreter exit module globals may be gone.
    def __del__(self, _dlclose=_ctypes.dlclose) -> None:
        library = getattr(self, "_library", None)
        if library is not None:
            _dlclose(library._handle)


__all__ = ["NativeLibrary", "pin_openmp_runtime"]
