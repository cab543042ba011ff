"""Find a BLAS whose `cblas_sgemm`/`cblas_dgemm` the generated code can call through pointers.

Probed in order, once per process:

1. the library named by the environment variable `ACCY_BLAS_LIBRARY` (a path);
2. the OpenBLAS that NumPy's wheel bundles (`numpy.libs/libscipy_openblas64_*.so`, exporting
   `scipy_cblas_sgemm64_` with 64-bit integers), already loaded by NumPy;
3. the `scipy-openblas64` or `scipy-openblas32` wheels, if installed;
4. a system `libopenblas` or `libcblas`.

The symbol names of NumPy's copy are an implementation detail of its wheel, hence the probing.
With no BLAS at all, contractions are generated as plain C loops (correct, much slower).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from ...caches import memoized
from ...config import config

# Setters and getters of the library's thread count, when it exports them.
THREAD_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)

# The name of the CPU core whose kernels the library runs (OpenBLAS's DYNAMIC_ARCH choice).
CORE_NAME_SYMBOLS = (
    "scipy_openblas_get_corename64_",
    "openblas_get_corename64_",
    "scipy_openblas_get_corename",
    "openblas_get_corename",
)
# OpenBLAS cores whose sgemm is an AVX-512 kernel of its own.
AVX512_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})

# (sgemm symbol, dgemm symbol, integer bits), most specific first.
SYMBOLS = (
    ("scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", 64),
    ("cblas_sgemm64_", "cblas_dgemm64_", 64),
    ("scipy_cblas_sgemm", "scipy_cblas_dgemm", 32),
    ("cblas_sgemm", "cblas_dgemm", 32),
)


@dataclass(frozen=True)
class Blas:
    """A loaded BLAS: its path, the addresses of its GEMMs (and thread-count functions), and
    the width of its integer arguments."""

    path: str
    sgemm: int
    dgemm: int
    integer_bits: int
    set_threads: int = 0  # void (*)(int), or 0 where the library has none
    get_threads: int = 0  # int (*)(void)
    # What runs float32 GEMMs in this library's place, where something does (empty: its own
    # sgemm); see `accy.backends.cpu.gemm`.
    sgemm_kernel: str = ""
    mixed_gemm: int = 0  # that kernel's bf16 GEMM, once loaded (`accy_gemm_mixed`)
    core: str = ""  # the CPU core the library's kernels are for ("" where it does not say)

    @property
    def runs_avx512(self) -> bool:
        """Whether the library's own sgemm is an AVX-512 kernel (an OpenBLAS not held to its
        AVX2 kernels by `OPENBLAS_CORETYPE=Haswell`)."""
        return self.core.lower() in AVX512_CORES

    @property
    def c_int_type(self) -> str:
        return "int64_t" if self.integer_bits == 64 else "int32_t"

    def __str__(self) -> str:
        return f"{os.path.basename(self.path)} ({self.integer_bits}-bit integers)"


def _address(library: ctypes.CDLL, name: str) -> int:
    try:
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0
    except AttributeError:
        return 0


def _probe(path: str) -> Blas | None:
    try:
        library = ctypes.CDLL(path)
    except OSError:
        return None
    for sgemm, dgemm, bits in SYMBOLS:
        s, d = _address(library, sgemm), _address(library, dgemm)
        if s and d:
            threads = [(_address(library, a), _address(library, b)) for a, b in THREAD_SYMBOLS]
            setter, getter = next(((a, b) for a, b in threads if a and b), (0, 0))
            return Blas(path, s, d, bits, setter, getter, core=_core_name(library))
    return None


def _core_name(library: ctypes.CDLL) -> str:
    for name in CORE_NAME_SYMBOLS:
        function = getattr(library, name, None)
        if function is not None:
            function.restype = ctypes.c_char_p
            return (function() or b"").decode(errors="replace")
    return ""


def _numpy_bundled() -> list[str]:
    import numpy

    root = os.path.dirname(os.path.dirname(numpy.__file__))
    patterns = ("numpy.libs/*openblas*", "numpy/.dylibs/*openblas*")
    return sorted(p for pattern in patterns for p in glob.glob(os.path.join(root, pattern)))


def _scipy_openblas_wheels() -> list[str]:
    paths = []
    for name in ("scipy_openblas64", "scipy_openblas32"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        paths += sorted(glob.glob(os.path.join(module.get_lib_dir(), "*openblas*")))
    return paths


def _system() -> list[str]:
    found = (ctypes.util.find_library(name) for name in ("openblas", "cblas", "blas"))
    return [path for path in found if path]


def candidate_paths() -> Iterator[str]:
    """Library paths to probe, in the order of the module docstring (found lazily: asking the
    system's linker for a library starts processes)."""
    override = config.blas_library
    if override:
        yield override
    yield from _numpy_bundled()
    yield from _scipy_openblas_wheels()
    yield from _system()


@memoized("blas library")
def find_blas() -> Blas | None:
    """The first usable BLAS (see the module docstring), or None.

    >>> from accy.backends.cpu.blas import find_blas
    >>> find_blas() is None or find_blas().integer_bits in (32, 64)
    True
    """
    for path in candidate_paths():
        blas = _probe(path)
        if blas is not None:
            return blas
    return None
