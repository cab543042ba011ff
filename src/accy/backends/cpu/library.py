"""Loading a built shared object once per process and giving it its BLAS."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

from .blas import Blas

_loaded: dict[Path, ctypes.CDLL] = {}
_lock = threading.Lock()


def load_library(path: Path, blas: Blas | None) -> ctypes.CDLL:
    """The library at `path`, loaded (once) with its entry point's argument types set."""
    with _lock:
        if path not in _loaded:
            library = ctypes.CDLL(str(path))
            library.accy_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            library.accy_run.restype = None
            if blas is not None:
                library.accy_set_blas(ctypes.c_void_p(blas.sgemm), ctypes.c_void_p(blas.dgemm))
            _loaded[path] = library
        return _loaded[path]
