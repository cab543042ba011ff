"""The CUDA backend's compiled fragments in the disk cache (`accy.backends.fragments`), without
a GPU: a second compile reads the fragment back without planning or writing CUDA C, in this
process and in another one; whatever the fragment depends on changes its key; a corrupted or
unreadable entry is compiled again; an unusable cache folder still compiles."""

from __future__ import annotations

import functools
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import accy
from accy import bf16, f32, spec
from accy.backends.cuda import compile as cuda_compile
from accy.codegen.cache import entry_digest, is_valid
from accy.errors import CacheWarning

SOURCE_ROOT = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def cache_dir(tmp_path, configure):
    """A fresh, empty disk cache for the test."""
    folder = tmp_path / "cache"
    configure(cache_dir=str(folder))
    return folder


@pytest.fixture
def planned(monkeypatch):
    """How many times the CUDA backend planned a program (compiles that missed the cache)."""
    calls = []
    original = cuda_compile.build_plan

    def counted(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(cuda_compile, "build_plan", counted)
    return calls


def _forbid_planning(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("planned: the fragment was not read from the disk cache")

    monkeypatch.setattr(cuda_compile, "build_plan", refuse)
    monkeypatch.setattr(cuda_compile, "emit_plan", refuse)


def _mlp_step():
    """A small training step: GEMMs, a row reduction, a softmax cross-entropy, their
    gradients, and a large constant (loaded into the workspace, not written as literals)."""
    table = np.linspace(-1.0, 1.0, 4096, dtype=np.float32).reshape(64, 64)

    def loss(b, args):
        x, w, y = args
        shift = b.constant(table, spec(f32, hidden=64, other=64)).sum("other")
        h = (x.contract(w, "feature") + shift).tanh()
        return ((h - y) * (h - y)).sum(("batch", "hidden"))

    types = [
        spec(f32, batch=8, feature=32),
        spec(f32, feature=32, hidden=64),
        spec(f32, batch=8, hidden=64),
    ]
    return accy.value_and_grad(accy.trace.define("mlp", types, loss), wrt=(1,))


def _fake_cudnn(setattr_) -> None:
    """cuDNN as if it supported every attention and conv graph, with fresh memos of built
    kernels (the fake steps must not outlive the test), and the fused attention records on
    small shapes too."""
    import accy.attention.signature
    from accy.attention import cuda as cudnn_attention
    from accy.backends.cuda import cudnn_conv
    from accy.backends.cuda.cudnn import Built

    setattr_(accy.attention.signature, "FUSED_MIN_SCORES", 0)
    setattr_(cudnn_attention, "planned", lambda p: Built(None, {}, 0))
    setattr_(cudnn_conv, "built", lambda p: cudnn_conv.Built(None, {}, 0))
    setattr_(cudnn_attention, "_kernel", functools.cache(cudnn_attention._kernel.__wrapped__))


def _attention_conv_step():
    """The gradient of a loss through cuDNN's fused attention and a conv (both library steps
    with cuDNN faked by `_fake_cudnn`)."""
    axes = {"batch": 2, "head": 2, "token": 16, "key": 16, "dim": 64}
    q_axes = ("batch", "token", "head", "dim")
    k_axes = ("batch", "key", "head", "dim")
    specs = [spec(bf16, {a: axes[a] for a in names}) for names in (q_axes, k_axes, k_axes)]

    def body(b, args):
        out = accy.nn.attention(*args, causal=True).convert(f32)
        image = out.rename("token", "width").sum("head").rename("dim", "channel")
        kernel = b.constant(np.ones((3, 64, 4), np.float32), spec(f32, width=3, channel=64, out=4))
        return image.conv(kernel, ["width"], "channel", "out", padding="same").sum()

    return accy.value_and_grad(accy.trace.define("p", specs, body), wrt=(0,))


def _entries(folder: Path) -> list[Path]:
    return sorted((folder / "cuda-fragment").glob("*/*.pickle"))


def _same(a, b) -> None:
    """Two fragments compiled from one program hold the same code, schedule and data."""
    assert a.source == b.source
    assert a.schedule == b.schedule
    assert a.units == b.units and a.kernels == b.kernels
    assert a.plan.steps == b.plan.steps and a.plan.workspace_bytes == b.plan.workspace_bytes
    assert (a.scratch_offset, a.workspace_bytes) == (b.scratch_offset, b.workspace_bytes)
    assert a.kernel_comments == b.kernel_comments and a.externals == b.externals
    assert len(a.constants) == len(b.constants)
    for (offset, data), (offset_b, data_b) in zip(a.constants, b.constants, strict=True):
        assert offset == offset_b and data.dtype == data_b.dtype
        np.testing.assert_array_equal(data, data_b)


def test_a_second_compile_reads_the_fragment_back_without_planning(cache_dir, monkeypatch):
    program = _mlp_step()
    first = cuda_compile.compile_program(program)
    assert first.constants, "the test wants a large constant in the fragment"
    (entry,) = _entries(cache_dir)
    assert is_valid(entry)
    _forbid_planning(monkeypatch)
    again = cuda_compile.compile_program(program)
    assert again is not first and again.program is program  # the caller's program, not a copy
    _same(again, first)
    # The same program traced again (another object, the same text) finds it too.
    assert cuda_compile.compile_program(_mlp_step()).source == first.source


@pytest.mark.slow
def test_another_process_reads_the_fragment_back_without_planning(cache_dir):
    """Across processes (other string hashes): the keys are the same (cuDNN attention's and
    conv's kernel calls included, faked), and the records read back hash as fresh ones do
    (`Attrs` does not keep its cached hash; dtypes are the module's own objects)."""
    script = textwrap.dedent(
        f"""
        import json, pickle, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.backends.test_cuda_fragment_cache import (
            _attention_conv_step, _fake_cudnn, _mlp_step)
        from accy.backends.base import backend_for, compile_artifact
        from accy.backends.cuda import compile as cuda_compile
        from accy.core.ir import Attrs
        from accy import f32
        planned = []
        original = cuda_compile.build_plan
        cuda_compile.build_plan = lambda *a, **k: planned.append(1) or original(*a, **k)
        fragment = cuda_compile.compile_program(_mlp_step())
        _fake_cudnn(setattr)
        libraries = compile_artifact(backend_for("cuda"), _attention_conv_step(), None)
        attrs = pickle.loads(pickle.dumps(Attrs(axes=("hidden",), name="x")))
        print(json.dumps({{
            "planned": len(planned),
            "source": fragment.source,
            "libraries": sorted(type(c.library).__name__ for c in libraries.externals.values()),
            "hash_ok": hash(attrs) == hash(Attrs(name="x", axes=("hidden",))),
            "dtype_ok": pickle.loads(pickle.dumps(f32)) is f32,
        }}))
        """
    )

    def run(seed: str) -> dict:
        paths = [str(SOURCE_ROOT), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=os.pathsep.join(filter(None, paths)))
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold, warm = run("1"), run("2")
    assert cold["planned"] == 2 and warm["planned"] == 0
    assert "CudnnAttention" in warm["libraries"] and "CudnnConv" in warm["libraries"]
    assert warm["source"] == cold["source"]
    assert warm["hash_ok"] and warm["dtype_ok"]


def test_a_changed_program_argument_or_setting_misses(cache_dir, planned, configure):
    program = _mlp_step()
    cuda_compile.compile_program(program)
    cuda_compile.compile_program(program)
    assert len(planned) == 1
    other = accy.trace.define("mlp", [spec(f32, n=4)], lambda b, a: a[0].exp().sum())
    cuda_compile.compile_program(other)
    assert len(planned) == 2
    cuda_compile.compile_program(program, batch=False)
    cuda_compile.compile_program(program, prefix="other_")
    assert len(planned) == 4
    configure(cuda_unrolled_nodes=7)  # a setting that changes generated code
    cuda_compile.compile_program(program)
    assert len(planned) == 5
    assert len(_entries(cache_dir)) == 5


def test_a_changed_kernel_call_or_cudnn_decision_misses(cache_dir, planned, monkeypatch, configure):
    """The linked kernel calls (cuDNN attention: its problem and settings) and the convs cuDNN
    runs are part of the key; their library steps survive the round trip. (The plan cuDNN
    picks is not: it is built when the fragment loads.)"""
    from accy.attention import cuda as cudnn_attention
    from accy.backends.base import backend_for, compile_artifact

    _fake_cudnn(monkeypatch.setattr)
    gradient = _attention_conv_step()
    first = compile_artifact(backend_for("cuda"), gradient, None)
    kinds = sorted(type(call.library).__name__ for call in first.externals.values())
    assert "CudnnAttention" in kinds and "CudnnConv" in kinds, kinds
    again = compile_artifact(backend_for("cuda"), gradient, None)
    assert len(planned) == 1
    _same(again, first)
    previous = cudnn_attention.configure(cudnn_attention.Settings(deterministic=True))
    try:  # other cuDNN graphs for the same calls: other kernel calls
        compile_artifact(backend_for("cuda"), gradient, None)
    finally:
        cudnn_attention.configure(previous)
    assert len(planned) == 2
    configure(cudnn_conv=False)  # the conv is composed now
    composed = compile_artifact(backend_for("cuda"), gradient, None)
    assert len(planned) == 3
    assert "CudnnConv" not in {type(c.library).__name__ for c in composed.externals.values()}


def test_a_corrupted_entry_is_compiled_again(cache_dir, planned):
    program = _mlp_step()
    first = cuda_compile.compile_program(program)
    (entry,) = _entries(cache_dir)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))  # the digest no longer matches: the Cache rebuilds it
    _same(cuda_compile.compile_program(program), first)
    assert len(planned) == 2 and is_valid(entry)
    cuda_compile.compile_program(program)
    assert len(planned) == 2


def test_an_entry_that_cannot_be_read_back_is_compiled_again_with_a_warning(cache_dir, planned):
    """An entry that passes the trust check but does not unpickle (not written by this accy)."""
    program = _mlp_step()
    first = cuda_compile.compile_program(program)
    (entry,) = _entries(cache_dir)
    garbage = pickle.dumps("not a fragment")[:-3]
    entry.write_bytes(garbage)
    entry.with_suffix(".sha256").write_text(entry_digest(entry.stem, garbage))
    with pytest.warns(CacheWarning, match="cannot read the compiled fragment"):
        again = cuda_compile.compile_program(program)
    _same(again, first)
    assert len(planned) == 2 and not entry.exists()  # discarded; the next compile stores it
    cuda_compile.compile_program(program)
    assert len(planned) == 3 and is_valid(entry)


def test_an_unusable_cache_folder_still_compiles(tmp_path, planned, configure):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    configure(cache_dir=str(blocked / "cache"))
    program = _mlp_step()
    with pytest.warns(CacheWarning, match="private temporary folder"):
        compiled = cuda_compile.compile_program(program)
    _same(compiled, cuda_compile.build_fragment(program))


def test_a_fragment_that_cannot_be_pickled_is_compiled_every_time(cache_dir, planned):
    """A linked kernel call whose library step cannot be pickled (a local class here; a live
    handle in practice): no key, nothing stored, the call itself in the fragment."""
    from dataclasses import dataclass

    from accy.kernel.call import KernelCall, KernelCallRegistry

    @dataclass(frozen=True)
    class Step:
        scratch_bytes: int = 64

        def load(self, ordinal):
            raise AssertionError("not loaded without a GPU")

    record = accy.CustomCall("test.fragment_cache_call", result_type=lambda x: x)
    try:
        t = spec(f32, lane=16)
        program = accy.trace.define("p", [t], lambda b, a: record(a[0]) * 2.0)
        call = KernelCall.of_library(
            record.target, "fake_step", [("dst", t), ("x", t)], "a fake step", Step()
        )
        registry = KernelCallRegistry([call])
        assert cuda_compile.fragment_key(program, registry, "accy_", True) is None
        first = cuda_compile.compile_program(program, registry)
        cuda_compile.compile_program(program, registry)
    finally:
        record.unregister()
    assert len(planned) == 2 and _entries(cache_dir) == []
    assert first.externals["fake_step"] is call


def test_every_setting_that_changes_generated_code_is_in_the_fragment_key(configure):
    program = _mlp_step()
    before = cuda_compile.fragment_key(program, None, "accy_", True)
    configure(cuda_cublas_in_conditionals=not accy.config.cuda_cublas_in_conditionals)
    changed = cuda_compile.fragment_key(program, None, "accy_", True)
    configure(cuda_cublas_in_conditionals=not accy.config.cuda_cublas_in_conditionals)
    assert changed != before == cuda_compile.fragment_key(program, None, "accy_", True)
    assert ("cuda_cublas_in_conditionals", True) in accy.config.code_key()
    assert ("debug_nans", False) not in accy.config.code_key()  # it changes no code


def test_a_fragment_read_back_runs_on_the_gpu_as_compiled(cache_dir, monkeypatch):
    """On a GPU: the fragment read back loads (NVRTC, its large constant uploaded) and gives
    the compiled one's results; its plan serves donation as the compiled one's does."""
    from ..executors import cuda_device_or_skip

    cuda_device_or_skip()
    import cupy

    from accy.backends.cuda.executable import CudaExecutable, DonatingCudaExecutable

    program = _mlp_step()
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(t.extents).astype(np.float32) for t in program.parameter_types]
    expected = [np.asarray(r) for r in accy.reference.run(program, inputs)]
    compiled = CudaExecutable(cuda_compile.compile_program(program))
    _forbid_planning(monkeypatch)
    again = CudaExecutable(cuda_compile.compile_program(program))
    for executable in (compiled, again):
        results = [cupy.asnumpy(r) for r in executable(*[cupy.asarray(x) for x in inputs])]
        for got, want in zip(results, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    donating = DonatingCudaExecutable(again, (1,))
    assert donating.aliases == DonatingCudaExecutable(compiled, (1,)).aliases
