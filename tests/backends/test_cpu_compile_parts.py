"""A CPU program compiled as two translation units at once (`accy.config.cpu_compile_in_parts`,
`accy.backends.cpu.toolchain.compiled_in_parts`): the same values, bit for bit, as the program
compiled as one unit, and as NumPy's."""

import re

import numpy as np
import pytest

import accy
from accy.backends.cpu import toolchain
from accy.backends.cpu.compile import compile_program
from accy.backends.cpu.executable import CpuExecutable
from accy.errors import CompileError


def layer_gradient():
    types = [accy.spec(accy.f32, row=512, embed=64), accy.spec(accy.f32, embed=64, ff=256)]

    def loss(builder, args):
        x, w = args
        hidden = x.contract(w, "embed").tanh()
        return (hidden * hidden).sum()

    return accy.value_and_grad(accy.trace.define("layer", types, loss), wrt=(1,))


def part_steps(source: str) -> dict[str, str]:
    """The part (0 or 1) that defines each step, by step name."""
    found = re.finditer(r"ACCY_PART == (\d)\nACCY_STEP void (\w+)", source)
    return {name: part for part, name in (m.groups() for m in found)}


@pytest.fixture
def commands(monkeypatch):
    """The compiler commands the CPU toolchain starts."""
    started = []
    start, run = toolchain._start, toolchain.subprocess.run

    def recording(compiler, command):
        started.append(command)
        return start(compiler, command)

    def recording_run(command, **kwargs):
        started.append(command)
        return run(command, **kwargs)

    monkeypatch.setattr(toolchain, "_start", recording)
    monkeypatch.setattr(toolchain.subprocess, "run", recording_run)
    return started


def run_in_cache(program, folder, parts: str, inputs):
    with accy.config.override(cache_dir=str(folder), cpu_compile_in_parts=parts):
        return CpuExecutable(compile_program(program))(*inputs)


def test_two_units_compute_what_one_does(tmp_path, commands):
    program = layer_gradient()
    steps = part_steps(compile_program(program).source)
    assert set(steps.values()) == {"0", "1"}  # each unit defines some of the steps
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 64), np.float32)
    w = (rng.standard_normal((64, 256)) / 8).astype(np.float32)
    commands.clear()
    in_parts = run_in_cache(program, tmp_path / "parts", "on", [x, w])
    assert [c for c in commands if "-DACCY_PART=0" in c or "-DACCY_PART=1" in c]
    assert len(commands) == 3  # two units, then the link
    commands.clear()
    whole = run_in_cache(program, tmp_path / "whole", "off", [x, w])
    assert len(commands) == 1 and not any("-DACCY_PART" in flag for flag in commands[0])
    for a, b in zip(in_parts, whole, strict=True):
        assert np.array_equal(a, b)
    hidden = np.tanh(x.astype(np.float64) @ w)
    np.testing.assert_allclose(in_parts[0], (hidden * hidden).sum(), rtol=1e-4)
    gradient = x.T.astype(np.float64) @ (2 * hidden * (1 - hidden * hidden))
    np.testing.assert_allclose(in_parts[1], gradient, rtol=1e-3, atol=1e-3)


def test_a_source_with_data_files_or_no_marker_is_one_unit():
    source = f"{toolchain.SPLIT_MARKER}\nint accy_example(void) {{ return 1; }}"
    with accy.config.override(cpu_compile_in_parts="on"):
        assert toolchain.compiled_in_parts(source, {})
        assert not toolchain.compiled_in_parts(source, {"accy_constant_00.bin": b"\0"})
        assert not toolchain.compiled_in_parts("int x;", {})
    with accy.config.override(cpu_compile_in_parts="off"):
        assert not toolchain.compiled_in_parts(source, {})


def test_a_unit_the_compiler_rejects_is_a_clear_error(tmp_path):
    source = f"{toolchain.SPLIT_MARKER}\nthis is not C;"
    rejected = pytest.raises(CompileError, match="rejected generated code.*-DACCY_PART=0")
    with accy.config.override(cache_dir=str(tmp_path), cpu_compile_in_parts="on"), rejected:
        toolchain.build(source)


def test_the_setting_takes_auto_on_or_off():
    invalid = pytest.raises(accy.errors.ConfigurationError, match="is 'sometimes'.*auto, on, off")
    with accy.config.override(cpu_compile_in_parts="sometimes"), invalid:
        toolchain.compiled_in_parts(toolchain.SPLIT_MARKER, {})


@pytest.mark.parametrize(
    ("load", "elsewhere", "split"),
    [
        (0.2, [3, 3, 3, 3], True),  # a quiet minute
        (1.8, [0, 0, 0, 0], True),  # a busy minute, but the other core is idle now
        (1.8, [0, 1, 0, 0], False),  # another thread ran on it in one of the readings
        (1.8, [None] * 4, False),  # /proc cannot say: the load average decides
    ],
)
def test_auto_splits_where_a_core_is_idle_now_or_over_the_last_minute(
    monkeypatch, load, elsewhere, split
):
    readings = iter(elsewhere)
    monkeypatch.setattr(toolchain.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(toolchain.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(toolchain, "running_elsewhere", lambda: next(readings))
    with accy.config.override(cpu_compile_in_parts="auto"):
        assert toolchain.compiled_in_parts(toolchain.SPLIT_MARKER, {}) is split


def test_one_core_is_never_split(monkeypatch):
    monkeypatch.setattr(toolchain.os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(toolchain.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    with accy.config.override(cpu_compile_in_parts="auto"):
        assert not toolchain.compiled_in_parts(toolchain.SPLIT_MARKER, {})


def test_a_function_steps_share_is_defined_in_one_unit_and_called_from_either():
    """conv's micro-kernels (`Translation.shared_function`): each defined in one unit and
    declared in the other, whose steps call it across the link."""
    types = [accy.spec(accy.f32, b=2, h=5, w=4, c=3), accy.spec(accy.f32, h=3, w=3, c=3, o=5)]

    def loss(builder, args):
        y = args[0].conv(args[1], ("h", "w"), "c", "o", padding="same")
        return (y * y).sum()

    program = accy.value_and_grad(accy.trace.define("conv", types, loss), wrt=(0, 1))
    source = compile_program(program).source
    kernels = set(re.findall(r"void (accy_conv_\w+)\(", source))
    assert {name.rsplit("_", 1)[0] for name in kernels} == {"accy_conv_rows", "accy_conv_columns"}
    for name in kernels:
        assert len(re.findall(rf"ACCY_PART == \d\nACCY_STEP .* {name}\(", source)) == 1
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(t.extents).astype(np.float32) for t in types]
    with accy.config.override(cpu_compile_in_parts="on"):
        in_parts = CpuExecutable(compile_program(program))(*inputs)
    for a, b in zip(in_parts, accy.reference.run(program, inputs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
