"""Compiled fragments kept in the disk cache, so that a process compiling a program that some
process compiled before skips planning and code generation.

A backend's artifact compiler calls `stored(cache, entry_key, program, make)`: `make()` compiles
`program` (a miss), and its result is pickled into the entry of `entry_key` in `cache`, an
`accy.codegen.cache.Cache` (the project's one disk cache: its trust check, locks, LRU bound and
private-folder fallback apply unchanged; a second process waits for the first one's compile
rather than repeating it). A hit unpickles the entry instead. The program itself is not stored:
the fragment's reference to it is written as a placeholder and read back as the caller's
`program` (the same object, whatever its size).

The key is the caller's, from the parts it depends on; `source_digest()` (the accy package's
source, NumPy's and Python's versions) and `accy.config.code_key()` (the settings that change
generated code, by name) are the parts every backend shares. A fragment that cannot be
pickled (a library step holding a live handle) is returned as compiled and not stored; an entry
that cannot be read back (it passed the trust check, so written by an accy with the same source:
this should not happen) is discarded and compiled again, with a `CacheWarning`.

Trust: unpickling runs code named in the entry, so an entry is read only from a folder the
`Cache` accepts (owned by this user, writable by no one else) and only when its digest file
binds it to its key (the `Cache`'s trust rules); the same rules under which the CPU backend
loads the shared libraries it finds there.
"""

from __future__ import annotations

import gc
import hashlib
import io
import pickle
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..caches import memoized
from ..codegen.cache import Cache, discard
from ..errors import CacheWarning

T = TypeVar("T")

PROGRAM = "program"  # the placeholder of the caller's program in a stored fragment


@memoized("accy source digest")
def source_digest() -> str:
    """The sha256 of every .py file of the installed accy package (relative path and bytes),
    with the Python and NumPy versions (a stored fragment is a pickle of accy's records and
    NumPy arrays): computed once per process.

    >>> len(source_digest()) == 64 and source_digest() == source_digest()
    True
    """
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(f"python {sys.version_info[:2]} numpy {np.__version__}".encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(b"\0" + str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def fingerprint(value: Any) -> str | None:
    """The sha256 of `value`'s pickle, or None where it cannot be pickled: a key part for
    immutable records (kernel calls and their library steps). Equal records built alike give
    equal pickles; where two differ only in how they share objects, the key merely misses.

    >>> fingerprint(("a", 1)) == fingerprint(("a", 1)), fingerprint(lambda: 0)
    (True, None)
    """
    try:
        return hashlib.sha256(pickle.dumps(value, protocol=5)).hexdigest()
    except (pickle.PicklingError, TypeError, AttributeError):
        return None


class _Unstorable(Exception):
    """A fragment that cannot be pickled: returned as compiled, not stored."""


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, program: Any):
        super().__init__(file, protocol=5)
        self.program = program

    def persistent_id(self, obj: Any) -> str | None:
        return PROGRAM if obj is self.program else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, program: Any):
        super().__init__(file)
        self.program = program

    def persistent_load(self, pid: Any) -> Any:
        if pid != PROGRAM:
            raise pickle.UnpicklingError(f"unknown placeholder {pid!r} in a stored fragment")
        return self.program


def dumps(fragment: Any, program: Any) -> bytes:
    """`fragment` pickled, with `program` written as a placeholder (`loads` puts it back).

    >>> loads(dumps({"program": [1, 2], "n": 3}, None), "p")["n"]
    3
    """
    out = io.BytesIO()
    try:
        _Pickler(out, program).dump(fragment)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise _Unstorable(str(error)) from error
    return out.getvalue()


def loads(data: bytes, program: Any) -> Any:
    """The fragment `dumps` wrote, referring to `program` where it referred to its own.

    >>> program = object()
    >>> loads(dumps((program, 1), program), program)[0] is program
    True
    """
    # Without the cyclic garbage collector: unpickling makes a few hundred thousand objects,
    # whose allocations set off collections that each scan the whole heap (most of the time
    # of loading GPT-2's step: 0.23-0.37 s against 0.09 s without).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _Unpickler(io.BytesIO(data), program).load()
    finally:
        if enabled:
            gc.enable()


def stored(cache: Cache, entry_key: str | None, program: Any, make: Callable[[], T]) -> T:
    """The fragment of `entry_key` in `cache` (its `program` is the caller's), else `make()`,
    stored there; `entry_key` None (something it depends on has no key) only makes it.

    >>> import tempfile
    >>> from accy.codegen.cache import key
    >>> cache = Cache("example-fragment", ".pickle", root=Path(tempfile.mkdtemp()))
    >>> calls = []
    >>> make = lambda: calls.append(1) or {"program": "p", "source": "int x;"}
    >>> first = stored(cache, key("k"), "p", make)
    >>> again = stored(cache, key("k"), "p", make)
    >>> again == first, len(calls)
    (True, 1)
    """
    if entry_key is None:
        return make()
    made: list[T] = []

    def compile_and_write(output: Path) -> None:
        if not made:  # called again after a failed write (the Cache's fallback folder)
            made.append(make())
        output.write_bytes(dumps(made[0], program))

    try:
        path = cache.build(entry_key, compile_and_write)
    except _Unstorable:
        return made[0]
    if made:
        return made[0]
    try:
        return loads(path.read_bytes(), program)
    except Exception as error:  # noqa: BLE001 -- any failure to read it back: compile instead
        discard(path)
        warnings.warn(
            CacheWarning(
                f"accy: cannot read the compiled fragment {path} back ({type(error).__name__}: "
                f"{error}); compiling the program again"
            ),
            stacklevel=3,
        )
        return make()
