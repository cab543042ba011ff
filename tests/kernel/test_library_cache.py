"""The kernel DSL's shared libraries live in the disk cache (namespace "kernel"), bound to their
keys like the CPU backend's."""

from __future__ import annotations

import shutil

from accy.codegen import cache
from accy.kernel import toolchain


def _returning(value: int, name: str) -> str:
    return f"int {name}(void) {{ return {value}; }}\n"


def test_kernel_libraries_are_cached_under_the_cache_root(tmp_path, configure):
    configure(cache_dir=str(tmp_path / "cache"))
    source = _returning(41, "accy_test_cached")
    library = toolchain.build_shared_library(source, "a cached kernel")
    assert tmp_path / "cache" / "kernel" in library.parents and cache.is_valid(library)
    assert toolchain.build_shared_library(source, "a cached kernel") == library
    loaded = toolchain.load_shared_library(source, "a cached kernel", ["accy_test_cached"])
    assert loaded.accy_test_cached() == 41


def test_a_kernel_entry_copied_from_another_source_is_rebuilt(tmp_path, configure):
    configure(cache_dir=str(tmp_path / "cache"))
    one = _returning(1, "accy_test_copied")
    two = _returning(2, "accy_test_copied")
    first = toolchain.build_shared_library(one, "kernel one")
    second = toolchain.build_shared_library(two, "kernel two")
    shutil.copyfile(first, second)
    shutil.copyfile(first.with_suffix(".sha256"), second.with_suffix(".sha256"))
    loaded = toolchain.load_shared_library(two, "kernel two", ["accy_test_copied"])
    assert loaded.accy_test_copied() == 2
