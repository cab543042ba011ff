"""The system C compiler, the one both C builders use (the CPU backend's programs and
`accy.kernel`'s kernels): `$CC` if set, else gcc, cc or clang on the PATH."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from ..config import config
from ..errors import RuntimeUnavailable
from .cache import file_identity

SEARCHED = ("gcc", "cc", "clang")
"""The compilers looked for on the PATH when `$CC` is unset, in this order."""


@dataclass(frozen=True)
class Compiler:
    """A C compiler: the path to run, and an identity that changes when the binary does."""

    path: str
    identity: str


def find_compiler(user: str = "native CPU backend") -> Compiler:
    """The C compiler: `$CC` if set (and only it), else gcc, cc or clang on the PATH. `user`
    names what needs it in the error raised when there is none.

    >>> try:
    ...     found = bool(find_compiler().identity)
    ... except RuntimeUnavailable:
    ...     found = True  # no compiler here: the error says so
    >>> found
    True
    """
    requested = config.environment("CC")
    names = [requested] if requested else list(SEARCHED)
    for name in names:
        path = shutil.which(name)
        if path:
            return Compiler(path, file_identity(path))
    looked = f"$CC={requested!r}" if requested else f"{', '.join(SEARCHED)} on the PATH"
    raise RuntimeUnavailable(
        f"{user}: no C compiler found (looked for {looked}); install gcc, or set $CC to a C "
        f"compiler; programs still run with device='reference'"
    )


__all__ = ["SEARCHED", "Compiler", "find_compiler"]
