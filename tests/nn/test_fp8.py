"""FP8 GEMMs (`accy.nn.fp8_matmul`) and the policy that picks them, against an emulation written
here from ml_dtypes: per-tensor current scaling, E4M3 forward operands, E5M2 output gradients.

Every device runs the same checks (the `device` fixture): the reference evaluator, the CPU (the
fallback composition) and CUDA (cuBLASLt FP8; skipped without a GPU), whose sums are held to
what Hopper's FP8 tensor cores keep while accumulating (`SUM_ERROR`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import accy
from accy import nn
from accy.backends.cuda import fp8 as cuda_fp8
from accy.core.types import FLOAT8, float8_e4m3fn, float8_e5m2, saturate_to_float8
from accy.errors import AccyError, AxisError, DTypeError, TypeRuleError
from accy.nn import fp8

from ..executors import cuda_gate

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
NUMPY = {E4M3: ml_dtypes.float8_e4m3fn, E5M2: ml_dtypes.float8_e5m2}
LARGEST = {E4M3: 448.0, E5M2: 57344.0}


def host(x) -> np.ndarray:
    return np.asarray(x.to("cpu").array).astype(np.float64)


def emulate_quantize(x: np.ndarray, format: str) -> tuple[np.ndarray, float]:
    """float8 values of x times fp8_max / amax (saturating), and 1 / scale, from ml_dtypes."""
    x = np.asarray(x, np.float32)
    amax = np.float32(np.abs(x).max())
    scale = np.float32(LARGEST[format]) / amax if 0 < amax < np.inf else np.float32(1)
    clipped = np.clip(x * scale, -LARGEST[format], LARGEST[format])
    return clipped.astype(NUMPY[format]).astype(np.float64), float(np.float32(1) / scale)


def emulate(x, w, subscripts: str, formats=(E4M3, E4M3)) -> tuple[np.ndarray, np.ndarray]:
    """The emulated FP8 product (float64) and the sum of |terms| (its rounding's scale)."""
    (qx, ix), (qw, iw) = emulate_quantize(x, formats[0]), emulate_quantize(w, formats[1])
    scale = np.float64(np.float32(ix) * np.float32(iw))
    exact = np.einsum(subscripts, qx, qw) * scale
    magnitude = np.einsum(subscripts, np.abs(qx), np.abs(qw)) * scale
    return exact, magnitude


# Hopper's FP8 tensor cores add into a running sum that keeps about 14 significant bits,
# truncating (seen on the H200 through cuBLASLt: 448² + 57 summed to 200752, not 200761; errors
# up to 1.3e-4 of the terms' magnitude at k = 48, 13 times f32's bound below), so a GEMM on
# CUDA is held to 2^-11 of the magnitude: a few such truncations at these tests' k (<= 48).
SUM_ERROR = {"cuda": 2.0**-11}
F32_SUM_ERROR = 1e-5


def assert_close_to_emulation(got, exact, magnitude, dtype, device=None) -> None:
    """Within summation in another order (in f32, or in `device`'s FP8 tensor cores), plus
    the result's own rounding to `dtype`."""
    rounding = 2.0**-8 if dtype == accy.bf16 else 2.0**-24
    summation = SUM_ERROR.get(device, F32_SUM_ERROR)
    bound = summation * magnitude + rounding * np.abs(exact) + 1e-30
    worst = float(np.max(np.abs(got - exact) / bound))
    assert worst <= 1.0, f"error {worst:.3g} times the bound"


def named(array, axes, device, dtype=accy.f32):
    return accy.named(np.asarray(array, np.float32), axes, device=device).convert(dtype)


# -- the float8 formats ---------------------------------------------------------------------------


@pytest.mark.parametrize("format", [E4M3, E5M2])
def test_saturating_cast_rounds_as_ml_dtypes_and_saturates_beyond(format):
    rng = np.random.default_rng(0)
    largest = LARGEST[format]
    inside = rng.uniform(-largest, largest, 10_000).astype(np.float32)
    got = saturate_to_float8(inside, format).astype(np.float32)
    np.testing.assert_array_equal(got, inside.astype(NUMPY[format]).astype(np.float32))
    beyond = np.array([2 * largest, -3 * largest, np.inf, -np.inf], np.float32)
    got = saturate_to_float8(beyond, format).astype(np.float32)
    assert got.tolist() == [largest, -largest, largest, -largest]
    assert np.isnan(saturate_to_float8(np.array([np.nan], np.float32), format).astype(np.float32))
    assert FLOAT8[format].max == largest


def _hard_values(format: str) -> np.ndarray:
    """Every finite value of the format, the midpoints between neighbours (ties), values
    beyond the largest, subnormals, zeros and random magnitudes over the whole range."""
    every = np.arange(256, dtype=np.uint8).view(NUMPY[format]).astype(np.float32)
    finite = np.unique(every[np.isfinite(every)])
    ties = (finite[:-1] + finite[1:]) / 2  # exact in f32
    rng = np.random.default_rng(1)
    spread = np.exp2(rng.uniform(-26, 18, 4000)) * rng.choice([-1, 1], 4000)
    extra = [0.0, -0.0, LARGEST[format] * 1.01, -LARGEST[format] * 4, np.inf, -np.inf]
    return np.concatenate([finite, ties, -ties, spread, extra]).astype(np.float32)


@pytest.mark.parametrize("format", [E4M3, E5M2])
def test_rounding_composition_is_bitwise_the_saturating_cast(device, format):
    values = _hard_values(format)
    x = accy.named(values, "lane", device=device)
    got = np.asarray(accy.jit(lambda x: fp8.round_to_float8(x.builder, x, format))(x).to("cpu"))
    want = saturate_to_float8(values, format).astype(np.float32)
    np.testing.assert_array_equal(
        got.view(np.uint32) & 0x7FFFFFFF, want.view(np.uint32) & 0x7FFFFFFF
    )
    np.testing.assert_array_equal(np.signbit(got[want != 0]), np.signbit(want[want != 0]))


def test_float8_values_are_refused_by_every_other_operation():
    with pytest.raises(DTypeError, match="a value of dtype float8_e4m3fn: float8 is a storage"):
        accy.trace.define("p", [accy.spec(accy.f32, n=2)], lambda b, a: a[0].convert(float8_e4m3fn))
    with pytest.raises(DTypeError, match="parameter does not take float8_e5m2"):
        accy.trace.define("p", [accy.spec(float8_e5m2, n=2)], lambda b, a: a[0])
    with pytest.raises(DTypeError, match="is not a float8 format"):
        accy.core.types.float8_format(accy.bf16)


# -- values ---------------------------------------------------------------------------------------


def test_exact_case_is_bitwise_integer_arithmetic(device):
    """amax 448 on both sides: scale 1, small integers, 16 terms. 448² is added to nothing and
    every other partial sum is an integer below 2^13, so the sums are exact in f32 and in the
    14 significant bits of Hopper's FP8 accumulation (`SUM_ERROR`)."""
    rng = np.random.default_rng(2)
    a = rng.integers(-8, 9, size=(16, 16)).astype(np.float32)
    b = rng.integers(-8, 9, size=(16, 32)).astype(np.float32)
    a[0, 0] = b[0, 0] = 448.0
    a[0, 1:] = 0.0
    y = nn.fp8_matmul(named(a, ("m", "k"), device), named(b, ("k", "n"), device), "k")
    np.testing.assert_array_equal(host(y), a.astype(np.float64) @ b)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [accy.f32, accy.bf16])
def test_values_match_the_emulation(device, dtype):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 48)).astype(np.float32)
    w = (0.02 * rng.normal(size=(48, 32))).astype(np.float32)
    if dtype == accy.bf16:  # the emulation starts from the operands the call sees
        x, w = (v.astype(ml_dtypes.bfloat16).astype(np.float32) for v in (x, w))
    y = nn.fp8_matmul(
        named(x, ("token", "embed"), device, dtype),
        named(w, ("embed", "hidden"), device, dtype),
        "embed",
    )
    assert y.dtype == dtype and y.shape == {"token": 64, "hidden": 32}
    exact, magnitude = emulate(x, w, "te,eh->th")
    assert_close_to_emulation(host(y), exact, magnitude, dtype, device)
    assert np.linalg.norm(host(y) - x @ w.astype(np.float64)) < 0.06 * np.linalg.norm(x @ w)


@pytest.mark.parametrize(
    "x_axes, w_axes, contracted, subscripts",
    [
        (("token", "embed"), ("vocab", "embed"), ("embed",), "te,ve->tv"),  # a tied head
        (("embed", "token"), ("embed", "hidden"), ("embed",), "et,eh->th"),  # both transposed
        (
            ("batch", "token", "embed"),
            ("batch", "token", "hidden"),
            ("batch", "token"),
            "bte,bth->eh",
        ),
    ],
)
def test_every_layout_matches_the_emulation(device, x_axes, w_axes, contracted, subscripts):
    rng = np.random.default_rng(4)
    extents = {"batch": 2, "token": 16, "embed": 32, "vocab": 48, "hidden": 16}
    x = rng.normal(size=[extents[a] for a in x_axes]).astype(np.float32)
    w = rng.normal(size=[extents[a] for a in w_axes]).astype(np.float32)
    y = nn.fp8_matmul(named(x, x_axes, device), named(w, w_axes, device), contracted)
    exact, magnitude = emulate(x, w, subscripts)
    assert_close_to_emulation(host(y), exact, magnitude, accy.f32, device)


def test_unaligned_extents_run_the_composition_everywhere(device):
    rng = np.random.default_rng(5)
    x, w = rng.normal(size=(5, 7)).astype(np.float32), rng.normal(size=(7, 3)).astype(np.float32)
    y = nn.fp8_matmul(named(x, ("m", "k"), device), named(w, ("k", "n"), device), "k")
    assert_close_to_emulation(host(y), *emulate(x, w, "mk,kn->mn"), accy.f32)


@pytest.mark.slow
def test_amax_zero_gives_zeros_and_finite_gradients(device):
    x = named(np.zeros((16, 32)), ("token", "embed"), device)
    w = named(np.random.default_rng(6).normal(size=(32, 16)), ("embed", "hidden"), device)
    y = nn.fp8_matmul(x, w, "embed")
    assert np.all(host(y) == 0)
    dx, dw = accy.grad(lambda x, w: nn.fp8_matmul(x, w, "embed").sum(), argnums=(0, 1))(x, w)
    assert np.all(np.isfinite(host(dx))) and np.all(host(dw) == 0)


def test_infinities_saturate_to_the_largest_value(device):
    """amax is infinite: the scale stays 1 and the infinity saturates to 448."""
    x = np.zeros((16, 16), np.float32)
    x[0, 0], x[1, 1] = np.inf, 2.0
    w = np.eye(16, dtype=np.float32) * 448.0
    y = host(nn.fp8_matmul(named(x, ("m", "k"), device), named(w, ("k", "n"), device), "k"))
    assert y[0, 0] == 448.0 * 448.0 and y[1, 1] == 2.0 * 448.0
    assert np.all(np.isfinite(y))


# -- derivatives ----------------------------------------------------------------------------------


def test_gradients_are_fp8_gemms_of_the_e5m2_output_gradient(device):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2, 16, 32)).astype(np.float32)
    w = (0.05 * rng.normal(size=(32, 48))).astype(np.float32)
    r = rng.normal(size=(2, 16, 48)).astype(np.float32)
    cotangent = named(r, ("batch", "token", "hidden"), device)

    def loss(x, w):
        return (nn.fp8_matmul(x, w, "embed") * cotangent).sum()

    xs, ws = named(x, ("batch", "token", "embed"), device), named(w, ("embed", "hidden"), device)
    dx, dw = accy.jit(accy.grad(loss, argnums=(0, 1)))(xs, ws)
    assert dx.ty.axes == ("batch", "token", "embed") and dw.ty.axes == ("embed", "hidden")
    exact, magnitude = emulate(r, w, "bth,eh->bte", (E5M2, E4M3))
    assert_close_to_emulation(host(dx), exact, magnitude, accy.f32, device)
    exact, magnitude = emulate(x, r, "bte,bth->eh", (E4M3, E5M2))
    assert_close_to_emulation(host(dw), exact, magnitude, accy.f32, device)
    # ... and within FP8's tolerance of the exact gradients.
    true_dx, true_dw = np.einsum("bth,eh->bte", r, w), np.einsum("bte,bth->eh", x, r)
    assert np.linalg.norm(host(dx) - true_dx) < 0.1 * np.linalg.norm(true_dx)
    assert np.linalg.norm(host(dw) - true_dw) < 0.1 * np.linalg.norm(true_dw)


def test_gradient_of_a_tied_head_keeps_the_table_layout(device):
    rng = np.random.default_rng(8)
    x, table = rng.normal(size=(32, 16)), rng.normal(size=(48, 16))
    r = rng.normal(size=(32, 48))
    cotangent = named(r, ("token", "vocab"), device)
    loss = lambda x, t: (nn.fp8_matmul(x, t, "embed") * cotangent).sum()  # noqa: E731
    xs, ts = named(x, ("token", "embed"), device), named(table, ("vocab", "embed"), device)
    dx, dt = accy.grad(loss, argnums=(0, 1))(xs, ts)
    assert dt.ty.axes == ("vocab", "embed")
    dx_emulated = emulate(r, table, "tv,ve->te", (E5M2, E4M3))
    dt_emulated = emulate(r, x, "tv,te->ve", (E5M2, E4M3))
    assert_close_to_emulation(host(dx), *dx_emulated, accy.f32, device)
    assert_close_to_emulation(host(dt), *dt_emulated, accy.f32, device)


def test_forward_mode_treats_quantisation_as_the_identity():
    rng = np.random.default_rng(9)
    x, w, tx, tw = (rng.normal(size=s).astype(np.float32) for s in [(4, 16), (16, 8)] * 2)
    args = [
        named(v, axes, "reference")
        for v, axes in zip((x, w), [("m", "k"), ("k", "n")], strict=True)
    ]
    tangents = [
        named(v, axes, "reference")
        for v, axes in zip((tx, tw), [("m", "k"), ("k", "n")], strict=True)
    ]
    _, tangent = accy.jvp(lambda x, w: nn.fp8_matmul(x, w, "k"), args, tangents)
    np.testing.assert_allclose(host(tangent), tx @ w + x @ tw, rtol=1e-5, atol=1e-5)


# -- the policy -----------------------------------------------------------------------------------


def _tiny_gpt2(device="cpu"):
    config = accy.models.gpt2.Config(vocab=64, positions=16, embed=32, layers=2, heads=2)
    return accy.models.gpt2.GPT2.init(config, accy.random.key(0), device=device)


def _fp8_paths(tree, prefix="") -> list[str]:
    found = []
    if isinstance(tree, nn.Module):
        for name in tree.__dataclass_fields__:
            path = f"{prefix}.{name}" if prefix else name
            found += _fp8_paths(getattr(tree, name), path)
        if getattr(tree, "fp8", False):
            found.append(prefix)
    return sorted(found)


@pytest.mark.slow
@pytest.mark.parametrize(
    "choice, paths",
    [
        (("mlp",), ["blocks.layers.mlp.down", "blocks.layers.mlp.up"]),
        (("head",), ["wte"]),
        (("mlp", "head"), ["blocks.layers.mlp.down", "blocks.layers.mlp.up", "wte"]),
        (("attention",), [f"blocks.layers.attn.{p}" for p in ("key", "output", "query", "value")]),
        (lambda path: path.endswith("mlp.up"), ["blocks.layers.mlp.up"]),
    ],
)
def test_policy_chooses_exactly_the_named_gemms(choice, paths):
    model = _tiny_gpt2()
    policy = nn.mixed_precision(accy.f32, accy.bf16, accy.f32, fp8=choice)
    chosen = policy.fp8.apply(model)
    assert _fp8_paths(chosen) == paths
    # the master weights are the same arrays
    assert chosen.blocks.layers.mlp.up.weight is model.blocks.layers.mlp.up.weight


@pytest.mark.parametrize(
    "tied, choice, paths",
    [
        (False, ("mlp",), [f"blocks.layers.mlp.{p}" for p in ("down", "gate", "up")]),
        (False, ("head",), ["lm_head"]),
        (True, ("head",), ["embed_tokens"]),
    ],
)
def test_policy_finds_llamas_mlp_and_head(tied, choice, paths):
    config = accy.models.llama.Config(vocab=64, embed=32, hidden=64, layers=1, heads=2, tied=tied)
    model = accy.models.llama.Llama.init(config, accy.random.key(0), device="cpu")
    assert _fp8_paths(nn.Fp8Policy(choice).apply(model)) == paths


@pytest.mark.slow
def test_policy_traces_one_fp8_gemm_per_chosen_layer(monkeypatch):
    model = _tiny_gpt2()
    ids = accy.named(np.arange(16, dtype=np.int32)[None] % 64, ("batch", "token"))
    seen = []
    original = fp8.gemm
    monkeypatch.setattr(fp8, "gemm", lambda s: seen.append(s) or original(s))
    policy = nn.mixed_precision(fp8=("mlp", "head"))
    bf16_scores = accy.jit(lambda m: nn.mixed_precision().cast_to_compute(m)(ids))(model)
    scores = accy.jit(lambda m: policy.cast_to_compute(m)(ids))(model)
    contracted = sorted(s.axes for s in seen)
    assert contracted == [("embed",), ("embed",), ("hidden",)]  # up, the head, down (a scan body)
    error = np.linalg.norm(host(scores) - host(bf16_scores)) / np.linalg.norm(host(bf16_scores))
    assert error < 0.05


def test_policy_errors():
    with pytest.raises(AccyError, match="fp8= takes group names"):
        nn.mixed_precision(fp8=("mlp", "heads"))
    with pytest.raises(AccyError, match="fp8= takes group names"):
        nn.mixed_precision(fp8="mlp")
    with pytest.raises(DTypeError, match="needs compute_dtype accy.bf16, accy.f16 or accy.f32"):
        nn.mixed_precision(compute_dtype=accy.f64, fp8=("mlp",))


# -- errors ---------------------------------------------------------------------------------------


def _operands(x_axes=("m", "k"), w_axes=("k", "n"), dtype=np.float32):
    return (
        accy.named(np.ones((16, 16), dtype), x_axes, device="reference"),
        accy.named(np.ones((16, 16), dtype), w_axes, device="reference"),
    )


def test_fp8_matmul_errors():
    x, w = _operands()
    with pytest.raises(AccyError, match="x must be an array"):
        nn.fp8_matmul(np.ones(3), w, "k")
    with pytest.raises(DTypeError, match="takes f32, bf16 or f16 operands"):
        nn.fp8_matmul(*_operands(dtype=np.int32), "k")
    with pytest.raises(DTypeError, match="give both one dtype"):
        nn.fp8_matmul(x, w.convert(accy.bf16), "k")
    with pytest.raises(AxisError, match="at least one axis"):
        nn.fp8_matmul(x, w, ())
    with pytest.raises(AxisError, match="must be on both operands"):
        nn.fp8_matmul(x, w, "n")
    short = accy.named(np.ones((8, 16), np.float32), ("k", "n"), device="reference")
    with pytest.raises(AxisError, match="has extent 16 on x and 8 on w"):
        nn.fp8_matmul(x, short, "k")
    with pytest.raises(AxisError, match="share 'm', which is not contracted"):
        nn.fp8_matmul(*_operands(("m", "k"), ("m", "k")), "k")
    with pytest.raises(DTypeError, match="is not a float8 format"):
        nn.fp8_matmul(x, w, "k", formats=(accy.bf16, float8_e4m3fn))
    with pytest.raises(DTypeError, match="formats must be two float8 dtypes"):
        nn.fp8_matmul(x, w, "k", formats=("e4m3", "e4m3"))
    with pytest.raises(DTypeError, match="two E5M2 matrices"):
        nn.fp8_matmul(x, w, "k", formats=(float8_e5m2, float8_e4m3fn))
    with pytest.raises(DTypeError, match="out must be accy.f32, accy.bf16 or accy.f16"):
        nn.fp8_matmul(x, w, "k", out=accy.i32)


def test_record_refuses_operands_laid_out_otherwise():
    s = fp8.Signature(("k",), (("m", "k"), ("k", "n")), (E4M3, E4M3), E5M2, "f32")
    with pytest.raises(TypeRuleError, match="takes operands laid out as"):
        fp8.result_type(s, accy.spec(accy.f32, k=16, m=16), accy.spec(accy.f32, k=16, n=16))


def test_cuda_step_declines_what_cublaslt_fp8_does_not_take():
    s = fp8.Signature(("k",), (("m", "k"), ("k", "n")), (E4M3, E4M3), E5M2, "bf16")

    def step(dtype=accy.bf16, m=32, k=32, n=32, result=accy.bf16):
        types = (accy.spec(dtype, m=m, k=k), accy.spec(dtype, k=k, n=n))
        return cuda_fp8.describe(s, types, accy.spec(result, m=m, n=n))

    assert step() is not None and step().second.transposed and not step().first.transposed
    assert step(dtype=accy.f16) is None  # read as f32 or bf16 only
    assert step(m=24) is None and step(k=8) is None  # cuBLASLt FP8 wants multiples of 16
    mixed = fp8.Signature(("j", "k"), (("j", "m", "k"), ("j", "k", "n")), (E4M3,) * 2, E5M2, "f32")
    types = (accy.spec(accy.f32, j=16, m=16, k=16), accy.spec(accy.f32, j=16, k=16, n=16))
    assert cuda_fp8.describe(mixed, types, accy.spec(accy.f32, m=16, n=16)) is None
    assert step().scratch_bytes > 2 * 32 * 32 + cuda_fp8.WORKSPACE_BYTES


def test_cublaslt_runs_fp8_gemms():
    """On a GPU, cuBLASLt runs the forward and gradient GEMMs (none declined: `refusal`)."""
    if (reason := cuda_gate()) is not None:
        pytest.skip(reason)
    forward = fp8.Signature(("k",), (("m", "k"), ("k", "n")), (E4M3, E4M3), E5M2, "bf16")
    gradient = fp8.Signature(("n",), (("m", "n"), ("k", "n")), (E5M2, E4M3), E5M2, "f32")
    for s, dtype in ((forward, accy.bf16), (gradient, accy.f32)):
        a, b = (accy.spec(dtype, dict.fromkeys(layout, 64)) for layout in s.layouts)
        step = cuda_fp8.describe(s, (a, b), fp8.result_type(s, a, b))
        assert cuda_fp8.refusal(step) is None


# -- the CUDA quantisation kernels, run on the CPU -------------------------------------------------

EMULATION = r"""
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local Dim3 threadIdx, blockIdx;
static Dim3 blockDim, gridDim;
static std::barrier<> *accy_block;
static std::barrier<> *accy_warps[32];
static float accy_lanes[1024];
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() accy_block->arrive_and_wait()
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline float __uint_as_float(unsigned b) { float f; memcpy(&f, &b, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned b; memcpy(&b, &f, 4); return b; }
static inline int __float2int_rn(float f) { return (int)nearbyintf(f); }
static inline float __shfl_xor_sync(unsigned, float v, int o) {  // the whole warp calls it
  int t = threadIdx.y * blockDim.x + threadIdx.x;
  accy_lanes[t] = v;
  accy_warps[t >> 5]->arrive_and_wait();
  float r = accy_lanes[t ^ o];
  accy_warps[t >> 5]->arrive_and_wait();
  return r;
}
"""

EMULATION_MAIN = r"""
template <typename F> static void launch(unsigned gx, unsigned gy, F kernel) {
  gridDim = {gx, gy, 1};
  blockDim = {THREADS, 1, 1};
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = gx; bx-- > 0;) {  // blocks in another order than their index
      std::barrier<> block(THREADS);
      accy_block = &block;
      std::vector<std::unique_ptr<std::barrier<>>> warps;
      for (int w = 0; w < THREADS / 32; ++w) {
        warps.emplace_back(new std::barrier<>(32));
        accy_warps[w] = warps.back().get();
      }
      std::vector<std::thread> threads;
      for (unsigned t = 0; t < THREADS; ++t)
        threads.emplace_back([&, t, bx, by] {
          threadIdx = {t, 0, 0};
          blockIdx = {bx, by, 0};
          kernel();
        });
      for (auto &thread : threads) thread.join();
    }
}
// argv: input file (x, then another operand y of x's size), rows, cols, byte shift of x, output
int main(int argc, char **argv) {
  const long long rows = atoll(argv[2]), cols = atoll(argv[3]), n = rows * cols;
  const int shift = atoi(argv[4]);
  char *in = (char *)aligned_alloc(256, n * sizeof(ELEMENT) + 256) + shift;
  ELEMENT *y = (ELEMENT *)aligned_alloc(256, n * sizeof(ELEMENT) + 256);
  FILE *f = fopen(argv[1], "rb");
  if (fread(in, sizeof(ELEMENT), n, f) != (size_t)n) return 2;
  if (fread(y, sizeof(ELEMENT), n, f) != (size_t)n) return 2;
  fclose(f);
  const ELEMENT *x = (const ELEMENT *)in;
  float *amax = (float *)aligned_alloc(256, 256), *scales = (float *)aligned_alloc(256, 512);
  unsigned char *q = (unsigned char *)aligned_alloc(256, n + 256);
  unsigned char *qt = (unsigned char *)aligned_alloc(256, n + 256);
  memset(q, 0xff, n);
  memset(qt, 0xff, n);
  amax[0] = amax[1] = 0.0f;  // as the program's amax_of: max |value|
  for (long long i = 0; i < n; ++i) {
    amax[0] = fmaxf(amax[0], fabsf(KERNEL_LOAD(x, i)));
    amax[1] = fmaxf(amax[1], fabsf(KERNEL_LOAD(y, i)));
  }
  launch(1, 1, [&] { fp8_scale(amax, amax + 1, LARGEST, OTHER_LARGEST, scales, 64); });
  launch(2, 1, [&] { KERNEL_QUANTIZE(x, n, scales, q); });
  launch((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE,
         [&] { KERNEL_TRANSPOSED(x, rows, cols, scales, qt); });
  FILE *g = fopen(argv[5], "wb");
  fwrite(scales, sizeof(float), 2, g);  // x's inverse scale and scale, then y's
  fwrite(scales + 64, sizeof(float), 2, g);
  fwrite(q, 1, n, g);
  fwrite(qt, 1, n, g);
  fclose(g);
  return 0;
}
"""


def emulate_quantisation_kernels(x, y, dtype: str, format: str, shift: int):
    """fp8_scale of the operands `x` [rows, cols] (in `format`) and `y` (x's shape, in the other
    format) from their amaxes, then fp8_quantize and fp8_quantize_transposed of x, emulated on the
    CPU (each block 256 threads with a barrier, warps' shuffles through memory), with x `shift`
    bytes past an aligned address. Both given as bf16 bits or f32. The inverse scale and scale
    of x, then of y; x's float8 bytes [rows, cols], and transposed [cols, rows]."""
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler to emulate CUDA kernels")
    short, other = cuda_fp8.FORMATS[format], E5M2 if format == E4M3 else E4M3
    names = {
        "ELEMENT": cuda_fp8.ELEMENT_TYPES[dtype],
        "LARGEST": f"{LARGEST[format]}f",
        "OTHER_LARGEST": f"{LARGEST[other]}f",
        "KERNEL_LOAD": f"load_{dtype}",
        "KERNEL_QUANTIZE": f"fp8_quantize_{dtype}_{short}",
        "KERNEL_TRANSPOSED": f"fp8_quantize_transposed_{dtype}_{short}",
    }
    defines = "".join(f"#define {key} {value}\n" for key, value in names.items())
    rows, cols = x.shape
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder)
        (path / "k.cpp").write_text(EMULATION + cuda_fp8.kernel_source() + defines + EMULATION_MAIN)
        command = [compiler, "-std=c++20", "-O1", "-pthread", "-w", "k.cpp", "-o", "k"]
        built = subprocess.run(command, cwd=path, capture_output=True, text=True)
        if built.returncode != 0 and "barrier" in built.stderr:
            pytest.skip("the C++ compiler has no std::barrier (C++20)")
        assert built.returncode == 0, built.stderr[-3000:]
        np.concatenate([x.ravel(), y.ravel()]).tofile(path / "in.bin")
        arguments = ["./k", "in.bin", str(rows), str(cols), str(shift), "out.bin"]
        ran = subprocess.run(arguments, cwd=path, capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        out = np.fromfile(path / "out.bin", np.uint8)
    scales = out[:16].view(np.float32)
    q = out[16 : 16 + x.size].reshape(rows, cols)
    return scales, q, out[16 + x.size :].reshape(cols, rows)


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype, format, shape, shift",
    [
        ("bf16", E4M3, (128, 192), 0),  # whole tiles, 16-byte chunks
        ("bf16", E5M2, (72, 100), 0),  # partial tiles; cols not a multiple of 8
        ("bf16", E4M3, (48, 80), 2),  # an unaligned operand: element by element
        ("f32", E4M3, (80, 68), 0),
        ("f32", E5M2, (64, 64), 4),
        ("f32", E4M3, (36, 40), 0),  # rows not a multiple of 8: byte stores
    ],
)
def test_quantisation_kernels_match_the_reference_on_the_cpu(dtype, format, shape, shift):
    """The CUDA kernels' scales (both operands' in one launch, from their amaxes) and float8
    bytes, straight and transposed, are bitwise `numpy_quantize`'s (ml_dtypes' rounding), on
    every path."""
    rng = np.random.default_rng(10)
    values, others = (
        (rng.normal(size=shape) * np.exp2(rng.uniform(-12, 4, size=shape))).astype(np.float32)
        for _ in range(2)
    )
    others *= 1000.0  # another amax
    if dtype == "bf16":
        values, others = (v.astype(ml_dtypes.bfloat16).astype(np.float32) for v in (values, others))
        x, y = ((v.view(np.uint32) >> 16).astype(np.uint16) for v in (values, others))
    else:
        x, y = values, others
    scales, q, qt = emulate_quantisation_kernels(x, y, dtype, format, shift)
    other = E5M2 if format == E4M3 else E4M3
    operands = zip(scales.reshape(2, 2), (values, others), (format, other), strict=True)
    for (inverse, scale), v, f in operands:
        want_scale = fp8.scale_of(np.abs(v).max(), f)
        assert scale == want_scale and inverse == np.float32(1) / want_scale
    want, _ = fp8.numpy_quantize(values, format)
    want_bytes = want.astype(NUMPY[format]).view(np.uint8)
    np.testing.assert_array_equal(q, want_bytes)
    np.testing.assert_array_equal(qt, want_bytes.T)


def test_issued_launches_match_the_kernels_parameters():
    """`Issuer.issue` (run without a GPU: the kernels and cuBLASLt's call recorded) launches
    the step's kernels of `kernel_source`, each with one argument per declared parameter, of
    its declared C type."""
    source = cuda_fp8.kernel_source()
    found = re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', source)
    declared = {name: [p.strip() for p in parameters.split(",")] for name, parameters in found}
    scalars = {"long long": np.int64, "int": np.int32, "float": np.float32}
    launches = []

    class Module:
        def get_function(self, name):
            return lambda grid, block, arguments: launches.append((name, grid, block, arguments))

    s = fp8.Signature(("k",), (("m", "k"), ("k", "n")), (E4M3, E5M2), E5M2, "bf16")
    for dtype in (accy.bf16, accy.f32):
        a, b = accy.spec(dtype, m=32, k=48), accy.spec(dtype, k=48, n=16)
        issuer = object.__new__(cuda_fp8.Issuer)  # no GPU: neither cuBLASLt nor CuPy
        issuer.step = cuda_fp8.describe(s, (a, b), fp8.result_type(s, a, b))
        issuer.fast, issuer.stream = True, 0
        issuer._set, issuer._matmul = (lambda *_: None), (lambda *_: 0)
        issuer.find_kernels(Module())
        launches.clear()
        issuer.issue(1 << 20, [2 << 20, 3 << 20, 5 << 20, 6 << 20], 4 << 20)
        names = [name for name, *_ in launches]
        assert names == [
            "fp8_scale",
            f"fp8_quantize_{dtype.name}_e4m3",
            f"fp8_quantize_transposed_{dtype.name}_e5m2",  # b is [k, n]: transposed to [n, k]
        ]
        assert launches[0][3][:2] == (np.uint64(5 << 20), np.uint64(6 << 20))  # the amaxes
        for name, grid, block, arguments in launches:
            assert block[0] <= cuda_fp8.THREADS and all(g > 0 for g in grid), name
            assert len(arguments) == len(declared[name]), name
            for parameter, argument in zip(declared[name], arguments, strict=True):
                kind = parameter.rsplit(" ", 1)[0].replace("const ", "")
                want = np.uint64 if "*" in parameter else scalars[kind]
                assert type(argument) is want, (name, parameter, argument)
