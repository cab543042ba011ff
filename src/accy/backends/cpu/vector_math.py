"""Vectorized transcendentals: glibc's libmvec, where it has them.

GCC vectorizes a loop that calls `expf` only if `expf` is declared to have SIMD variants, which
glibc's headers do only under `-ffast-math` (which would also break NaN and infinity). The
generated code declares them itself, for the functions this machine's libmvec exports, and links
libmvec; the vector variants keep IEEE special values and are accurate to a few ulp. A loop over
`tanhf` and `expf` runs some twenty times faster on AVX-512.
"""

from __future__ import annotations

import ctypes
import platform

from ...caches import memoized

# C math function -> number of arguments (each also exists with an `f` suffix for float).
FUNCTIONS = {
    "exp": 1,
    "log": 1,
    "log1p": 1,
    "expm1": 1,
    "sin": 1,
    "cos": 1,
    "tan": 1,
    "tanh": 1,
    "pow": 2,
}


def _exported(library: ctypes.CDLL, symbol: str) -> bool:
    try:
        getattr(library, symbol)
    except AttributeError:
        return False
    return True


@memoized("vector math declarations")
def vector_declarations() -> tuple[str, ...]:
    """C declarations that give GCC the SIMD variants libmvec has here (none off x86-64 glibc).

    >>> from accy.backends.cpu.vector_math import vector_declarations
    >>> all("simd" in line for line in vector_declarations())
    True
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        return ()
    try:
        library = ctypes.CDLL("libmvec.so.1")  # by soname: find_library would start processes
    except OSError:
        return ()
    declarations = []
    for name, arity in FUNCTIONS.items():
        for c_type, suffix, lanes in (("float", "f", 4), ("double", "", 2)):
            # The SSE variant's name stands for the family: glibc ships every ISA's together.
            if _exported(library, f"_ZGVbN{lanes}{'v' * arity}_{name}{suffix}"):
                parameters = ", ".join([c_type] * arity)
                declarations.append(
                    f'__attribute__((simd("notinbranch"))) {c_type} {name}{suffix}({parameters});'
                )
    return tuple(declarations)
