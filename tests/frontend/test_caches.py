"""One owner for every in-memory cache (`accy.caches`): bounds that bound what stays alive, and
`accy.clear_caches()` that empties each registered cache."""

from __future__ import annotations

import gc
import logging

import numpy as np
import pytest

import accy
from accy import caches
from accy.backends import base


def mapped_libraries() -> set[str]:
    """The files of the disk cache that this process has mapped (its loaded native code)."""
    root = accy.config.cache_dir
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if root and root in line}


def live_executables(jitted: list) -> int:
    """How many of the executables these jitted functions compiled are still alive (their
    signatures hold weak references to them)."""
    gc.collect()
    return sum(
        held() is not None
        for f in jitted
        for staged in f._staged.values()
        for entry in staged.cache.values()
        for held in entry.compiled.values()
    )


@pytest.mark.slow
def test_many_eager_shapes_keep_the_mapped_libraries_bounded(configure):
    # Each extent is another program and another shared library: without a bound every one
    # stays mapped (about 3,200 exhaust vm.max_map_count).
    configure(executables_max_entries=2)
    accy.clear_caches()
    before = mapped_libraries()
    for n in range(1, 7):
        x = accy.named(np.arange(n, dtype=np.float32), ("n",))
        assert (x * x).array.tolist() == [k * k for k in range(n)]
        gc.collect()
        assert len(mapped_libraries() - before) <= 2
        entries, bound = caches.statistics()["executables"]
        assert 0 < entries <= bound == 2


@pytest.mark.slow
def test_many_jitted_functions_keep_the_live_executables_bounded(configure, caplog):
    configure(executables_max_entries=4)
    accy.clear_caches()
    functions = []
    for k in range(12):

        def scaled(x, k=k):
            return x * float(k)

        scaled.__name__ = f"bounded_jit_{k}"
        functions.append(accy.jit(scaled))
    x = accy.named(np.ones(3, np.float32), ("n",))
    for k, f in enumerate(functions):
        assert f(x).array.tolist() == [float(k)] * 3
    assert 0 < live_executables(functions) <= 4
    with caplog.at_level(logging.WARNING, "accy.caches"):
        base._noted.clear()
        for k, f in enumerate(functions):  # released ones compile again, and still compute
            assert f(x).array.tolist() == [float(k)] * 3
    assert 0 < live_executables(functions) <= 4
    (record,) = [r for r in caplog.records if r.name == "accy.caches"]
    assert "accy.config.executables_max_entries = 4" in record.getMessage()
    assert "ACCY_EXECUTABLES_MAX_ENTRIES" in record.getMessage()


def test_a_function_past_its_signature_bound_forgets_the_oldest_and_says_so(configure, caplog):
    from accy.frontend import tracing

    configure(jit_signatures_max_entries=2)
    double = accy.jit(lambda a: a * 2.0)
    tracing._noted.clear()
    with caplog.at_level(logging.WARNING, "accy.caches"):
        for n in (1, 2, 3, 1):
            x = accy.named(np.ones(n, np.float32), ("n",), device="reference")
            assert double(x).array.tolist() == [2.0] * n
    assert double.traces == 4  # n=1 was forgotten for n=3, and traced again
    (record,) = [r for r in caplog.records if r.name == "accy.caches"]
    assert "accy.config.jit_signatures_max_entries = 2" in record.getMessage()


def test_clear_caches_empties_every_registered_cache():
    x = accy.named(np.ones(2, np.float32), ("n",))
    doubled = accy.jit(lambda a: a * 2.0)
    assert doubled(x).array.tolist() == [2.0, 2.0]
    assert accy.grad(lambda a: (a * a).sum())(x).array.tolist() == [2.0, 2.0]
    assert (x + x).array.tolist() == [2.0, 2.0]  # eager
    filled = caches.statistics()
    for name in ("executables", "eager operations", "jit signatures", "interned types"):
        assert filled[name][0] > 0, name
    accy.clear_caches()
    assert {name: entries for name, (entries, _) in caches.statistics().items() if entries} == {}
    assert doubled(x).array.tolist() == [2.0, 2.0]  # filled again on use


def test_a_bound_is_the_setting_at_each_insertion(configure):
    lru = caches.Lru(None, "executables_max_entries")
    configure(executables_max_entries=2)
    for key in "abc":
        lru.put(key, key.upper())
    assert len(lru) == 2 and lru.get("a") is None and lru.dropped("a")
    assert lru.get("b") == "B"  # b is now the most recent: c goes next
    configure(executables_max_entries=1)
    lru.put("d", "D")
    assert lru.values() == ["D"] and not lru.dropped("a")  # asked once: forgotten


def test_tables_drop_their_oldest_entries_and_groups_clear_their_tables():
    group = caches.Group("test group of tables", bound=2)
    try:
        one, two = group.table(), group.table()
        for key in range(5):
            one.put(key, key)
        two.put("x", 1)
        assert list(one) == [3, 4] and group.size() == 3
        assert caches.statistics()["test group of tables"] == (3, 2)
        accy.clear_caches()
        assert len(one) == len(two) == 0
    finally:
        caches.unregister("test group of tables")


def test_memoized_functions_are_bounded_and_cleared():
    calls = []

    @caches.memoized("test squares", bound=2)
    def square(x):
        calls.append(x)
        return x * x

    try:
        assert [square(3), square(3), square(4), square(5), square(3)] == [9, 9, 16, 25, 9]
        assert calls == [3, 4, 5, 3]  # 3 was dropped for 5
        accy.clear_caches()
        assert square(4) == 16 and calls[-1] == 4
        assert square.__wrapped__(2) == 4
    finally:
        caches.unregister("test squares")


def test_a_name_is_registered_once():
    caches.register("test unique", lambda: None, lambda: 0)
    try:
        with pytest.raises(accy.AccyError, match="'test unique' is registered already"):
            caches.Table("test unique", None)
    finally:
        caches.unregister("test unique")
