"""The compile cache: reuse across processes, atomic writes, rebuilding what is corrupt, and a
clear error where no C compiler exists."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import accy
import accy.compat
from accy import f32, spec
from accy.backends.cpu import toolchain
from accy.backends.cpu.compile import compile_program

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import accy
    program = accy.trace.define(
        "cached_between_processes", [accy.spec(accy.f32, lane=5)],
        lambda b, a: (a[0].exp() * 3.0).sum())
    (total,) = accy.compile(program)(np.zeros(5, np.float32))
    print(accy.backends.cpu.compile_count(), float(total))
    """
)


@pytest.fixture
def logging_compiler(native_cpu, tmp_path):
    """A compiler wrapper that appends a line to a log each time it runs, then runs gcc."""
    log = tmp_path / "compiler.log"
    wrapper = tmp_path / "logging-cc"
    real = toolchain.find_compiler().path
    wrapper.write_text(f'#!/bin/sh\necho run >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return wrapper, log


def _run_script(cache: str, compiler, wait: bool = True):
    environment = {**os.environ, "ACCY_CACHE_DIR": cache, "CC": str(compiler)}
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=environment, stdout=subprocess.PIPE, text=True
    )
    if not wait:
        return process
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    return output.split()


@pytest.mark.slow
def test_a_second_process_reuses_the_disk_cache(logging_compiler, tmp_path):
    compiler, log = logging_compiler
    cache = str(tmp_path / "cache")
    first = _run_script(cache, compiler)
    second = _run_script(cache, compiler)
    assert first == ["1", "15.0"]
    assert second == ["0", "15.0"]  # no compile in the second process...
    assert log.read_text().splitlines() == ["run"]  # ...and the compiler never started


@pytest.mark.slow
def test_two_processes_compiling_at_once_both_succeed(logging_compiler, tmp_path):
    compiler, _ = logging_compiler
    cache = str(tmp_path / "cache")
    processes = [_run_script(cache, compiler, wait=False) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0].split() for p in processes]
    assert [p.returncode for p in processes] == [0, 0]
    assert [out[1] for out in outputs] == ["15.0", "15.0"]
    entries = [name for _, _, names in os.walk(cache) for name in names]
    assert sum(name.endswith(".so") for name in entries) == 1
    assert not [name for name in entries if name.endswith(".tmp")]


def _fresh_source(name: str) -> str:
    program = accy.trace.define(name, [spec(f32, lane=3)], lambda b, a: a[0] * 5.0)
    return compile_program(program).source


def test_a_corrupt_entry_is_rebuilt_not_trusted(native_cpu):
    source = _fresh_source("corrupted_entry")
    library = toolchain.build(source)
    assert toolchain.is_valid(library)
    library.write_bytes(library.read_bytes()[:100])  # a truncated write
    assert not toolchain.is_valid(library)
    before = toolchain.compile_count()
    assert toolchain.build(source) == library
    assert toolchain.compile_count() == before + 1
    assert toolchain.is_valid(library)


def _bound_digest(library) -> str:
    """The digest an entry must have: sha256 over its key (the file's stem), a zero byte and
    the library's bytes."""
    key = library.name.split(".")[0]
    return hashlib.sha256(key.encode() + b"\0" + library.read_bytes()).hexdigest()


def test_an_entry_that_does_not_load_is_rebuilt_in_a_private_folder(native_cpu):
    program = accy.trace.define("unloadable", [spec(f32, lane=3)], lambda b, a: a[0] * 7.0)
    compiled = compile_program(program)
    compiled.library_path.write_bytes(b"not a shared object")
    compiled.library_path.with_suffix(".sha256").write_text(_bound_digest(compiled.library_path))
    with pytest.warns(accy.errors.CacheWarning, match="cannot load"):
        fragment = accy.compat.executable.load_fragment(None, compiled)
    out = np.zeros(3, np.float32)
    accy.compat.executable.invoke(fragment, [np.ones(3, np.float32)], [out])
    assert out.tolist() == [7.0, 7.0, 7.0]


def test_without_a_compiler_native_fails_clearly_and_the_reference_still_works(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    program = accy.trace.define("no_compiler", [spec(f32, lane=2)], lambda b, a: a[0] + 1.0)
    with pytest.raises(accy.RuntimeUnavailable, match="native CPU backend: no C compiler found"):
        accy.compile(program, device="cpu")
    assert accy.run(program, [1.0, 2.0], device="reference")[0].tolist() == [2.0, 3.0]


def test_the_cache_key_covers_source_and_flags(native_cpu):
    compiler = toolchain.find_compiler()
    key = toolchain.cache_key(compiler, ("-O3",), "int x;")
    assert key != toolchain.cache_key(compiler, ("-O2",), "int x;")
    assert key != toolchain.cache_key(compiler, ("-O3",), "int y;")


def test_a_cache_that_cannot_be_written_falls_back_to_a_temporary_folder(native_cpu, tmp_path):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the cache folder should be")
    source = _fresh_source("unwritable_cache") + "/* fallback */\n"
    refused = pytest.warns(accy.errors.CacheWarning, match="cannot use the compile cache folder")
    with accy.config.override(cache_dir=str(blocked)), refused:
        library = toolchain.build(source)
    assert library.exists() and blocked not in library.parents


@pytest.fixture
def own_cache(tmp_path, configure):
    """A fresh cache root for one test."""
    root = tmp_path / "own-cache"
    configure(cache_dir=str(root))
    return root


def _times(name: str, factor: float):
    return accy.trace.define(name, [spec(f32, lane=3)], lambda b, a: a[0] * factor)


def test_an_entry_copied_from_another_program_is_rebuilt(native_cpu, own_cache):
    a = compile_program(_times("copied_from", 2.0))
    program_b = _times("copied_over", 3.0)
    b = compile_program(program_b)
    shutil.copyfile(a.library_path, b.library_path)
    shutil.copyfile(a.library_path.with_suffix(".sha256"), b.library_path.with_suffix(".sha256"))
    (out,) = accy.compile(program_b)(np.ones(3, np.float32))
    assert out.tolist() == [3.0, 3.0, 3.0]


def test_a_valid_entry_without_the_entry_point_is_rebuilt(native_cpu, own_cache, tmp_path):
    program = _times("without_entry_point", 4.0)
    library = compile_program(program).library_path
    other = tmp_path / "other.c"
    other.write_text("int accy_other(void) { return 0; }\n")
    built = tmp_path / "other.so"
    real = toolchain.find_compiler().path
    subprocess.run([real, "-shared", "-fPIC", str(other), "-o", str(built)], check=True)
    shutil.copyfile(built, library)
    library.with_suffix(".sha256").write_text(_bound_digest(library))
    with pytest.warns(accy.errors.CacheWarning, match="accy_run"):
        (out,) = accy.compile(program)(np.ones(3, np.float32))
    assert out.tolist() == [4.0, 4.0, 4.0]


@pytest.fixture
def wrong_compiler(native_cpu, tmp_path):
    """A compiler that builds a library without accy's entry point, whatever it is given."""
    real = toolchain.find_compiler().path
    wrapper = tmp_path / "wrong-cc"
    wrapper.write_text(
        "#!/bin/sh\n"
        'while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n'
        f"echo 'int accy_other(void) {{ return 0; }}' | "
        f'exec "{real}" -shared -fPIC -x c - -o "$out"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return wrapper


def test_a_built_library_without_the_entry_point_is_a_compile_error(
    wrong_compiler, own_cache, monkeypatch
):
    monkeypatch.setenv("CC", str(wrong_compiler))
    with (
        pytest.warns(accy.errors.CacheWarning, match="accy_run"),
        pytest.raises(accy.CompileError, match="lacks a symbol accy calls"),
    ):
        accy.compile(_times("wrong_compiler", 5.0))


def test_a_cache_folder_that_cannot_load_libraries_falls_back(native_cpu, own_cache, monkeypatch):
    real_cdll = ctypes.CDLL

    def noexec(name, *args, **kwargs):
        if str(name).startswith(str(own_cache)):
            raise OSError(f"{name}: failed to map segment from shared object")
        return real_cdll(name, *args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", noexec)
    with pytest.warns(accy.errors.CacheWarning, match="failed to map segment"):
        (out,) = accy.compile(_times("noexec_cache", 6.0))(np.ones(3, np.float32))
    assert out.tolist() == [6.0, 6.0, 6.0]


def _files(root) -> set[str]:
    """The files and folders under `root`, but for the entries' two-letter folders."""
    return {name for _, dirs, names in os.walk(root) for name in dirs + names if len(name) != 2}


def test_a_compiler_failure_leaves_no_files_in_the_cache(native_cpu, own_cache, tmp_path):
    failing = tmp_path / "failing-cc"
    failing.write_text(
        '#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = "-o" ] && echo half > "$2"; shift; done\n'
        "echo 'error: no' >&2\nexit 1\n"
    )
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    source = _fresh_source("compiler_fails")
    before = _files(own_cache)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CC", str(failing))
        with pytest.raises(accy.CompileError, match="source kept at"):
            toolchain.build(source)
    assert all(name.endswith(".lock") for name in _files(own_cache) - before)


def test_an_interrupted_build_leaves_no_files_in_the_cache(native_cpu, own_cache, monkeypatch):
    def interrupted(command, **kwargs):
        Path(command[command.index("-o") + 1]).write_bytes(b"half a library")
        raise KeyboardInterrupt

    source = _fresh_source("interrupted") + "/* not built yet */\n"
    before = _files(own_cache)
    monkeypatch.setattr(toolchain.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        toolchain.build(source)
    assert all(name.endswith(".lock") for name in _files(own_cache) - before)
