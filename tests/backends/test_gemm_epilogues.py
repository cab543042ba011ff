"""GEMM epilogues: which bias additions the GPU plan moves into the GEMM
(`accy.lower.gemm_epilogues`), the schedule the CUDA backend makes of them (cuBLASLt's bias
epilogue, or the plain GEMM and an addition in place where cuBLASLt refuses), and, on a GPU,
their values and gradients against NumPy."""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

import accy
from accy import bf16, f32, spec
from accy.backends.cuda import compile_program, epilogues
from accy.backends.cuda.schedule import Gemm, Launch
from accy.kernel import toolchain
from accy.lower import build_plan
from accy.lower.gemm_epilogues import bias_epilogue
from accy.lower.target import CPU, GPU

from ..executors import cuda_device_or_skip, needs_nvcc, run_fragment


def _dense(t=64, k=32, n=48, bias_dtype=f32, dtype=bf16, extra=None):
    """`x.contract(w) + bias` (the bias converted to the GEMM's dtype where it is not)."""

    def body(b, a):
        x, w, bias = a
        vector = bias if bias_dtype == dtype else b.convert(bias, dtype)
        product = x.contract(w, "k")
        y = product + vector
        return y if extra is None else extra(b, product, y)

    types = [spec(dtype, t=t, k=k), spec(dtype, k=k, n=n), spec(bias_dtype, n=n)]
    return accy.trace.define("dense", types, body)


def _fused_steps(program, target=GPU):
    plan = build_plan(program, target)
    return plan, [s for s in plan.steps if bias_epilogue(s, plan.producers) is not None]


# -- which steps fuse ------------------------------------------------------------------------


def test_a_dense_layers_bias_is_added_by_its_gemm_on_the_gpu_plan():
    plan, fused = _fused_steps(_dense())
    assert [s.kind for s in plan.steps] == ["dot"]
    (step,) = fused
    bias = bias_epilogue(step, plan.producers)
    program = plan.program
    assert bias.stored == program.parameters[2]  # the f32 master, converted in the step
    assert step.writes == tuple(program.outputs)
    assert [s.name for s in step.scratch] == ["bias"]
    assert {o.kind for o in step.fused} == {"convert", "broadcast_in_dim"}


def test_a_bias_already_in_the_gemms_dtype_fuses_without_a_conversion():
    plan, (step,) = _fused_steps(_dense(bias_dtype=bf16))
    bias = bias_epilogue(step, plan.producers)
    assert bias.vector == bias.stored == plan.program.parameters[2]


def test_the_cpu_plan_and_a_target_without_epilogues_keep_the_loop():
    for target in (CPU, replace(GPU, fuses_gemm_epilogues=False)):
        plan, fused = _fused_steps(_dense(), target)
        assert fused == []
        assert [s.kind for s in plan.steps] == ["dot", "loop"]


def test_a_bias_along_the_rows_is_not_a_gemm_epilogue():
    # One value per row of the product (the left operand's free axis): cuBLASLt's vector is
    # one value per column.
    def body(b, a):
        x, w, bias = a
        return x.contract(w, "k") + b.convert(bias, bf16)

    types = [spec(bf16, t=64, k=32), spec(bf16, k=32, n=48), spec(f32, t=64)]
    _, fused = _fused_steps(accy.trace.define("rows", types, body))
    assert fused == []


def test_a_product_read_by_another_step_is_not_fused():
    _, fused = _fused_steps(_dense(extra=lambda b, product, y: (y, product.sum("t"))))
    assert fused == []


def test_a_product_returned_as_well_is_not_fused():
    _, fused = _fused_steps(_dense(extra=lambda b, product, y: (y, product)))
    assert fused == []


@pytest.mark.parametrize("gelu", ["tanh", "erf"])
def test_gelu_after_the_bias_is_not_fused(gelu):
    activation = accy.nn.gelu_tanh if gelu == "tanh" else accy.nn.gelu
    _, fused = _fused_steps(_dense(extra=lambda b, product, y: activation(y)))
    assert fused == []


def test_an_f32_gemm_and_a_scaled_sum_are_not_fused():
    _, fused = _fused_steps(_dense(dtype=f32))
    assert fused == []
    _, fused = _fused_steps(_dense(extra=lambda b, product, y: product * 2.0 + (y - product)))
    assert fused == []


@pytest.mark.slow
def test_the_gpt2_steps_qkv_biases_are_their_gemms_epilogues():
    # The MLP's fc bias is not (GELU follows, and the backward reads the product again), nor the
    # attention projection's (its loop adds the residual as well).
    from tools.gpt2_chains import step_program

    plan, fused = _fused_steps(step_program("bf16", True))
    assert len(fused) == 12
    assert {s.op.type.axes[-3:] for s in fused} == {("part", "head", "dim")}


# -- the CUDA schedule ------------------------------------------------------------------------


def _gemms(compiled):
    return [a for a in compiled.schedule.actions if isinstance(a, Gemm)]


def test_the_cuda_schedule_adds_the_bias_in_cublaslt(monkeypatch):
    monkeypatch.setattr(epilogues, "refusal_here", lambda g: None)
    compiled = compile_program(_dense(t=80), prefix="fused_")
    (gemm,) = _gemms(compiled)
    assert gemm.epilogue == "bias" and gemm.bias is not None
    assert (gemm.m, gemm.n, gemm.k) == (48, 80, 32)
    comments = " ".join(compiled.kernel_comments.values())
    assert "bias for the GEMM" in comments and "added after" not in comments


def test_where_cublaslt_refuses_the_bias_is_added_after_the_plain_gemm(monkeypatch):
    monkeypatch.setattr(epilogues, "refusal_here", lambda g: "refused")
    compiled = compile_program(_dense(t=96), prefix="apart_")
    (gemm,) = _gemms(compiled)
    assert gemm.epilogue == "" and gemm.bias is None
    actions = compiled.schedule.actions
    assert isinstance(actions[-1], Launch) and actions.index(gemm) < len(actions) - 1
    assert "bias added after the GEMM" in " ".join(compiled.kernel_comments.values())


@needs_nvcc
def test_the_cuda_c_of_both_forms_compiles(monkeypatch):
    sources = []
    for answer, prefix in ((None, "fused_"), ("refused", "apart_")):
        monkeypatch.setattr(epilogues, "refusal_here", lambda g, answer=answer: answer)
        sources.append(compile_program(_dense(t=112), prefix=prefix).source)
    ptx = toolchain.ptx_with_nvcc("".join(sources), "bias epilogues", arch="compute_90")
    assert ".entry" in ptx


def test_an_epilogue_gemm_of_a_batch_or_another_dtype_is_not_taken():
    at = epilogues.Gemm("bf16", 0, 0, 8, 8, 8, None, 8, None, 8, None, 8, epilogue="bias")
    assert epilogues.takes(at)
    assert not epilogues.takes(replace(at, batch=2))
    assert not epilogues.takes(replace(at, dtype="f32"))
    assert not epilogues.takes(replace(at, out="f32"))
    with pytest.raises(accy.AccyError, match="bias GEMMs of bf16 or f16"):
        epilogues.Issuer(replace(at, epilogue="relu"), (None, None))


# -- on a GPU -------------------------------------------------------------------------------------


def _inputs(t, k, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(t, k)).astype(ml_dtypes.bfloat16)
    w = (rng.normal(size=(k, n)) / np.sqrt(k)).astype(ml_dtypes.bfloat16)
    bias = rng.normal(size=n).astype(np.float32)
    return x, w, bias


@pytest.mark.parametrize("refused", [False, True])
def test_the_biased_gemm_on_the_gpu_is_within_bf16_rounding_of_numpy(monkeypatch, refused):
    cuda_device_or_skip()
    if refused:
        monkeypatch.setattr(epilogues, "refusal_here", lambda g: "refused")
    t, k, n = (256, 192, 320) if refused else (512, 256, 384)
    x, w, bias = _inputs(t, k, n)
    compiled = compile_program(_dense(t=t, k=k, n=n), prefix="gpu_")
    assert _gemms(compiled)[0].epilogue == ("" if refused else "bias")
    (got,) = run_fragment(compiled, [x, w, bias])
    product = x.astype(np.float64) @ w.astype(np.float64)
    exact = product + bias.astype(ml_dtypes.bfloat16)
    got = np.asarray(got).astype(np.float64)
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)) + np.abs(bias)
    # Fused: the f32 sum rounded once to bf16 (half a unit: 2^-9 relative). Apart: the product
    # rounded as well, by half a unit of the product, which may be far larger than the sum.
    # Both: f32 accumulation, well under 2e-5 of the terms' magnitudes at these k.
    rounding = 2.0**-8 * np.abs(exact) + (2.0**-8 * np.abs(product) if refused else 0.0)
    assert np.all(np.abs(got - exact) <= rounding + 2e-5 * scale)
    if not refused:  # one rounding fewer than the loop it replaces
        (reference,) = accy.reference.run(_dense(t=t, k=k, n=n), [x, w, bias])
        assert np.abs(got - exact).mean() <= np.abs(reference.astype(np.float64) - exact).mean()


def _two_layers(t, k, n, m):
    """A loss through a dense layer whose output is stored (the next GEMM reads it, as
    attention reads GPT-2's qkv), so that its bias is the GEMM's epilogue in the gradient
    program too."""

    def loss(b, a):
        x, w, bias, v = a
        y = x.contract(w, "k") + b.convert(bias, bf16)
        z = y.contract(v, "n")
        return b.convert((z * z).sum(None), f32)

    types = [spec(bf16, t=t, k=k), spec(bf16, k=k, n=n), spec(f32, n=n), spec(bf16, n=n, m=m)]
    return accy.grad(accy.trace.define("loss", types, loss), wrt=(0, 1, 2, 3))


def test_the_gradient_program_of_a_stored_dense_output_fuses_its_forward_bias():
    _, fused = _fused_steps(_two_layers(256, 128, 192, 64))
    assert len(fused) == 1


def test_the_gradients_through_a_fused_bias_match_the_reference_on_the_gpu():
    cuda_device_or_skip()
    import cupy

    t, k, n, m = 256, 128, 192, 64
    program = _two_layers(t, k, n, m)
    x, w, bias = _inputs(t, k, n, seed=1)
    v = (np.random.default_rng(2).normal(size=(n, m)) / np.sqrt(n)).astype(ml_dtypes.bfloat16)
    outputs = accy.compile(program, device="cuda")(x, w, bias, v)
    got = [cupy.asnumpy(g).astype(np.float64) for g in outputs]
    want = [g.astype(np.float64) for g in accy.reference.run(program, [x, w, bias, v])]
    for g, r in zip(got, want, strict=True):
        assert g.shape == r.shape
        # bf16 gradients: a few roundings of terms of the largest one's size
        assert np.abs(g - r).max() <= 0.03 * np.abs(r).max()
        assert np.abs(g - r).mean() <= 0.01 * np.abs(r).mean()
