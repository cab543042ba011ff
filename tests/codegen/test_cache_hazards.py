"""The disk cache where other processes and a full disk interfere: an entry evicted between its
check and its opening is built again (the cache stays in use), a compiler that runs out of space
falls back to a private folder as a failed write does, and an entry replaced by something that
is not a regular file of bounded size (a link to /dev/zero, a FIFO, a huge file) is rebuilt
without being read."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest

import accy
from accy.codegen import cache
from accy.errors import CacheWarning


@pytest.fixture
def root(tmp_path) -> Path:
    """A fresh cache root, as accy.config.cache_dir."""
    folder = tmp_path / "cache"
    with accy.config.override(cache_dir=str(folder)):
        yield folder


def writes(data: bytes, log: list):
    def compile(output: Path) -> None:
        log.append(output)
        output.write_bytes(data)

    return compile


def opens(path: Path) -> bytes:
    """A stand-in loader: fails as dlopen does on a file that is not there."""
    if not path.exists():
        raise OSError(f"{path}: cannot open shared object file: No such file or directory")
    return path.read_bytes()


def test_an_entry_evicted_before_it_is_opened_is_built_again_in_the_cache(root):
    store, log, evicted = cache.Cache("t"), [], []

    def evicted_first(path: Path) -> bytes:
        if not evicted:  # another process evicts the entry between the check and the opening
            evicted.append(path)
            cache.discard(path)
        return opens(path)

    store.build(cache.key("a"), writes(b"A", log))
    assert store.load(cache.key("a"), writes(b"A", log), evicted_first) == b"A"
    assert len(log) == 2 and root in log[1].parents  # rebuilt once, in the cache (no warning)
    assert cache.is_valid(evicted[0])
    later = []
    assert store.load(cache.key("b"), writes(b"B", later), opens) == b"B"
    assert root in later[0].parents  # the cache is still in use


def test_an_entry_evicted_every_time_ends_in_the_private_folder(root):
    store, log = cache.Cache("t"), []

    def always_evicted(path: Path) -> bytes:
        if root in path.parents:
            cache.discard(path)
        return opens(path)

    with pytest.warns(CacheWarning, match="No such file"):
        assert store.load(cache.key("a"), writes(b"A", log), always_evicted) == b"A"
    assert len(log) == cache.EVICTED_RETRIES + 2 and root not in log[-1].parents


def out_of_space_under(root: Path, monkeypatch) -> list[str]:
    """Make every compiler run whose output is under `root` fail as ld does on a full disk."""
    run, failed = subprocess.run, []

    def full_disk(command, *args, **kwargs):
        if any(str(root) in str(part) for part in command):
            failed.append(command[0])
            stderr = "/usr/bin/ld: final link failed: No space left on device\n"
            return subprocess.CompletedProcess(command, 1, "", stderr)
        return run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", full_disk)
    return failed


def test_a_compiler_out_of_space_falls_back_to_a_private_folder(root, monkeypatch):
    from accy.backends.cpu import toolchain

    try:
        toolchain.find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("native CPU backend: no C compiler")
    failed = out_of_space_under(root, monkeypatch)
    source = "int accy_space_probe(void) { return 7; }"
    with pytest.warns(CacheWarning, match="No space left on device"):
        library = toolchain.build(source)
    assert failed and root not in library.parents
    assert ctypes.CDLL(str(library)).accy_space_probe() == 7


def test_a_kernel_compiler_out_of_space_falls_back_to_a_private_folder(root, monkeypatch):
    from accy.codegen.compiler import find_compiler
    from accy.kernel import toolchain

    try:
        find_compiler()
    except accy.RuntimeUnavailable:
        pytest.skip("no C compiler")
    failed = out_of_space_under(root, monkeypatch)
    with pytest.warns(CacheWarning, match="No space left on device"):
        library = toolchain.build_shared_library(
            "int accy_space_probe(void);\nint accy_space_probe(void) { return 8; }", "probe"
        )
    assert failed and root not in library.parents
    assert ctypes.CDLL(str(library)).accy_space_probe() == 8


def replace_with(target: Path, replacement: str) -> None:
    target.unlink()
    if replacement == "link to /dev/zero":
        target.symlink_to("/dev/zero")
    elif replacement == "fifo":
        os.mkfifo(target)
    else:  # a sparse file larger than any entry may be
        with open(target, "wb") as file:
            file.truncate(cache.MAX_ENTRY_BYTES + 1)


@pytest.mark.parametrize("which", ["library", "digest"])
@pytest.mark.parametrize("replacement", ["link to /dev/zero", "fifo", "huge file"])
def test_an_entry_that_is_not_a_bounded_regular_file_is_rebuilt_unread(root, which, replacement):
    store, log = cache.Cache("t"), []
    library = store.build(cache.key("a"), writes(b"A", log))
    replace_with(library if which == "library" else library.with_suffix(".sha256"), replacement)
    assert not cache.is_valid(library)
    again = store.build(cache.key("a"), writes(b"A", log))
    assert again == library and len(log) == 2
    assert again.read_bytes() == b"A" and cache.is_valid(again) and not again.is_symlink()
