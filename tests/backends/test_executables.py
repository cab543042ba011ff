"""The backend protocol: one registry, one cache keyed by content, executables released when
nothing refers to them, and the raw-buffer call on every device."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import accy
import accy.compat
from accy import f32, spec
from accy.backends import base
from accy.backends.cpu import compile_count


def rss_bytes() -> int:
    """This process's resident memory (/proc/self/statm counts pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def mapped(path) -> bool:
    with open("/proc/self/maps") as maps:
        return str(path) in maps.read()


def scale(name: str = "scale", factor: float = 3.0):
    return accy.trace.define(name, [spec(f32, n=4)], lambda b, a: a[0] * factor)


def test_devices_are_registered_and_unknown_ones_named():
    assert {"reference", "cpu", "cuda"} <= set(accy.backends.DEVICES)
    with pytest.raises(accy.AccyError, match="unknown device 'tpu'; the devices are cpu, cuda"):
        accy.compile(scale(), device="tpu")
    with pytest.raises(accy.AccyError, match="expected a Program"):
        accy.compile("not a program")


def test_programs_equal_by_content_share_one_executable(native_cpu):
    first, again = scale("same"), scale("same")
    assert first is not again and first == again and hash(first) == hash(again)
    assert scale("other") != first
    assert accy.compile(first) is accy.compile(again)
    assert accy.compile(first) is not accy.compile(first, "reference")
    registry = object()  # compared by identity: another registry is another compilation
    assert accy.compile(first, kernel_call_registry=registry) is not accy.compile(first)


def test_the_cache_keeps_the_most_recently_used():
    cache = base.ExecutableCache(size=2)
    options = base.CompileOptions()
    a, b, c = (scale(name) for name in "abc")
    first = cache.get(a, "reference", options)
    cache.get(b, "reference", options)
    assert cache.get(a, "reference", options) is first  # a is now the most recent
    cache.get(c, "reference", options)  # evicts b
    assert len(cache) == 2 and cache.get(a, "reference", options) is first


def test_run_reuses_the_compilation_of_a_retraced_program_and_memory_stays_flat(native_cpu):
    x = np.arange(4, dtype=np.float32)
    for _ in range(20):  # warm up: allocators, the first compilation
        accy.run(scale("retraced"), x)
    compiles, before = compile_count(), rss_bytes()
    for _ in range(200):
        (result,) = accy.run(scale("retraced"), x)
    assert result.tolist() == [0.0, 3.0, 6.0, 9.0]
    assert compile_count() == compiles
    assert rss_bytes() - before < 2 * 2**20


@pytest.mark.slow
def test_memory_stays_flat_over_many_programs_compiled_and_dropped(native_cpu, monkeypatch):
    monkeypatch.setattr(base, "CACHE", base.ExecutableCache(size=8))
    x = np.ones(4, np.float32)

    def compile_and_drop(count: int, start: int) -> None:
        for k in range(start, start + count):
            # Distinct programs (names differ) with one native library: no C compiler runs.
            (result,) = accy.compile(scale(f"dropped_{k}"))(x)
            assert result.tolist() == [3.0] * 4

    compile_and_drop(50, 0)  # warm up past the cache's size
    gc.collect()
    before = rss_bytes()
    compile_and_drop(200, 50)
    gc.collect()
    assert rss_bytes() - before < 4 * 2**20


def test_a_native_library_is_unmapped_once_no_executable_uses_it(native_cpu, monkeypatch):
    monkeypatch.setattr(base, "CACHE", base.ExecutableCache(size=1))
    program = accy.trace.define(
        "unmapped_when_dropped", [spec(f32, n=7)], lambda b, a: (a[0] * 5.0).exp().sum()
    )
    first = accy.compile(program)
    # evicts `first` from the cache:
    second = accy.compat.execute.Cpu(scale("unmapped_other")).fragment
    path = first.compiled.library_path
    call = first.__call__
    assert mapped(path)
    del first
    gc.collect()
    assert mapped(path)  # the bound call still holds the executable, and so the library
    assert call(np.zeros(7, np.float32))[0].item() == 7.0
    del call
    gc.collect()
    assert not mapped(path)
    assert second(np.ones(4, np.float32))[0].tolist() == [3.0] * 4


@pytest.mark.slow
def test_a_program_without_inputs_and_outputs_runs_in_a_fresh_process(native_cpu):
    script = textwrap.dedent(
        """
        import accy
        import accy.compat
        program = accy.Builder("nothing").build([])
        print(accy.compile(program)(), accy.compile(program, "reference")())
        accy.compat.execute.run_cpu(program, [], [])
        accy.compat.execute.Cpu(program).launch([], [])
        print("ran")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "[]", "ran"]


def test_run_buffers_is_the_same_on_every_device(device):
    program = accy.trace.define(
        "buffers", [spec(f32, n=3), spec(accy.bf16, n=2)], lambda b, a: (a[0] * 2.0, a[1] * 3.0)
    )
    executable = accy.compile(program, device)
    doubled, tripled = np.zeros(3, np.float32), bytearray(4)
    bits = (np.array([1.5, -2.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    executable.run_buffers([np.array([1, 2, 3], np.float32).tobytes(), bits], [doubled, tripled])
    assert doubled.tolist() == [2.0, 4.0, 6.0]
    widened = np.frombuffer(tripled, np.uint16).astype(np.uint32) << 16
    assert widened.view(np.float32).tolist() == [4.5, -6.0]
    shared = np.zeros(3, np.float32)
    for output in (shared, shared[:]):  # the same array, or a view of it
        with pytest.raises(accy.InvalidInput, match="output 0 overlaps input 0"):
            executable.run_buffers([shared, bits], [output, bytearray(4)])
    twice = np.zeros(2, np.uint16)
    with pytest.raises(accy.InvalidInput, match="output 1 overlaps input 1"):
        executable.run_buffers([shared, twice], [doubled, twice])
    executable.run_buffers([doubled, bits], [shared, np.zeros(2, np.uint16)])  # owned arrays
    assert shared.tolist() == [4.0, 8.0, 12.0]
    bindings = executable.bind([np.array([1, 1, 1], np.float32), bits])
    bindings.launch()
    out = np.zeros(3, np.float32)
    bindings.read_output(0, out)
    assert out.tolist() == [2.0, 2.0, 2.0]
