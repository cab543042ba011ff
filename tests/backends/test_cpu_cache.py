"""The compile cache: reuse across processes, atomic writes, rebuilding what is corrupt, and a
clear error where no C compiler exists."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import accy
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


def test_a_second_process_reuses_the_disk_cache(logging_compiler, tmp_path):
    compiler, log = logging_compiler
    cache = str(tmp_path / "cache")
    first = _run_script(cache, compiler)
    second = _run_script(cache, compiler)
    assert first == ["1", "15.0"]
    assert second == ["0", "15.0"]  # no compile in the second process...
    assert log.read_text().splitlines() == ["run"]  # ...and the compiler never started


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
        fragment = accy.executable.load_fragment(None, compiled)
    out = np.zeros(3, np.float32)
    accy.executable.invoke(fragment, [np.ones(3, np.float32)], [out])
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
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ACCY_CACHE_DIR", str(blocked))
        with pytest.warns(accy.errors.CacheWarning, match="cannot use the compile cache folder"):
            library = toolchain.build(source)
    assert library.exists() and blocked not in library.parents
