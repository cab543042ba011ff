"""The bench's empty accy caches keep the per-machine GEMM library (`bench.machine_cache`)."""

from accy.backends.cpu import gemm
from accy.backends.cpu.toolchain import cpu_identity
from accy.codegen import cache
from accy.codegen.compiler import find_compiler
from bench.machine_cache import machine_folder, seed


def gemm_entry(root):
    key = cache.key(
        gemm.VERSION, find_compiler().identity, cpu_identity(), " ".join(gemm.FLAGS), gemm.SOURCE
    )
    return root / "gemm" / key[:2] / f"{key}.so"


def test_an_empty_cache_is_seeded_with_the_gemm_library_and_nothing_else(tmp_path):
    root = tmp_path / "accy-cache"
    seed(root)
    assert root.is_dir() and not (root / "cpu").exists()  # no program is carried over
    if gemm.cpu_has_avx512():
        assert machine_folder() is not None
        assert cache.is_valid(gemm_entry(root))
    else:
        assert machine_folder() is None and not (root / "gemm").exists()


def test_the_library_is_built_into_the_current_cache_after_another_cache_opened_it(tmp_path):
    import accy

    if not gemm.cpu_has_avx512():
        assert gemm.prepare_library() is False
        return
    assert gemm.prepare_library()  # opened in this process, from the session's cache
    other = tmp_path / "other-cache"
    with accy.config.override(cache_dir=str(other)):
        assert gemm.prepare_library()
    assert cache.is_valid(gemm_entry(other))
