"""`nn.attention` in f32 on CUDA through accy's FlashAttention kernels (`flash_cuda.py`): what
they decline and that their source compiles (here, without a GPU), and on a GPU values and
gradients against the composition in float64 on the same inputs, for several layouts, dims and
extents that are not multiples of the blocks, with and without a causal mask, and a nonzero
cotangent of the logsumexp."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bf16, f32, f64
from accy.attention import flash_cuda
from accy.attention import signature as signature_module
from accy.attention.signature import Signature, backward_type, check, packed_type
from accy.kernel import toolchain

from ..executors import cuda_device_or_skip
from .programs import output_and_lse_loss
from .test_cudnn import EXTENTS, LAYOUTS, _host, _inputs, _library_steps

MIXED = (("head", "token", "batch", "dim"), ("batch", "key", "head", "dim"))


def _types(layouts, dim=64, tokens=96, keys=None):
    q_axes, k_axes = layouts
    extents = {**EXTENTS, "dim": dim, "token": tokens, "key": keys or tokens}
    return [accy.spec(f32, {a: extents[a] for a in axes}) for axes in (q_axes, k_axes, k_axes)]


def _call(part, layouts, causal=True, **extents):
    s = Signature(layouts[0], layouts[1], layouts[1], causal=causal)
    types = _types(layouts, **extents)
    shape = check(s, *types)
    packed = packed_type(s, shape)
    if part == "forward":
        return flash_cuda._kernel(s, part, tuple(types), packed)
    return flash_cuda._kernel(s, part, (*types, packed, packed), backward_type(s, shape))


# -- no GPU --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, dim, bias, why",
    [
        (bf16, 64, False, "bf16 operands"),
        (f64, 64, False, "f64 operands"),
        (f32, 66, False, "a dim extent of 66"),
        (f32, 136, False, "a dim extent of 136"),
        (f32, 128, False, "a dim extent of 128"),
        (f32, 64, True, "a bias"),
    ],
)
def test_the_kernels_decline_what_they_do_not_compute(dtype, dim, bias, why):
    q_axes, k_axes = LAYOUTS["bhsd"]
    s = Signature(q_axes, k_axes, k_axes, ("head", "token", "key") if bias else None)
    extents = {**EXTENTS, "dim": dim}
    types = [accy.spec(dtype, {a: extents[a] for a in axes}) for axes in (q_axes, k_axes, k_axes)]
    assert why in flash_cuda.decline(s, types)


@pytest.mark.skipif(
    toolchain.nvcc() is None, reason="cuda gate: nvcc is not on PATH (nor in $CUDA_HOME/bin)"
)
@pytest.mark.parametrize("dim", [64, 48, 32, 24])
@pytest.mark.parametrize("part", ["forward", "backward"])
@pytest.mark.slow
def test_the_generated_kernels_compile(part, dim):
    call = _call(part, MIXED, dim=dim, tokens=100)
    ptx = toolchain.ptx_with_nvcc(call.library.source, f"flash {part}", arch="compute_90")
    for launch in call.library.launch:
        assert f".entry {launch.kernel}(" in ptx


def test_the_backward_keeps_each_rows_statistics_in_scratch():
    forward, backward = _call("forward", MIXED, tokens=100), _call("backward", MIXED, tokens=100)
    assert forward.library.scratch_bytes == 0
    rows = EXTENTS["batch"] * EXTENTS["head"] * 100
    assert backward.library.scratch_bytes >= 2 * 4 * rows
    assert [launch.kernel for launch in backward.library.launch] == [
        "flash_backward_rows",
        "flash_backward_key",
    ]


def test_implementation_chooses_how_attention_is_recorded(monkeypatch):
    # The thresholds as shipped: 96 x 96 f32 scores are below the f32 bound.
    monkeypatch.setattr(signature_module, "FULL_PRECISION_FUSED_MIN_SCORES", 2048 * 2048)
    specs = _types(LAYOUTS["bhsd"])

    def targets(implementation):
        def body(b, args):
            return accy.nn.attention(*args, causal=True, implementation=implementation)

        program = accy.trace.define("attend", specs, body)
        return [op.attrs.get("target", "") for op in program.operations if op.kind == "custom_call"]

    assert targets(None) == [] and targets("composition") == []
    assert [t.split("[")[0] for t in targets("fused")] == ["accy.nn.attention.forward"]


def test_an_unknown_implementation_is_a_clear_error():
    specs = _types(LAYOUTS["bhsd"])
    with pytest.raises(accy.AccyError, match='implementation must be None, "fused"'):
        accy.trace.define(
            "attend", specs, lambda b, args: accy.nn.attention(*args, implementation="flash")
        )


# -- on a GPU --------------------------------------------------------------------------------------


def _program(layouts, *, causal, dim=64, tokens=96, keys=None, loss=False, dtype=f32):
    specs = [t.with_dtype(dtype) for t in _types(layouts, dim, tokens, keys)]

    def body(b, args):
        out = accy.nn.attention(*args, causal=causal, implementation="fused")
        out = out.transpose("batch", "head", "token", "dim")
        if not loss:
            return out
        weights = np.linspace(-1, 1, out.ty.size).reshape(out.ty.extents)
        w = b.constant(weights, accy.spec(dtype, dict(out.ty.named_extents)))
        return (out * w).sum(("batch", "head", "token", "dim"))

    return accy.trace.define("attend", specs, body), specs


def _close(got, expected, what):
    tolerance = 2e-5 * max(float(np.max(np.abs(expected))), 1e-3)
    error = float(np.max(np.abs(got - expected)))
    assert error <= tolerance, f"{what}: max error {error:.3g} above {tolerance:.3g}"


def _flash_or_skip():
    cuda_device_or_skip()
    pytest.importorskip("cupy", reason="cuda gate: CuPy (NVRTC) is not installed")


CASES = [
    pytest.param(
        layout, causal, dim, tokens, id=f"{name}-{'causal' if causal else 'full'}-d{dim}-t{tokens}"
    )
    for name, layout in (("bhsd", LAYOUTS["bhsd"]), ("bshd", LAYOUTS["bshd"]), ("mixed", MIXED))
    for causal in (False, True)
    for dim, tokens in ((64, 96), (48, 130), (32, 64), (24, 33))
    if name == "bhsd" or dim == 64
]


@pytest.mark.parametrize("layout, causal, dim, tokens", CASES)
def test_flash_forward_matches_the_composition(layout, causal, dim, tokens):
    _flash_or_skip()
    options = dict(causal=causal, dim=dim, tokens=tokens)
    p, specs = _program(layout, **options)
    inputs = _inputs(specs, f32)
    executable = accy.compile(p, device="cuda")
    assert any("flash_attention_forward" in s for s in _library_steps(executable))
    (out,) = executable(*inputs)
    reference = _program(layout, dtype=f64, **options)[0]
    (expected,) = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    _close(_host(out), np.asarray(expected), "output")


@pytest.mark.parametrize("layout, causal, dim, tokens", CASES)
def test_flash_gradients_match_the_composition(layout, causal, dim, tokens):
    _flash_or_skip()
    options = dict(causal=causal, dim=dim, tokens=tokens, loss=True)
    p, specs = _program(layout, **options)
    inputs = _inputs(specs, f32, seed=1)
    executable = accy.compile(accy.value_and_grad(p, wrt=(0, 1, 2)), device="cuda")
    steps = _library_steps(executable)
    assert any("flash_attention_backward" in s for s in steps), steps
    reference = accy.value_and_grad(_program(layout, dtype=f64, **options)[0], wrt=(0, 1, 2))
    expected = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    for name, g, e in zip(["loss", "dq", "dk", "dv"], executable(*inputs), expected, strict=True):
        _close(_host(g), np.asarray(e), name)


def test_flash_unequal_extents_without_causal():
    _flash_or_skip()
    options = dict(causal=False, tokens=70, keys=150, loss=True)
    p, specs = _program(LAYOUTS["bshd"], **options)
    inputs = _inputs(specs, f32, seed=2)
    executable = accy.compile(accy.value_and_grad(p, wrt=(0, 1, 2)), device="cuda")
    assert len(_library_steps(executable)) == 2
    reference = accy.value_and_grad(
        _program(LAYOUTS["bshd"], dtype=f64, **options)[0], wrt=(0, 1, 2)
    )
    expected = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    for g, e in zip(executable(*inputs), expected, strict=True):
        _close(_host(g), np.asarray(e), "value_and_grad")


def test_flash_backward_takes_a_cotangent_of_the_logsumexp():
    _flash_or_skip()
    q_axes, k_axes = LAYOUTS["bhsd"]
    s = Signature(q_axes, k_axes, k_axes, causal=True)

    def make(dtype):
        specs = [t.with_dtype(dtype) for t in _types(LAYOUTS["bhsd"])]
        return output_and_lse_loss(s, specs), specs

    program, specs = make(f32)
    inputs = _inputs(specs, f32, seed=3)
    executable = accy.compile(program, device="cuda")
    assert len(_library_steps(executable)) == 2
    reference, _ = make(f64)
    expected = accy.reference.run(reference, [x.astype(np.float64) for x in inputs])
    for name, g, e in zip(["loss", "dq", "dk", "dv"], executable(*inputs), expected, strict=True):
        _close(_host(g), np.asarray(e), name)
