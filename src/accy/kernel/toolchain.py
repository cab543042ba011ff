"""The compilers behind kernel artifacts: a C compiler for CPU kernels, NVRTC or nvcc for PTX.

A compiler that is missing raises `accy.RuntimeUnavailable`; generated code that fails to
compile raises `accy.CompileError` with the compiler's message and the path of the source, which
is kept on disk for inspection. Generated sources go to a per-process folder
(`work_directory`); built shared libraries go to the disk cache, `accy.codegen.cache`
(namespace "kernel").
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..codegen import cache
from ..codegen.compiler import find_compiler
from ..config import config
from ..errors import CompileError, RuntimeUnavailable

CACHE = cache.Cache("kernel")
CACHE_VERSION = "accy-kernel-1"

# -Werror makes a warning in generated code fail loudly in accy's tests, where it is a bug.
STRICT_C_FLAGS = ("-std=c11", "-Wall", "-Wextra", "-Werror")


@functools.cache  # not a cache: the process's one folder, made once
def work_directory() -> Path:
    """A per-process directory for generated sources and built objects.

    >>> work_directory().is_dir()
    True
    """
    return Path(tempfile.mkdtemp(prefix="accy-kernel-"))


def _source_file(source: str, suffix: str) -> Path:
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = work_directory() / f"kernel_{digest}{suffix}"
    if not path.exists():
        partial = _partial(path)
        partial.write_text(source)
        partial.replace(path)
    return path


def _partial(path: Path) -> Path:
    # Written under a private name and renamed into place, so that another thread never reads
    # (or loads) a file that is half written.
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")


def _run(command: list[str], what: str, source: Path, into_cache: bool = False) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 and cache.out_of_space(result.stderr):
        reason = f"{what}: the compiler ran out of disk space: {result.stderr.strip()}"
        if into_cache:  # a cache folder that cannot be written: the cache's fallback handles it
            raise OSError(errno.ENOSPC, reason)
        raise RuntimeUnavailable(f"{reason}; free some space and try again")
    if result.returncode != 0:
        raise CompileError(
            f"{what} failed to compile (source kept at {source}); this is a bug in accy.kernel:"
            f"\n$ {' '.join(command)}\n{result.stderr.strip()}"
        )


def check_c_source(source: str, what: str, *, strict: bool = False) -> None:
    """Compile `source` for syntax and types only, so errors surface now, not at link time.

    >>> check_c_source("static inline int one(void) { return 1; }", "example", strict=True)
    """
    path = _source_file(source, ".c")
    flags = list(STRICT_C_FLAGS if strict else ("-std=c11",))
    _run([find_compiler("accy.kernel").path, *flags, "-fsyntax-only", str(path)], what, path)


def _library_step(source: str, what: str):
    compiler = find_compiler("accy.kernel")
    flags = (*STRICT_C_FLAGS, "-O1", "-shared", "-fPIC")
    entry_key = cache.key(CACHE_VERSION, compiler.identity, " ".join(flags), source)

    def compile(output: Path) -> None:
        path = _source_file(source, ".c")
        _run([compiler.path, *flags, str(path), "-o", str(output), "-lm"], what, path, True)

    return entry_key, compile


def build_shared_library(source: str, what: str) -> Path:
    """Compile `source` into a shared library (cached on disk by content) and return its path.

    >>> build_shared_library("int accy_example_one(void) { return 1; }", "example").suffix
    '.so'
    """
    return CACHE.build(*_library_step(source, what))


def load_shared_library(source: str, what: str, symbols: Iterable[str] = ()) -> ctypes.CDLL:
    """The shared library built from `source`, loaded, with each of `symbols` looked up; one
    that cannot be loaded or lacks a symbol is built again into a private folder
    (`accy.codegen.cache.Cache.load`).

    >>> load_shared_library("int accy_example_two(void) { return 2; }", "example",
    ...                     ["accy_example_two"]).accy_example_two()
    2
    """
    names = tuple(symbols)

    def open_library(path: Path) -> ctypes.CDLL:
        library = ctypes.CDLL(str(path))
        for name in names:
            getattr(library, name)  # AttributeError if it is missing
        return library

    return CACHE.load(*_library_step(source, what), open_library)


# ---------------------------------------------------------------------------------------------
# PTX


def nvcc() -> str | None:
    """The nvcc on PATH (or in $CUDA_HOME/bin), or None.

    >>> nvcc() is None or nvcc().endswith("nvcc")
    True
    """
    found = shutil.which("nvcc")
    cuda_home = config.environment("CUDA_HOME") or config.environment("CUDA_PATH")
    if found is None and cuda_home and Path(cuda_home, "bin", "nvcc").exists():
        found = str(Path(cuda_home, "bin", "nvcc"))
    return found


# No fused multiply-add contraction: a kernel then rounds every op as the C kernel and the
# reference evaluator do, so the CPU and CUDA backends agree bit for bit on arithmetic.
NVCC_FLAGS = ("-fmad=false",)


def cuda_to_ptx(source: str, what: str, *, arch: str | None = None) -> str:
    """PTX for CUDA C `source`: through NVRTC when cuda.core or CuPy is importable, else nvcc.

    `arch` is a virtual architecture such as "compute_90"; None takes the compiler's default.

    >>> from accy.kernel.examples import custom_double_kernel
    >>> source = custom_double_kernel().cuda_source()
    >>> nvcc() is None or ".entry accy_kernel_accy_custom_double_4_f32(" in cuda_to_ptx(source, "x")
    True
    """
    failures = []
    for package, compile_with_nvrtc in NVRTC_COMPILERS.items():
        try:
            return compile_with_nvrtc(source, arch)
        except ImportError:
            continue
        except Exception as error:  # NVRTC's errors have no common type across packages
            failures.append(f"NVRTC through {package}: {error}")
    if nvcc() is not None:
        return ptx_with_nvcc(source, what, arch=arch)
    path = _source_file(source, ".cu")
    if failures:
        raise CompileError(f"{what} failed to compile (source at {path}):\n" + "\n".join(failures))
    raise RuntimeUnavailable(
        f"{what}: no CUDA compiler: install cuda-core or cupy (for NVRTC) or put nvcc on PATH"
    )


def ptx_with_nvcc(source: str, what: str, *, arch: str | None = None) -> str:
    """PTX from `nvcc -ptx`, or CompileError with nvcc's message.

    >>> nvcc() is None or ".version" in ptx_with_nvcc("__global__ void nop() {}", "nop")
    True
    """
    compiler = nvcc()
    if compiler is None:
        raise RuntimeUnavailable(f"{what}: nvcc is not on PATH (nor in $CUDA_HOME/bin)")
    path = _source_file(source, ".cu")
    output = path.with_suffix(f".{arch or 'default'}.ptx")
    arch_flags = [f"-arch={arch}"] if arch else []
    command = [compiler, "-ptx", *NVCC_FLAGS, *arch_flags, str(path), "-o", str(output)]
    _run(command, what, path)
    return output.read_text()


def _ptx_with_cuda_core(source: str, arch: str | None) -> str:
    try:
        from cuda.core import Program, ProgramOptions
    except ImportError:
        from cuda.core.experimental import Program, ProgramOptions
    architecture = {"arch": arch.replace("compute_", "sm_")} if arch else {}
    options = ProgramOptions(fma=False, **architecture)
    code = Program(source, "c++", options=options).compile("ptx").code
    return code.decode().rstrip("\0") if isinstance(code, bytes | bytearray) else str(code)


def _ptx_with_cupy(source: str, arch: str | None) -> str:
    options = ["--fmad=false", *([f"--gpu-architecture={arch}"] if arch else [])]
    return nvrtc_through_cupy(source, options, "ptx").decode().rstrip("\0")


def nvrtc_through_cupy(source: str, options: Sequence[str], output: str) -> bytes:
    """NVRTC's `output` ("ptx" or "cubin") of `source` under `options`, through CuPy's binding
    (CuPy's own compile helpers choose the output themselves); RuntimeError with NVRTC's log
    when it does not compile.

    >>> import importlib.util
    >>> importlib.util.find_spec("cupy_backends") is None or b".entry nop" in nvrtc_through_cupy(
    ...     'extern "C" __global__ void nop() {}', [], "ptx")
    True
    """
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(source, "kernel.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, list(options))
        except nvrtc.NVRTCError as error:
            raise RuntimeError(f"{error}\n{nvrtc.getProgramLog(program)}") from error
        binary = nvrtc.getCUBIN(program) if output == "cubin" else nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    return bytes(binary) if isinstance(binary, bytes | bytearray) else str(binary).encode()


# Tried in order; a package that is not installed raises ImportError and is skipped.
NVRTC_COMPILERS = {"cuda.core": _ptx_with_cuda_core, "cupy": _ptx_with_cupy}
