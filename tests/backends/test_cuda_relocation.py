"""Kernels declared once per distinct text (no GPU needed): the program's own kernels are
relocated (they read every buffer from a table of their own), so steps that compute alike on
other buffers share one kernel, and each launch's table points where the kernel written for
the plan's level would have read."""

from __future__ import annotations

import re
import threading
import time

import pytest

import accy
from accy import bf16, f32, spec
from accy.backends.cuda import compile_program
from accy.backends.cuda.compile import MAX_UNITS, cuda_plan, translation_units
from accy.backends.cuda.kernels import Kernel, LevelPointer, Module
from accy.backends.cuda.schedule import WORKSPACE, Address, Launch, Level, Schedule
from accy.backends.cuda.steps import emit_plan
from accy.kernel import toolchain

from ..executors import needs_nvcc
from .kind_programs import CASES


def _layers(count: int, width: int = 8):
    """`count` residual layers of layer norm (with a gain), tanh and a contraction, each with
    its own gain and weights: the same computation on other buffers, layer after layer."""

    def body(b, args):
        x, *parameters = args
        for gain, w in zip(parameters[::2], parameters[1::2], strict=True):
            mean = x.mean("c")
            centered = x - mean
            h = centered * (centered * centered).mean("c").rsqrt() * gain
            x = x + h.tanh().contract(w, "c").rename("d", "c")
        return (x * x).sum()

    layer = [spec(f32, c=width), spec(f32, c=width, d=width)]
    types = [spec(f32, n=16, c=width)] + layer * count
    return accy.trace.define(f"layers{count}", types, body)


def _schedule(program, relocate: bool):
    """(module, schedule, plan) as `compile_program` makes them, relocated or not."""
    plan = cuda_plan(program)
    module = Module()
    code = emit_plan(module, plan, relocate=relocate)
    schedule = Schedule()
    count = len(program.parameters) + len(program.outputs)
    entries = tuple(Address(k) for k in range(count))
    code(Level(schedule.table(entries), entries, 0), schedule)
    return module, schedule


def _launches(schedule: Schedule) -> list[Launch]:
    return [a for a in schedule.actions if isinstance(a, Launch)]


def _resolved(module: Module, schedule: Schedule, launch: Launch) -> str:
    """The launched kernel's body with every pointer it reads (`io[k]`: entry k of the
    launch's table, `(ws + n)`: byte n of its workspace) written as the address it resolves
    to in this launch, casts and parentheses around it dropped."""
    text = module.kernel_sources[launch.kernel].split("{", 1)[1]

    def address(match: re.Match) -> str:
        entry, offset = match.groups()
        if entry is not None:
            return f"<{schedule.pool[launch.io + int(entry)]}>"
        return f"<{Address(WORKSPACE, launch.ws + int(offset))}>"

    text = re.sub(r"\bio\[(\d+)\]|\(ws \+ (\d+)\)", address, text).replace("(char *)", "")
    # File-scope constant arrays are numbered in the order a module declares them, which
    # differs between the two modules by the constants that kernels declared once share.
    text = re.sub(r"_constant\d+", "_constant", text)
    while True:
        bare = re.sub(r"\((<[^<>]*>)\)", r"\1", text)
        if bare == text:
            return text
        text = bare


def test_layers_that_compute_alike_share_their_kernels():
    # The first and last layers read the input or feed the loss; those between are alike.
    three, eight = (compile_program(_layers(n)) for n in (3, 8))
    launches = [a for a in eight.schedule.actions if isinstance(a, Launch)]
    assert len(launches) > 3 * len(eight.kernels)  # each kernel launched for many layers
    assert len(eight.kernels) == len(three.kernels)

    def unnamed(source: str) -> str:
        return re.sub(r"accy_k\d+|/\* step \d+", "", source)

    assert unnamed(eight.source) == unnamed(three.source)


def test_each_launch_reads_where_the_kernel_written_for_its_level_reads():
    program = _layers(3)
    relocated_module, relocated = _schedule(program, relocate=True)
    level_module, level = _schedule(program, relocate=False)
    assert len(relocated_module.kernel_sources) < len(level_module.kernel_sources)
    pairs = list(zip(_launches(relocated), _launches(level), strict=True))
    assert pairs
    for mine, theirs in pairs:
        assert (mine.grid, mine.block) == (theirs.grid, theirs.block)
        assert _resolved(relocated_module, relocated, mine) == _resolved(
            level_module, level, theirs
        )


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_relocation_keeps_every_test_program_reading_the_same_buffers(case):
    program = case.build()
    relocated_module, relocated = _schedule(program, relocate=True)
    level_module, level = _schedule(program, relocate=False)
    assert [type(a) for a in relocated.actions] == [type(a) for a in level.actions]
    for mine, theirs in zip(_launches(relocated), _launches(level), strict=True):
        assert _resolved(relocated_module, relocated, mine) == _resolved(
            level_module, level, theirs
        )


def test_a_relocated_kernel_lists_each_pointer_once_in_order_of_use():
    module = Module()
    kernel = module.relocated(
        [
            "const float *v3 = (const float *)(char *)io[2];",
            "float *v5 = (float *)(ws + 128);",
            "v5[0] = v3[0] + ((const float *)(char *)io[2])[1];",
        ]
    )
    assert kernel.pointers == (LevelPointer(True, 2), LevelPointer(False, 128))
    assert "io[2]" not in module.kernel_sources[kernel.name].replace("((char *)io[", "")
    assert "(ws +" not in module.kernel_sources[kernel.name]


def test_kernels_that_differ_only_in_their_local_names_are_one_kernel():
    module = Module()
    first = module.kernel(["const float t4 = v10[0];", "v11[0] = t4;"])
    second = module.kernel(["const float t9 = v20[0];", "v21[0] = t9;"])
    other = module.kernel(["const float t9 = v20[1];", "v21[0] = t9;"])
    assert first == second != other
    assert list(module.kernel_sources) == [first, other]


def test_bodies_keep_the_level_table_of_each_iteration():
    def body(b, args):
        step = lambda inner, a: ((a[0] * a[1]).tanh(),)  # noqa: E731
        (final,), _ = b.scan(step, carries=[args[0]], xs=[args[1]], axis="t")
        return final.sum()

    types = [spec(f32, n=4), spec(f32, t=3, n=4)]
    program = accy.trace.define("scanned", types, body)
    compiled = compile_program(program)
    launches = [a for a in compiled.schedule.actions if isinstance(a, Launch)]
    counts = {name: sum(a.kernel == name for a in launches) for name in compiled.kernels}
    (body_kernel,) = [name for name, count in counts.items() if count == 3]  # once a step
    tables = [a.io for a in launches if a.kernel == body_kernel]
    assert len(set(tables)) == 3
    assert "((char *)io[" not in compiled.source.split(f"{body_kernel}(")[1].split("}")[0]


def test_units_cut_the_kernels_in_order_each_with_the_declarations():
    module = Module()
    names = [module.kernel([f"ws[{k}] = {k}; /* {'x' * 6000} */"]) for k in range(40)]
    module.declare("static const float accy_constant0[2] = {1.0f, 2.0f};")
    units = translation_units(module)
    assert 1 < len(units) <= MAX_UNITS
    assert [name for unit in units for name in unit.kernels] == names
    assert all("accy_constant0" in unit.source for unit in units)
    assert all(unit.source.count("__global__") == len(unit.kernels) for unit in units)


@needs_nvcc
def test_the_units_of_a_bf16_model_compile_with_nvcc():
    def body(b, args):
        x, *weights = args
        for w in weights:
            x = (x + x.contract(w, "c").rename("d", "c").tanh()).convert(bf16).convert(f32)
        return x.sum()

    types = [spec(f32, n=64, c=64)] + [spec(f32, c=64, d=64)] * 4
    compiled = compile_program(accy.trace.define("units", types, body))
    for unit in compiled.units:
        toolchain.ptx_with_nvcc(unit.source, "a unit", arch="compute_90")


def test_kernel_records_are_plain_values():
    assert Kernel("k", (LevelPointer(True, 1),)) == Kernel("k", (LevelPointer(True, 1),))


class _FakeCupy:
    """What `runtime.load_kernels` uses of CuPy and NVRTC: a device context and a module
    loader (`binaries.module`) that records what it compiled, where, and which kernels were
    taken from its modules."""

    def __init__(self):
        self.compiles = True  # whether module() goes to NVRTC (False: a cache hit)
        self.compiled: list[tuple[str, str]] = []  # (thread name, source)

        class Device:
            def __init__(self, ordinal):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        self.cuda = type("cuda", (), {"Device": Device})

    def compile(self, source: str) -> None:
        self.compiled.append((threading.current_thread().name, source))

    def module(self, source: str, options, ordinal: int, compiling=None):
        if compiling is not None and self.compiles:
            compiling()
        self.compile(source)
        fake_module = type("Module", (), {})()
        fake_module.get_function = lambda name: self._kernel(source, name)
        return fake_module

    @staticmethod
    def _kernel(source: str, name: str):
        assert f" {name}(" in source, f"{name} is not in this unit"
        return (source, name)

    def install(self, monkeypatch) -> None:
        from accy.backends.cuda import runtime

        monkeypatch.setattr(runtime, "cupy_module", lambda: self)
        monkeypatch.setattr(runtime.binaries, "module", self.module)


def test_units_are_compiled_in_parallel_and_each_kernel_taken_from_its_own(monkeypatch, tmp_path):
    from accy.backends.cuda import runtime

    fake = _FakeCupy()
    fake.install(monkeypatch)
    monkeypatch.setattr("accy.backends.cuda.compile.UNIT_BYTES", 512)
    # A cache of its own: another test may have compiled the same program in larger units.
    with accy.config.override(cache_dir=str(tmp_path)):
        accy.clear_caches()
        compiled = compile_program(_layers(3))
    assert len(compiled.units) > 1
    kernels = runtime.load_kernels(compiled, 0)
    assert set(kernels) == set(compiled.kernels)
    assert sorted(code for _, code in fake.compiled) == sorted(u.source for u in compiled.units)
    assert all(thread.startswith("accy-nvrtc") for thread, _ in fake.compiled)
    for unit in compiled.units:
        for name in unit.kernels:
            assert kernels[name] == (unit.source, name)


def test_units_compile_while_the_caller_loads_the_rest(monkeypatch, tmp_path):
    from accy.backends.cuda import runtime

    fake = _FakeCupy()
    started, released = threading.Event(), threading.Event()
    compile_unit = fake.compile

    def compile_once_released(source):
        started.set()
        assert released.wait(30), "the caller never got on with the rest of the fragment"
        compile_unit(source)

    fake.compile = compile_once_released
    fake.install(monkeypatch)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 4)  # threads on any host
    monkeypatch.setattr("accy.backends.cuda.compile.UNIT_BYTES", 512)
    with accy.config.override(cache_dir=str(tmp_path)):
        accy.clear_caches()
        compiled = compile_program(_layers(3))
    loading = runtime.KernelsLoading(compiled, 0)
    # The units compile in threads already, before anyone waits for them.
    assert started.wait(30)
    released.set()
    kernels = loading.wait()
    assert set(kernels) == set(compiled.kernels)
    assert sorted(code for _, code in fake.compiled) == sorted(u.source for u in compiled.units)


@pytest.mark.parametrize("in_the_cache", [False, True])
def test_the_caller_waits_until_every_unit_is_in_nvrtc_or_done(monkeypatch, tmp_path, in_the_cache):
    """`wait_started` returns once each thread has a unit in NVRTC (a cache miss) or has
    finished one (a hit), so that a library build holding the GIL next does not keep them out."""
    from accy.backends.cuda import runtime

    fake = _FakeCupy()
    fake.compiles = not in_the_cache
    released = threading.Event()
    compile_unit = fake.compile

    def compile_once_released(source):
        if not in_the_cache:  # NVRTC at work: it finishes only once the caller is past the wait
            assert released.wait(30)
        compile_unit(source)

    fake.compile = compile_once_released
    fake.install(monkeypatch)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 4)
    monkeypatch.setattr("accy.backends.cuda.compile.UNIT_BYTES", 512)
    with accy.config.override(cache_dir=str(tmp_path)):
        accy.clear_caches()
        compiled = compile_program(_layers(3))
    loading = runtime.KernelsLoading(compiled, 0)
    start = time.monotonic()
    loading.wait_started(timeout=20)
    assert time.monotonic() - start < 10  # not the timeout
    assert len(compiled.units) > 4
    # Hits: a unit done per thread at least. Misses: none done, each thread waits in "NVRTC".
    assert len(fake.compiled) >= 4 if in_the_cache else fake.compiled == []
    released.set()
    assert set(loading.wait()) == set(compiled.kernels)


def test_a_program_without_kernels_compiles_nothing(monkeypatch):
    from accy.backends.cuda import runtime

    fake = _FakeCupy()
    fake.install(monkeypatch)
    compiled = compile_program(
        accy.trace.define("empty", [spec(f32, n=0)], lambda b, a: a[0] * 2.0)
    )
    assert compiled.kernels == () and runtime.load_kernels(compiled, 0) == {}
    assert fake.compiled == []
