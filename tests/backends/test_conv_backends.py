"""The kind conv on every device (reference, cpu, cuda): values against JAX's
lax.conv_general_dilated in f32 and bf16, and the loss-and-gradient program of a small
convolution stack against the reference evaluator, with the axes in a non-NHWC layout."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bf16, f32, spec
from accy.core.windows import padding_pairs

jax = pytest.importorskip("jax")
lax = jax.lax

# (stride, padding, dilation, groups, lhs_dilation)
CASES = [
    ((1, 1), "same", (1, 1), 1, (1, 1)),
    ((2, 2), "same", (1, 1), 1, (1, 1)),
    ((1, 2), ((2, 0), (1, -1)), (2, 1), 2, (1, 1)),
    ((1, 1), ((1, 2), (0, 1)), (1, 1), 1, (2, 2)),
]
IDS = ["same", "strided", "dilated-grouped", "input-dilated"]
X_ORDER = ("batch", "channel", "height", "width")  # NCHW
K_ORDER = ("out_channel", "channel", "height", "width")  # OIHW


def _numpy(results):
    return [np.asarray(a.get() if hasattr(a, "get") else a) for a in results]


def _program(case, dtype, channels=4, outputs=8):
    stride, padding, dilation, groups, lhs_dilation = case
    types = [
        spec(dtype, batch=2, channel=channels, height=9, width=8),
        spec(dtype, out_channel=outputs, channel=channels // groups, height=3, width=3),
    ]

    def body(b, args):
        x, k = args
        return x.conv(
            k,
            ("height", "width"),
            "channel",
            "out_channel",
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            lhs_dilation=lhs_dilation,
        )

    return accy.trace.define("conv", types, body)


def _jax(case, x, k):
    stride, padding, dilation, groups, lhs_dilation = case
    extents = [(n - 1) * d + 1 for n, d in zip(x.shape[2:], lhs_dilation, strict=True)]
    pairs = padding_pairs(padding, extents, k.shape[2:], stride, dilation)
    out = lax.conv_general_dilated(
        x.astype(np.float32),
        k.astype(np.float32),
        stride,
        pairs,
        lhs_dilation,
        dilation,
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        feature_group_count=groups,
        precision=lax.Precision.HIGHEST,
    )
    return np.asarray(out)


# (channels, outputs): fewer channels than outputs gather the windows (im2col) on the CPU, more
# sum shifted slices of one GEMM's products; a one-channel image (no groups).
SHAPES = [(c, 4, 8) for c in CASES] + [(c, 8, 4) for c in CASES] + [(c, 1, 6) for c in CASES[:2]]
SHAPE_IDS = [f"{i}-{n}to{m}" for (_, n, m), i in zip(SHAPES, IDS * 2 + IDS[:2], strict=True)]


@pytest.mark.parametrize("case, channels, outputs", SHAPES, ids=SHAPE_IDS)
def test_conv_matches_jax_on_every_device(device, case, channels, outputs):
    program = _program(case, f32, channels, outputs)
    rng = np.random.default_rng(0)
    x, k = (rng.standard_normal(t.extents).astype(np.float32) for t in program.parameter_types)
    (got,) = _numpy(accy.compile(program, device)(x, k))
    np.testing.assert_allclose(got, _jax(case, x, k), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
def test_bf16_conv_matches_jax_in_f32_within_bf16_rounding(device, case):
    program = _program(case, bf16)
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(t.extents).astype(bf16.numpy) for t in program.parameter_types]
    (got,) = _numpy(accy.compile(program, device)(*args))
    expected = _jax(case, *(a.astype(np.float32) for a in args))
    # f32 sums of exact bf16 products, rounded once to bf16 (8 bits): half an ulp relative.
    np.testing.assert_allclose(got.astype(np.float32), expected, rtol=2**-8, atol=1e-2)


def _block_loss() -> accy.Program:
    """Two 3x3 convolutions (the second strided and grouped) and a loss: forward, the
    transposed and the kernel-gradient convolutions, all as conv operations."""
    types = [
        spec(f32, batch=2, channel=4, height=10, width=9),
        spec(f32, out_channel=6, channel=4, height=3, width=3),
        spec(f32, out_channel=6, channel=3, height=3, width=3),
    ]

    def loss(b, args):
        x, k1, k2 = args
        spatial = ("height", "width")
        y = accy.nn.relu(x.conv(k1, spatial, "channel", "out_channel", padding="same"))
        y = y.rename("out_channel", "channel")
        y = y.conv(k2, spatial, "channel", "out_channel", stride=2, padding="same", groups=2)
        return (y * y).sum()

    return accy.value_and_grad(accy.trace.define("block", types, loss), wrt=(0, 1, 2))


def test_conv_gradients_agree_with_the_reference_on_every_device(device):
    program = _block_loss()
    assert program.count("conv") >= 5
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(t.extents).astype(np.float32) for t in program.parameter_types]
    expected = accy.reference.run(program, args)
    got = _numpy(accy.compile(program, device)(*args))
    for g, e in zip(got, expected, strict=True):
        # Sums of up to ~500 f32 products in another order: rounding scales with the largest
        # values (thousands here), so the absolute tolerance does too.
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6 * float(np.abs(e).max()))


# CUDA without a GPU: the plan and schedule of a conv cuDNN would run (cuDNN faked) -----------


@pytest.fixture
def fake_cudnn(monkeypatch):
    """cuDNN as if every graph built, with no workspace: planning and scheduling only."""
    from accy.backends.cuda import cudnn_conv

    built = []

    def fake_built(problem):
        built.append(problem)
        return cudnn_conv.Built(None, {}, 0)

    monkeypatch.setattr(cudnn_conv, "built", fake_built)
    return built


def _library_symbols(compiled):
    from accy.backends.cuda.schedule import Library

    return [a.symbol for a in compiled.schedule.actions if isinstance(a, Library)]


def test_cuda_plans_kept_convs_as_cudnn_library_steps(fake_cudnn):
    """The block's forward convolutions and its stride-1 input gradient are fprops, its
    kernel gradients wgrads; the grouped, strided conv and its gradients are composed (paired
    axes, input dilation); each kept conv's operands are laid out channels last."""
    from accy.backends.cuda import compile_program, cudnn_conv

    program = _block_loss()
    compiled = compile_program(program)
    symbols = _library_symbols(compiled)
    problems = set(fake_cudnn)  # each built when planned, looked up again when emitted
    assert sorted(p.mode for p in problems) == ["fprop", "fprop", "wgrad"], problems
    assert len(symbols) == 3 and all(s.startswith("accy_cudnn_conv_") for s in symbols)
    first = next(p for p in problems if p.mode == "fprop" and p.filter == (6, 4, 3, 3))
    assert first.image == (2, 4, 10, 9) and first.output == (2, 6, 10, 9)
    assert (first.pre, first.post, first.stride) == ((1, 1), (1, 1), (1, 1))
    transposed = next(p for p in problems if p.mode == "fprop" and p.filter == (4, 6, 3, 3))
    assert transposed.image == (2, 6, 10, 9) and transposed.output == (2, 4, 10, 9)
    wgrad = next(p for p in problems if p.mode == "wgrad")
    assert wgrad.image == (2, 4, 10, 9) and wgrad.filter == (6, 4, 3, 3)
    assert wgrad.output == (2, 6, 10, 9)  # the loss (the cotangent), N K P Q
    reasons = " ".join(cudnn_conv.decline_reasons().values())
    assert "paired axes ('channel_group',)" in reasons


def test_input_dilation_and_cropping_are_composed(fake_cudnn):
    from accy.backends.cuda import compile_program, cudnn_conv

    for padding, lhs_dilation, reason in [
        ("same", 2, "input dilation"),
        ([(-1, 0)], 1, "negative"),
    ]:
        types = [spec(f32, n=3, t=20, c=8), spec(f32, t=5, c=8, o=16)]
        program = accy.trace.define(
            "conv1d",
            types,
            lambda b, a, p=padding, d=lhs_dilation: a[0].conv(
                a[1], ["t"], "c", "o", padding=p, lhs_dilation=d
            ),
        )
        assert _library_symbols(compile_program(program)) == []
        assert reason in " ".join(cudnn_conv.decline_reasons().values())
    assert fake_cudnn == []


def test_a_one_dimensional_conv_is_a_two_dimensional_cudnn_problem(fake_cudnn):
    from accy.backends.cuda import compile_program

    types = [spec(bf16, n=3, t=20, c=8), spec(bf16, t=5, c=8, o=16)]
    program = accy.trace.define(
        "conv1d", types, lambda b, a: a[0].conv(a[1], ["t"], "c", "o", stride=2, dilation=2)
    )
    compiled = compile_program(program)
    (problem,) = set(fake_cudnn)
    assert (problem.image, problem.filter, problem.output) == (
        (3, 8, 1, 20),
        (16, 8, 1, 5),
        (3, 16, 1, 6),
    )
    assert (problem.stride, problem.dilation, problem.dtype) == ((1, 2), (1, 2), "bf16")
    assert len(_library_symbols(compiled)) == 1


def test_cudnn_conv_can_be_switched_off(fake_cudnn, configure):
    from accy.backends.cuda import compile_program, cudnn_conv

    configure(cudnn_conv=False)
    compiled = compile_program(_program(CASES[0], f32))
    assert _library_symbols(compiled) == [] and fake_cudnn == []
    assert "ACCY_CUDNN_CONV=0" in " ".join(cudnn_conv.decline_reasons().values())


@pytest.mark.slow
@pytest.mark.skipif(
    __import__("accy.kernel", fromlist=["toolchain"]).toolchain.nvcc() is None,
    reason="cuda gate: nvcc is not on PATH",
)
def test_the_cuda_c_around_cudnn_convs_compiles_with_nvcc(fake_cudnn):
    from accy.backends.cuda import compile_program
    from accy.kernel import toolchain

    compiled = compile_program(_block_loss())
    ptx = toolchain.ptx_with_nvcc(compiled.source, "a conv block", arch="compute_90")
    assert all(f".entry {k}(" in ptx for k in compiled.kernels)


# CUDA with a GPU: cuDNN really runs the kept convs --------------------------------------------


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_cudnn_runs_the_stride_one_convs_and_their_gradients_on_the_gpu(dtype):
    from accy.backends.cuda import compile_program, cudnn_conv
    from accy.backends.cuda.executable import CudaExecutable

    from ..executors import cuda_gate

    if (reason := cuda_gate()) is not None:
        pytest.skip(reason)
    if not cudnn_conv.available():
        pytest.skip("cuda gate: cudnn (nvidia-cudnn-frontend) is not installed")
    types = [
        spec(dtype, batch=4, height=12, width=10, channel=16),
        spec(dtype, height=3, width=3, channel=16, out_channel=32),
    ]

    def loss(b, args):
        y = args[0].conv(args[1], ("height", "width"), "channel", "out_channel", padding="same")
        return (y.convert(f32) ** 2.0).sum()

    program = accy.value_and_grad(accy.trace.define("loss", types, loss), wrt=(0, 1))
    compiled = compile_program(program)
    symbols = _library_symbols(compiled)
    assert len(symbols) == 3, (
        symbols,
        cudnn_conv.decline_reasons(),
    )  # fprop, dgrad-as-fprop, wgrad
    rng = np.random.default_rng(6)
    args = [rng.standard_normal(t.extents).astype(dtype.numpy) for t in types]
    got = _numpy(CudaExecutable(compiled, 0)(*args))
    expected = accy.reference.run(program, args)
    tolerance = 1e-4 if dtype == f32 else 2e-2
    for g, e in zip(got, expected, strict=True):
        g, e = np.asarray(g, np.float32), np.asarray(e, np.float32)
        np.testing.assert_allclose(g, e, rtol=tolerance, atol=tolerance * float(np.abs(e).max()))
