"""The system C compiler, and how the shared objects it builds are keyed in the disk cache.

An entry's key is a sha256 of the code generator's version, the compiler's identity (its
resolved path, size and modification time: no process is started to learn it), the CPU's
identity (for `-march=native`), the flags and the source. Where and how entries are stored,
verified, locked and evicted is `accy.codegen.cache` (namespace "cpu").
"""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TypeVar

from ...caches import memoized
from ...codegen import cache
from ...codegen.cache import discard as discard
from ...codegen.cache import is_valid as is_valid
from ...codegen.compiler import Compiler, find_compiler
from ...config import ConfigError, config
from ...errors import CompileError, RuntimeUnavailable

T = TypeVar("T")
CACHE = cache.Cache("cpu")

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


@memoized("cpu identity")
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


def cache_key(compiler: Compiler, flags: tuple[str, ...], source: str) -> str:
    """The sha256 (hex) naming the cache entry of `source` built with `flags`."""
    return cache.key(CODEGEN_VERSION, compiler.identity, cpu_identity(), " ".join(flags), source)


IDLE_READINGS = 4
"""How many counts of running threads `core_idle_now` takes before it calls a core idle."""

SPLIT_MARKER = "/* accy: the steps in two parts */"
"""In a source whose steps may be compiled as two units at once (`source.PARTS`): one without
custom kernels or data files, whose symbols would be defined twice."""


def compiled_in_parts(source: str, data: Mapping[str, bytes]) -> bool:
    """True when `source` is compiled as two units at once, one a core, then linked: it allows
    it and `accy.config.cpu_compile_in_parts` is on, or "auto" and a core is idle, by the
    1-minute load average or by the threads running right now (`running_elsewhere`). The split
    costs a second parse and a link, a fifth more compiler time in all, and takes a third off
    the compile's wall time when the second core is free; where other work keeps every core
    busy (parallel test workers, each compiling), it would only add that fifth.

    >>> compiled_in_parts("int x;", {})
    False
    """
    policy = config.cpu_compile_in_parts.lower()
    if policy not in ("auto", "on", "off"):
        raise ConfigError(
            f"accy.config.cpu_compile_in_parts ($ACCY_CPU_COMPILE_IN_PARTS) is {policy!r}; it "
            f"must be one of auto, on, off"
        )
    if SPLIT_MARKER not in source or data or policy == "off":
        return False
    if policy == "on":
        return True
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        return False
    # The load average lags by a minute: a benchmark that ran before this process (or a
    # compile that just ended) still counts there, while the count of running threads is now
    # (read a few times over some milliseconds: other work comes and goes).
    return os.getloadavg()[0] <= cores - 1 or core_idle_now(cores)


def core_idle_now(cores: int, readings: int = IDLE_READINGS) -> bool:
    """True when every one of `readings` counts of the threads running outside this process,
    a millisecond apart, leaves one of `cores` cores idle (`running_elsewhere`).

    >>> core_idle_now(1)
    False
    """
    for reading in range(readings):
        elsewhere = running_elsewhere()
        if elsewhere is None or elsewhere > cores - 2:
            return False
        if reading + 1 < readings:
            time.sleep(0.001)
    return True


def running_elsewhere() -> int | None:
    """How many threads outside this process are running or waiting for a core right now
    (Linux's /proc/loadavg less this process's running threads); None where /proc cannot say.

    >>> n = running_elsewhere()
    >>> n is None or n >= 0
    True
    """
    try:
        with open("/proc/loadavg") as loadavg:
            running = int(loadavg.read().split()[3].split("/")[0])
        own = 0
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/stat") as stat:
                own += stat.read().rsplit(")", 1)[1].split()[0] == "R"
    except (OSError, ValueError, IndexError):
        return None
    return max(running - own, 0)


def _run_compiler(
    compiler: Compiler, flags, source: str, data: Mapping[str, bytes], output: Path
) -> None:
    global _compiles
    _compiles += 1
    source_path = output.with_suffix(".c")
    source_path.write_text(source)
    for name, payload in data.items():  # the files `.incbin` includes, beside the source
        (output.parent / name).write_bytes(payload)
    libraries = [flag for flag in flags if flag.startswith("-l")]
    options = [flag for flag in flags if not flag.startswith("-l")]
    if data:
        options.append(f"-Wa,-I{output.parent}")
    inputs = [str(source_path)]
    if compiled_in_parts(source, data):
        inputs = [str(output.with_suffix(f".part{k}.o")) for k in range(2)]
        units = [
            [compiler.path, *options, "-c", f"-DACCY_PART={k}", str(source_path), "-o", path]
            for k, path in enumerate(inputs)
        ]
        started = [_start(compiler, command) for command in units]
        finished = [process.communicate()[1] for process in started]  # both, then the checks
        for command, process, stderr in zip(units, started, finished, strict=True):
            _check(command, process.returncode, stderr, source, output)
    command = [compiler.path, *options, *inputs, "-o", str(output), *libraries]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        raise _not_started(compiler, error) from error
    _check(command, result.returncode, result.stderr, source, output)


def _start(compiler: Compiler, command: list[str]) -> subprocess.Popen:
    """`command` started (one of the units compiled at once)."""
    try:
        return subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
    except OSError as error:
        raise _not_started(compiler, error) from error


def _not_started(compiler: Compiler, error: OSError) -> RuntimeUnavailable:
    # Not a file the cache failed to write: the compiler did not start.
    return RuntimeUnavailable(
        f"native CPU backend: cannot run the C compiler {compiler.path} ({error}); set $CC "
        f"to a working C compiler"
    )


def _check(command: list[str], returncode: int, stderr: str, source: str, output: Path) -> None:
    if returncode != 0 and cache.out_of_space(stderr):
        # A full disk is a folder that cannot be written: the cache's fallback handles it.
        raise OSError(
            errno.ENOSPC,
            f"the C compiler ran out of space writing into {output.parent}: "
            f"{stderr.strip().splitlines()[-1]}",
        )
    if returncode != 0:
        # The build's folder is removed on the way out: the source is kept elsewhere.
        handle, kept = tempfile.mkstemp(prefix="accy-failed-", suffix=".c")
        with os.fdopen(handle, "w") as file:
            file.write(source)
        raise CompileError(
            f"the C compiler rejected generated code (a bug in accy; source kept at {kept}): "
            f"{' '.join(command)}\n{stderr[-4000:]}"
        )


def _compile_step(
    source: str, data: Mapping[str, bytes] | None
) -> tuple[str, Callable[[Path], None]]:
    # The data files are named by their content's digest in `source`, so the key covers them.
    compiler = find_compiler()
    flags = flags_for(source)
    build_it = partial(_run_compiler, compiler, flags, source, dict(data or {}))
    return cache_key(compiler, flags, source), build_it


def build(source: str, data: Mapping[str, bytes] | None = None) -> Path:
    """The path of a shared object built from `source` (with the files `data` beside it, for
    `.incbin`), from the cache when it is there.

    >>> build("int accy_example(void) { return 1; }").suffix
    '.so'
    """
    return CACHE.build(*_compile_step(source, data))


def load(
    source: str, open_library: Callable[[Path], T], data: Mapping[str, bytes] | None = None
) -> T:
    """`open_library` of the shared object built from `source`; one that cannot be opened is
    built again into a private folder (`accy.codegen.cache.Cache.load`)."""
    return CACHE.load(*_compile_step(source, data), open_library)
