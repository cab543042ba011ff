"""GEMM epilogues: which bias additions and GELUs the GPU plan moves into the GEMM
(`accy.lower.gemm_epilogues`), the schedule the CUDA backend makes of them (cuBLASLt's bias,
GELU_AUX_BIAS and DGELU epilogues, or the plain GEMM and the epilogue's loops as kernels after
it where cuBLASLt refuses), and, on a GPU, their values and gradients against NumPy."""

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
from accy.lower.gemm_epilogues import bias_epilogue, gemm_epilogue
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
def test_a_gelu_after_the_bias_alone_is_not_fused(gelu):
    # Read once, the biased product is computed inside the GELU's loop: no epilogue stores it
    # (an inference GELU_BIAS epilogue is not made).
    activation = accy.nn.gelu_tanh if gelu == "tanh" else accy.nn.gelu
    _, fused = _fused_steps(_dense(extra=lambda b, product, y: activation(y)))
    assert fused == []


def test_an_f32_gemm_and_a_scaled_sum_are_not_fused():
    _, fused = _fused_steps(_dense(dtype=f32))
    assert fused == []
    _, fused = _fused_steps(_dense(extra=lambda b, product, y: product * 2.0 + (y - product)))
    assert fused == []


@pytest.mark.slow
def test_the_gpt2_steps_qkv_biases_and_mlp_gelus_are_their_gemms_epilogues():
    # Not the attention projection's bias: its loop adds the residual as well.
    from tools.gpt2_chains import step_program

    plan = build_plan(step_program("bf16", True), GPU)
    found = {}
    for step in plan.steps:
        epilogue = gemm_epilogue(step, plan.producers)
        if epilogue is not None:
            found.setdefault(epilogue.name, []).append(step)
    assert {name: len(steps) for name, steps in found.items()} == {
        "bias": 12,
        "gelu_aux_bias": 12,
        "dgelu": 12,
    }
    assert {s.op.type.axes[-3:] for s in found["bias"]} == {("part", "head", "dim")}
    assert {s.op.type.axes[-1] for s in found["gelu_aux_bias"] + found["dgelu"]} == {"hidden"}


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


def test_an_epilogue_gemm_of_a_batch_or_another_dtype_is_not_taken():
    at = epilogues.Gemm("bf16", 0, 0, 8, 8, 8, None, 8, None, 8, None, 8, epilogue="bias")
    assert epilogues.takes(at)
    assert not epilogues.takes(replace(at, batch=2))
    assert not epilogues.takes(replace(at, dtype="f32"))
    assert not epilogues.takes(replace(at, out="f32"))
    with pytest.raises(accy.AccyError, match="single GEMMs of bf16 or f16 with one of the"):
        epilogues.Issuer(replace(at, epilogue="relu"), (None, None))


# -- GELU: the forward's GELU_AUX_BIAS, the backward's DGELU -------------------------------------


def _mlp(t=256, k=128, n=384, m=64):
    """The gradient of a loss through `gelu_tanh(x.contract(w) + bias).contract(v)` (GPT-2's
    MLP): its pre-activation read by the forward GELU and the backward's derivative."""

    def loss(b, a):
        x, w, bias, v = a
        h = accy.nn.gelu_tanh(x.contract(w, "k") + b.convert(bias, bf16))
        z = h.contract(v, "n")
        return b.convert((z * z).sum(None), f32)

    types = [spec(bf16, t=t, k=k), spec(bf16, k=k, n=n), spec(f32, n=n), spec(bf16, n=n, m=m)]
    return accy.grad(accy.trace.define("mlp", types, loss), wrt=(0, 1, 2, 3))


def _epilogues(program, target=GPU):
    plan = build_plan(program, target)
    found = [gemm_epilogue(step, plan.producers) for step in plan.steps]
    return plan, sorted(e.name for e in found if e is not None)


def test_the_mlps_gelu_and_its_derivative_are_gemm_epilogues_on_the_gpu_plan():
    plan, names = _epilogues(_mlp())
    assert names == ["dgelu", "gelu_aux_bias"]
    assert not any(s.kind == "loop" and s.op.kind == "unary" for s in plan.steps)
    (forward,) = [s for s in plan.steps if s.kind == "dot" and len(s.epilogue) == 2]
    gelu = gemm_epilogue(forward, plan.producers)
    # The GEMM writes the biased product (aux, stored: the backward reads it) and the GELU.
    assert forward.writes == (gelu.aux, gelu.result)
    (backward,) = [
        s for s in plan.steps if gemm_epilogue(s, plan.producers) and s.epilogue[0].op.kind == "mul"
    ]
    assert gemm_epilogue(backward, plan.producers).aux == gelu.aux
    assert gelu.aux in backward.reads


def test_the_cpu_plan_keeps_the_gelu_loops():
    plan, names = _epilogues(_mlp(), CPU)
    assert names == []
    unaries = {s.op.attrs["op"] for s in plan.steps if s.kind == "loop" and s.op.kind == "unary"}
    assert "gelu_tanh" in unaries


def test_only_the_stored_biased_product_makes_gelu_epilogues():
    # Without stored bias sums the pre-activation is computed inside each reader: no epilogue
    # (as in the GPU's loop bodies, `Target.stores_bias_sums`).
    plan = build_plan(_mlp(), replace(GPU, stores_bias_sums=False))
    assert not any(gemm_epilogue(s, plan.producers) for s in plan.steps)


def _all_steps(plan):
    for step in plan.steps:
        yield plan, step
        for inner in (step.body, *step.branches):
            if inner is not None:
                yield from _all_steps(inner)


def test_a_scanned_mlps_body_keeps_its_bias_inside_the_gelus_loop():
    # Loop bodies do not store the biased product (`Target.stores_bias_sums`): the CUDA backend
    # would add the bias there in a kernel of its own (a body's GEMM is issued without
    # cuBLASLt's epilogues unless its contraction is long), one launch a layer more.
    def loss(x, w, bias, v):
        def layer(carry, weights):
            w, bias, v = weights
            h = accy.nn.gelu_tanh(carry.contract(w, "k") + bias.convert(bf16))
            return carry + h.contract(v, "n").rename("m", "k"), None

        out, _ = accy.scan(layer, x, (w, bias, v), axis="layer")
        return (out * out).sum().convert(f32)

    types = [
        spec(bf16, t=256, k=64),
        spec(bf16, layer=2, k=64, n=256),
        spec(f32, layer=2, n=256),
        spec(bf16, layer=2, n=256, m=64),
    ]
    step = accy.value_and_grad(loss, argnums=(0, 1, 2, 3))
    plan = build_plan(accy.jit(step, device="cuda").lower(*types).program, GPU)
    inner = [(p, s) for p, s in _all_steps(plan) if p is not plan]
    assert any(s.kind == "dot" for _, s in inner)  # the layers' GEMMs are in the scan bodies
    names = {e.name for p, s in inner if (e := gemm_epilogue(s, p.producers)) is not None}
    assert not names & {"gelu_aux_bias", "dgelu"}


def test_the_cuda_schedule_of_the_gelu_epilogues(monkeypatch):
    monkeypatch.setattr(epilogues, "refusal_here", lambda g: None)
    compiled = compile_program(_mlp(t=320), prefix="gelu_")
    gemms = {g.epilogue: g for g in _gemms(compiled) if g.epilogue}
    assert set(gemms) == {"gelu_aux_bias", "dgelu"}
    forward, backward = gemms["gelu_aux_bias"], gemms["dgelu"]
    assert forward.bias is not None and forward.aux not in (None, forward.c)
    assert backward.bias is None and backward.aux == forward.aux
    assert (forward.m, forward.n, forward.ldc) == (384, 320, 384)
    assert "after the GEMM" not in " ".join(compiled.kernel_comments.values())


def _mlp_returning_its_gelu(t=256, k=128, n=384, m=64):
    """`_mlp`'s loss and gradients, and the GELU output as well (a program output: its buffer
    is the caller's, whose address moves from call to call)."""

    def loss(x, w, bias, v):
        h = accy.nn.gelu_tanh(x.contract(w, "k") + bias.convert(bf16))
        z = h.contract(v, "n")
        return (z * z).sum().convert(f32), h

    step = accy.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
    types = [spec(bf16, t=t, k=k), spec(bf16, k=k, n=n), spec(f32, n=n), spec(bf16, n=n, m=m)]
    return accy.jit(step, device="cuda").lower(*types).program


def test_a_gelu_the_caller_gets_back_is_not_written_by_the_gemm(monkeypatch):
    monkeypatch.setattr(epilogues, "refusal_here", lambda g: None)
    program = _mlp_returning_its_gelu(t=416)
    plan, names = _epilogues(program)
    assert "gelu_aux_bias" in names  # the plan fuses; the CUDA step sees the moving buffer
    compiled = compile_program(program, prefix="gelu_out_")
    assert "gelu_aux_bias" not in {g.epilogue for g in _gemms(compiled)}
    assert "(GELU after the GEMM)" in " ".join(compiled.kernel_comments.values())


def test_where_cublaslt_refuses_the_gelu_epilogues_are_kernels_after_the_gemm(monkeypatch):
    monkeypatch.setattr(epilogues, "refusal_here", lambda g: "refused")
    compiled = compile_program(_mlp(t=288), prefix="gelu_apart_")
    assert not any(g.epilogue for g in _gemms(compiled))
    comments = " ".join(compiled.kernel_comments.values())
    for what in ("bias added", "GELU", "GELU's derivative applied"):
        assert f"({what} after the GEMM)" in comments


@needs_nvcc
@pytest.mark.parametrize(
    "build",
    [pytest.param(lambda: _dense(t=112), id="bias"), pytest.param(lambda: _mlp(t=352), id="gelu")],
)
def test_the_cuda_c_of_both_forms_compiles(monkeypatch, build):
    sources = []
    for answer, prefix in ((None, "fused_"), ("refused", "apart_")):
        monkeypatch.setattr(epilogues, "refusal_here", lambda g, answer=answer: answer)
        sources.append(compile_program(build(), prefix=prefix).source)
    ptx = toolchain.ptx_with_nvcc("".join(sources), "GEMM epilogues", arch="compute_90")
    assert ".entry" in ptx


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
    t, k, n, m = 256, 128, 192, 64
    _assert_gradients_match_on_the_gpu(_two_layers(t, k, n, m), (t, k, n, m), seed=1)


def _assert_gradients_match_on_the_gpu(program, shape, seed):
    """`program` (a gradient of `_two_layers` or `_mlp` at `shape`, t x k x n x m) on the GPU
    within bf16 gradients' rounding of the reference, on random inputs."""
    import cupy

    t, k, n, m = shape
    x, w, bias = _inputs(t, k, n, seed=seed)
    rng = np.random.default_rng(seed + 1)
    v = (rng.normal(size=(n, m)) / np.sqrt(n)).astype(ml_dtypes.bfloat16)
    outputs = accy.compile(program, device="cuda")(x, w, bias, v)
    got = [cupy.asnumpy(g).astype(np.float64) for g in outputs]
    want = [g.astype(np.float64) for g in accy.reference.run(program, [x, w, bias, v])]
    for g, r in zip(got, want, strict=True):
        assert g.shape == r.shape
        # bf16 gradients: a few roundings of terms of the largest one's size (a fused GELU
        # rounds its input to bf16 once, as its aux matrix; the reference keeps it in f32)
        assert np.abs(g - r).max() <= 0.03 * np.abs(r).max()
        assert np.abs(g - r).mean() <= 0.01 * np.abs(r).mean()


@pytest.mark.parametrize("refused", [False, True])
def test_the_mlp_gradients_through_gelu_epilogues_match_the_reference_on_the_gpu(
    monkeypatch, refused
):
    cuda_device_or_skip()
    if refused:
        monkeypatch.setattr(epilogues, "refusal_here", lambda g: "refused")
    t, k, n, m = (256, 128, 384, 64) if refused else (512, 256, 768, 128)
    program = _mlp(t, k, n, m)
    compiled = compile_program(program, prefix=f"gelu_gpu_{int(refused)}_")
    names = {g.epilogue for g in _gemms(compiled)} - {""}
    assert names == (set() if refused else {"gelu_aux_bias", "dgelu"})
    _assert_gradients_match_on_the_gpu(program, (t, k, n, m), seed=3)


def test_a_returned_gelu_is_right_on_every_call_on_the_gpu():
    # Each call's outputs are fresh arrays: a GEMM captured writing the first call's would leave
    # the second call's GELU unwritten.
    cuda_device_or_skip()
    import cupy

    t, k, n, m = 256, 128, 384, 64
    program = _mlp_returning_its_gelu(t, k, n, m)
    executable = accy.compile(program, device="cuda")
    x, w, bias = _inputs(t, k, n, seed=5)
    v = (np.random.default_rng(6).normal(size=(n, m)) / np.sqrt(n)).astype(ml_dtypes.bfloat16)
    want = [g.astype(np.float64) for g in accy.reference.run(program, [x, w, bias, v])]
    for _ in range(2):
        got = [cupy.asnumpy(g).astype(np.float64) for g in executable(x, w, bias, v)]
        for g, r in zip(got, want, strict=True):
            assert np.abs(g - r).max() <= 0.03 * np.abs(r).max()
