"""NVRTC's binaries in accy's disk cache (`accy.backends.cuda.binaries`), checked without a GPU:
CuPy's module loader and NVRTC are stand-ins that record what they were asked. The CUDA tests
load every generated kernel through the real ones."""

from __future__ import annotations

import sys
import types

import pytest

import accy
from accy.backends.cuda import binaries

SOURCE = 'extern "C" __global__ void nop() {}'


class FakeNvrtc(types.ModuleType):
    """`cupy_backends.cuda.libs.nvrtc` as `binaries.compile` uses it: each compile is recorded;
    a source that contains "error" fails with a log."""

    class NVRTCError(Exception):
        pass

    def __init__(self):
        super().__init__("nvrtc")
        self.compiled: list[tuple[str, tuple[str, ...]]] = []

    def createProgram(self, source, name, headers, names):  # noqa: N802 (NVRTC's names)
        return {"source": source}

    def compileProgram(self, program, options):  # noqa: N802
        self.compiled.append((program["source"], tuple(options)))
        if "error" in program["source"]:
            raise self.NVRTCError("NVRTC_ERROR_COMPILATION (6)")
        program["binary"] = ("cubin of " + program["source"]).encode()

    def getProgramLog(self, program):  # noqa: N802
        return "accy.cu(1): error: identifier 'error' is undefined"

    def getCUBIN(self, program):  # noqa: N802
        return program["binary"]

    def destroyProgram(self, program):  # noqa: N802
        pass


class FakeModule:
    """`cupy.cuda.function.Module`: what it was given to load."""

    def load(self, data: bytes) -> None:
        self.data = data


@pytest.fixture
def nvrtc(monkeypatch, tmp_path):
    fake = FakeNvrtc()
    libs = types.ModuleType("libs")
    libs.nvrtc = fake
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(function=types.SimpleNamespace()))
    cupy.cuda.function.Module = FakeModule
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs", libs)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.nvrtc", fake)
    monkeypatch.setattr(binaries, "target", lambda ordinal: ("sm_90", "cubin", "nvrtc 12.8"))
    with accy.config.override(cache_dir=str(tmp_path)):
        yield fake


def test_a_binary_is_compiled_once_then_read_from_the_disk_cache(nvrtc):
    first = binaries.module(SOURCE, ("--fmad=false",))
    again = binaries.module(SOURCE, ("--fmad=false",))
    assert first.data == again.data == b"cubin of " + SOURCE.encode()
    assert nvrtc.compiled == [(SOURCE, ("--fmad=false", "-ftz=true", "-arch=sm_90"))]


def test_other_options_or_another_architecture_compile_again(nvrtc, monkeypatch):
    binaries.module(SOURCE, ("--fmad=false",))
    binaries.module(SOURCE, ("-std=c++17",))
    monkeypatch.setattr(binaries, "target", lambda ordinal: ("sm_100", "cubin", "nvrtc 12.8"))
    binaries.module(SOURCE, ("--fmad=false",))
    assert [options for _, options in nvrtc.compiled] == [
        ("--fmad=false", "-ftz=true", "-arch=sm_90"),
        ("-std=c++17", "-ftz=true", "-arch=sm_90"),
        ("--fmad=false", "-ftz=true", "-arch=sm_100"),
    ]


def test_a_source_that_does_not_compile_is_a_compile_error_with_nvrtcs_log(nvrtc, tmp_path):
    with pytest.raises(accy.CompileError, match="identifier 'error' is undefined"):
        binaries.module("error", ())
    # Nothing half-written is left as an entry: the next try compiles (and fails) again.
    with pytest.raises(accy.CompileError):
        binaries.module("error", ())
    assert len(nvrtc.compiled) == 2
    assert not list((tmp_path / "cuda-binary").rglob("*.bin"))
