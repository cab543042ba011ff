"""The system C compiler and the on-disk cache of the shared objects it builds.

An entry's key is a sha256 of the code generator's version, the compiler's identity (its
resolved path, size and modification time: no process is started to learn it), the CPU's
identity (for `-march=native`), the flags and the source. An entry is `<key>.so` beside
`<key>.sha256`, the digest of the `.so`; an entry whose digest does not match is rebuilt, not
trusted. Files are written under temporary names and moved into place with `os.replace`, and a
lock file per key makes a second process wait for the first one's build rather than repeat it.
The cache lives in `$ACCY_CACHE_DIR`, or `~/.cache/accy`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...errors import CompileError, RuntimeUnavailable

CODEGEN_VERSION = "accy-cpu-2"
BASE_FLAGS = (
    "-O3",
    "-march=native",
    "-fPIC",
    "-shared",
    "-std=gnu11",
    "-fwrapv",  # integer arithmetic wraps, as NumPy's does
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=off",  # no fused multiply-add: results stay those of the reference
    "-pipe",  # no temporary files between the compiler's stages
    # Only what the code calls is linked (below): the C library's start files and linker
    # script cost a small program's build a sixth of its time, and the few libc functions the
    # code calls (memcpy, memset) resolve against the process's C library when it is loaded.
    "-nostdlib",
)
# libgcc (a static archive) has the _Float16 <-> double conversions; libm the scalar math.
LIBRARIES = ("-lm", "-lgcc")

_compiles = 0


def compile_count() -> int:
    """How many times this process has run the C compiler (cache hits do not count).

    >>> compile_count() >= 0
    True
    """
    return _compiles


@dataclass(frozen=True)
class Compiler:
    """A C compiler: the path to run, and an identity that changes when the binary does."""

    path: str
    identity: str


def find_compiler() -> Compiler:
    """The C compiler: `$CC` if set, else gcc, cc or clang on the PATH.

    >>> try:
    ...     found = bool(find_compiler().identity)
    ... except RuntimeUnavailable:
    ...     found = True  # no compiler here: the error says so
    >>> found
    True
    """
    requested = os.environ.get("CC")
    names = [requested] if requested else ["gcc", "cc", "clang"]
    for name in names:
        path = shutil.which(name)
        if path:
            real = os.path.realpath(path)
            stat = os.stat(real)
            return Compiler(path, f"{real}:{stat.st_size}:{stat.st_mtime_ns}")
    looked = f"$CC={requested!r}" if requested else "gcc, cc or clang on the PATH"
    raise RuntimeUnavailable(
        f"native CPU backend: no C compiler found (looked for {looked}); install gcc, or run "
        f"programs with accy.reference.run / device='reference'"
    )


def cpu_identity() -> str:
    """What `-march=native` depends on: the CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo") as info:
            lines = [line for line in info if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return os.uname().machine


def flags_for(source: str) -> tuple[str, ...]:
    """The compiler flags for `source`."""
    # OpenMP's runtime is linked only into programs that have a parallel loop; simd pragmas
    # alone need just the compiler's support for them.
    openmp = "-fopenmp" if "omp parallel" in source else "-fopenmp-simd"
    vector_math = ("-lmvec",) if 'simd("notinbranch")' in source else ()
    return (*BASE_FLAGS, openmp, *vector_math, *LIBRARIES)


def cache_directory() -> Path:
    """Where built libraries are kept: `$ACCY_CACHE_DIR/cpu` or `~/.cache/accy/cpu`."""
    root = os.environ.get("ACCY_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "accy"
    )
    return Path(root) / "cpu"


def _entry_directory(key: str) -> Path:
    """The folder of a cache entry, created; a cache that cannot be written (a read-only home)
    falls back to a per-user folder in the temporary directory."""
    try:
        directory = cache_directory() / key[:2]
        directory.mkdir(parents=True, exist_ok=True)
        return directory
    except OSError:
        fallback = Path(tempfile.gettempdir()) / f"accy-{os.getuid()}" / "cpu" / key[:2]
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


def cache_key(compiler: Compiler, flags: tuple[str, ...], source: str) -> str:
    """The sha256 (hex) naming the cache entry of `source` built with `flags`."""
    digest = hashlib.sha256()
    for part in (CODEGEN_VERSION, compiler.identity, cpu_identity(), " ".join(flags), source):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def is_valid(library: Path) -> bool:
    """Whether a cache entry is complete and its digest matches."""
    recorded = library.with_suffix(".sha256")
    try:
        return recorded.read_text().strip() == _digest(library)
    except OSError:
        return False


def _write_atomically(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(handle, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


@contextmanager
def _locked(path: Path):
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_compiler(compiler: Compiler, flags, source_path: Path, output: Path) -> None:
    global _compiles
    _compiles += 1
    libraries = [flag for flag in flags if flag.startswith("-l")]
    options = [flag for flag in flags if not flag.startswith("-l")]
    command = [compiler.path, *options, str(source_path), "-o", str(output), *libraries]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise CompileError(
            f"the C compiler rejected generated code (a bug in accy): {' '.join(command)}\n"
            f"{result.stderr[-4000:]}"
        )


def build(source: str) -> Path:
    """The path of a shared object built from `source`, from the cache when it is there."""
    compiler = find_compiler()
    flags = flags_for(source)
    key = cache_key(compiler, flags, source)
    directory = _entry_directory(key)
    library = directory / f"{key}.so"
    if is_valid(library):
        return library
    with _locked(directory / f"{key}.lock"):
        if is_valid(library):
            return library
        source_path = directory / f"{key}.c"
        _write_atomically(source_path, source.encode())
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f"{key}.", suffix=".so.tmp")
        os.close(handle)
        try:
            _run_compiler(compiler, flags, source_path, Path(temporary))
            digest = _digest(Path(temporary))
            os.replace(temporary, library)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        _write_atomically(library.with_suffix(".sha256"), digest.encode())
    return library


def discard(library: Path) -> None:
    """Remove a cache entry that failed to load, so that the next build replaces it."""
    for path in (library, library.with_suffix(".sha256")):
        path.unlink(missing_ok=True)
