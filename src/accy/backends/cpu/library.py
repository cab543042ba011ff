"""Loading a built shared object once per process and giving it its BLAS.

OpenMP threads that wait for work spin by default; when the machine's cores are busy with other
processes, a spinning thread holds a core that the thread it waits for needs, and a parallel
loop can take tens of times longer than a serial one. Unless the user chose otherwise, accy asks
for passive waiting before the OpenMP runtime first loads (its work per parallel loop is large
enough that the cost of waking a sleeping thread does not matter).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from .blas import Blas

_loaded: dict[Path, ctypes.CDLL] = {}
_lock = threading.Lock()


def load_library(path: Path, blas: Blas | None) -> ctypes.CDLL:
    """The library at `path`, loaded (once) with its entry point's argument types set."""
    with _lock:
        if path not in _loaded:
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            library = ctypes.CDLL(str(path))
            library.accy_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            library.accy_run.restype = None
            library.accy_run_arrays.argtypes = [ctypes.c_void_p]
            library.accy_run_arrays.restype = None
            if blas is not None:
                pointers = (blas.sgemm, blas.dgemm, blas.set_threads, blas.get_threads)
                library.accy_set_blas(*(ctypes.c_void_p(p) for p in pointers))
            _loaded[path] = library
        return _loaded[path]
