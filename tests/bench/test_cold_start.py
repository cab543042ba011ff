"""tools/cold_start.py and bench.cold_phases without a GPU: the GPT-2 step's phases up to its
CUDA C, at the check scale."""

from __future__ import annotations

import gc
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from bench.cold_phases import ORDER, Phases

TOOL = Path(__file__).resolve().parents[2] / "tools" / "cold_start.py"


def _tool():
    spec = importlib.util.spec_from_file_location("cold_start", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_phase_inside_another_is_not_counted_twice():
    phases = Phases()
    with phases.measuring("outer"):
        time.sleep(0.02)
        with phases.measuring("inner"):
            time.sleep(0.05)
    assert 0.05 <= phases.seconds["inner"] < 0.09
    assert 0.02 <= phases.seconds["outer"] < 0.045


@pytest.mark.slow
def test_the_tool_breaks_the_step_into_phases_and_sizes_its_cuda_c(
    tmp_path, monkeypatch, configure
):
    # The tool wraps accy's functions for the rest of the process: undo that afterwards.
    _restore_instrumented(monkeypatch)
    # A cold start: nothing in the disk cache (a compiled fragment found there skips planning).
    configure(cache_dir=str(tmp_path / "cache"))
    out = tmp_path / "cold.json"
    assert _tool().main(["--scale", "check", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    phases = result["phases_s"]
    expected = ["trace", "differentiate", "simplify", "digest", "fragment key", "plan"]
    assert [p for p in ORDER if p in phases][: len(expected)] == expected
    assert sum(phases.values()) == pytest.approx(result["total_s"], abs=1e-3)
    assert result["kernels"] >= 1 and result["units"] >= 1
    assert result["source_bytes"] > result["largest_unit_bytes"] // 2


@pytest.fixture(autouse=True)
def _uninstrumented():
    """Take `bench.cold_phases`' import wrapper and collection callback out after each test."""
    from bench.cold_phases import uninstrument

    yield
    uninstrument()


def _restore_instrumented(monkeypatch) -> None:
    """Undo `bench.cold_phases.instrument`'s wrapping when the test ends."""
    import builtins

    import accy.gradient
    from accy.backends import fragments
    from accy.backends.cpu import compile as cpu_compile
    from accy.backends.cpu import toolchain
    from accy.backends.cuda import compile as cuda_compile
    from accy.backends.cuda import cudnn, executable
    from accy.core.ir import Program
    from accy.frontend import functions

    for owner, name in [
        (functions, "trace"),
        (functions, "simplify"),
        (accy.gradient, "value_and_grad"),
        (cuda_compile, "fragment_key"),
        (fragments, "loads"),
        (cuda_compile, "build_plan"),
        (cuda_compile, "emit_plan"),
        (cuda_compile, "translation_units"),
        (executable, "compile_program"),
        (cpu_compile, "build_plan"),
        (cpu_compile, "translation"),
        (toolchain, "_run_compiler"),
        (cpu_compile.CompiledFragment, "load"),
        (cudnn.Graphs, "built"),
        (builtins, "__import__"),
    ]:
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(Program.digest, "func", Program.digest.func)


def test_a_cpu_first_call_is_split_into_plan_c_source_gcc_and_load(
    tmp_path, monkeypatch, configure
):
    import numpy as np

    import accy
    from bench.cold_phases import instrument, summary

    _restore_instrumented(monkeypatch)
    configure(cache_dir=str(tmp_path / "cache"))
    phases = Phases()
    instrument(phases, gpu=False)
    step = accy.jit(lambda x: accy.grad(lambda y: (y * y).tanh().sum())(x))
    x = accy.named(np.linspace(-1, 1, 96, dtype=np.float32).reshape(8, 12), ("row", "col"))
    with phases.measuring("first call (other)"):
        gradient = step(x).array
    y = x.array.astype(np.float64) ** 2
    np.testing.assert_allclose(gradient, 2 * x.array * (1 - np.tanh(y) ** 2), rtol=1e-5)
    seconds = summary(phases)
    for phase in ("trace", "plan", "C source", "gcc", "load"):
        assert seconds[phase] > 0, phase
    assert phases.calls["gcc"] == 1  # one program compiled, whether in one unit or two
    assert list(seconds) == [p for p in ORDER if p in seconds]


def test_imports_and_collections_inside_a_phase_are_charged_to_phases_of_their_own(monkeypatch):
    from bench.cold_phases import count_collections, count_imports, uninstrument

    _restore_instrumented(monkeypatch)
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    phases = Phases()
    count_imports(phases)
    count_collections(phases)
    try:
        import colorsys  # noqa: F401  (outside any phase: not counted)

        monkeypatch.delitem(sys.modules, "colorsys")
        with phases.measuring("outer"):
            import colorsys  # noqa: F401, F811  (a new module: counted)
            import json  # noqa: F401, F811  (loaded already: the outer phase's)

            garbage = []
            garbage.append(garbage)
            del garbage
            gc.collect()
            gc.collect(0)
    finally:
        uninstrument()
    assert phases.calls["imports"] == 1 and phases.seconds["imports"] > 0
    assert phases.calls["full garbage collection"] == 1
    assert phases.calls["garbage collection"] == 1
    import colorsys  # noqa: F401, F811  (uninstrumented: nothing more is counted)

    gc.collect()
    assert phases.calls["imports"] == 1 and phases.calls["full garbage collection"] == 1
    assert builtins_import_is_the_original()


def builtins_import_is_the_original() -> bool:
    import builtins

    return not hasattr(builtins.__import__, "original")


def test_a_charged_phase_is_taken_out_of_the_phase_it_happened_in():
    phases = Phases()
    with phases.measuring("outer"):
        time.sleep(0.05)
        phases.charge("inside", 0.04)
    assert phases.seconds["inside"] == 0.04
    assert 0.005 <= phases.seconds["outer"] < 0.04
