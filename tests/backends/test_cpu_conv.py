"""The CPU's tiled implicit-GEMM convolution (`accy.lower.convolution`, `steps/conv.py`): the
loss and its gradients in the input and the kernel against JAX's (`lax.conv_general_dilated`
under `jax.grad`, in float64), for strides, paddings (asymmetric, negative), dilations, input
dilation, odd sizes, one to three spatial axes, a channels-first layout, several parts of
tiles, groups (paired axes, a conv each), float64, bf16 and f16 (summed in f32), and without
a BLAS (the f32 tiles multiply in AVX-512 micro-kernels where the compiler targets AVX-512,
f64 in BLAS or loops); each checked to run as kept convs, not their composition."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bf16, f16, f32, f64, spec
from accy.core.kinds.convolution import conv_attrs
from accy.core.windows import padding_pairs
from accy.lower.convolution import cpu_orders, geometry
from accy.lower.plan import build_plan

jax = pytest.importorskip("jax")
lax = jax.lax

SPATIAL = ("height", "width", "depth")


def _case(
    extents,
    window,
    channels=3,
    outputs=5,
    batch=2,
    stride=1,
    padding="same",
    dilation=1,
    lhs_dilation=1,
    groups=1,
):
    return dict(
        extents=tuple(extents),
        window=tuple(window),
        channels=channels,
        outputs=outputs,
        batch=batch,
        stride=stride,
        padding=padding,
        dilation=dilation,
        lhs_dilation=lhs_dilation,
        groups=groups,
    )


CASES = {
    "same": _case((6, 5), (3, 3)),
    "odd-valid": _case((7, 5), (3, 2), padding="valid"),
    "strided": _case((9, 7), (3, 3), stride=(2, 3)),
    "dilated": _case((8, 9), (3, 2), dilation=(2, 3), padding="same"),
    "asymmetric-negative-padding": _case((7, 8), (3, 3), padding=((2, 0), (1, -1))),
    "input-dilated": _case((5, 4), (3, 3), lhs_dilation=(2, 1), padding=((1, 2), (0, 1))),
    "strided-dilated-large-window": _case((11, 10), (5, 4), stride=2, dilation=2, padding="same"),
    "one-channel": _case((8, 8), (3, 3), channels=1, outputs=4),
    "many-outputs": _case((5, 4), (3, 3), channels=2, outputs=70, batch=1),  # bands of vectors
    "grouped": _case((7, 6), (3, 3), channels=6, outputs=9, groups=3, stride=(2, 1)),
    "depthwise": _case((6, 6), (3, 3), channels=4, outputs=4, groups=4),
    "one-dimensional": _case((13,), (4,), stride=2, padding="same"),
    "three-dimensional": _case((5, 4, 6), (3, 2, 3), channels=2, outputs=3, stride=(1, 2, 1)),
}


def _types(c, dtype, channels_first=False):
    spatial = SPATIAL[: len(c["extents"])]
    image = dict(zip(spatial, c["extents"], strict=True))
    kernel = dict(zip(spatial, c["window"], strict=True))
    per_group = c["channels"] // c["groups"]
    if channels_first:
        x = spec(dtype, batch=c["batch"], channel=c["channels"], **image)
        k = spec(dtype, out=c["outputs"], channel=per_group, **kernel)
    else:
        x = spec(dtype, batch=c["batch"], **image, channel=c["channels"])
        k = spec(dtype, **kernel, channel=per_group, out=c["outputs"])
    return spatial, [x, k]


def _conv(c, x, k, spatial):
    return x.conv(
        k,
        spatial,
        "channel",
        "out",
        stride=c["stride"],
        padding=c["padding"],
        dilation=c["dilation"],
        lhs_dilation=c["lhs_dilation"],
        groups=c["groups"],
    )


def _loss_program(cases, dtype=f32, channels_first=False, weights=None):
    """The sum over `cases` of sum(conv(x, k) * weights) (one program, one compile): its
    gradients in each x and k are that case's transposed and kernel-gradient convolutions of
    the cotangent `weights`."""
    layouts = [_types(c, dtype, channels_first) for c in cases]

    def loss(b, args):
        total = None
        for i, (c, (spatial, _)) in enumerate(zip(cases, layouts, strict=True)):
            y = _conv(c, args[2 * i], args[2 * i + 1], spatial)
            w = y if weights is None else b.constant(weights[i].astype(dtype.numpy), y.ty)
            term = (y * w).sum()
            total = term if total is None else total + term
        return total

    types = [t for _, pair in layouts for t in pair]
    program = accy.trace.define("loss", types, loss)
    return accy.value_and_grad(program, wrt=tuple(range(len(types))))


def _jax_conv(c, x, k, channels_first):
    """JAX's convolution of one case."""
    d = len(c["extents"])
    letters = "HWD"[:d]
    if channels_first:
        numbers = ("NC" + letters, "OI" + letters, "NC" + letters)
    else:
        numbers = ("N" + letters + "C", letters + "IO", "N" + letters + "C")
    per = lambda v: (v,) * d if isinstance(v, int) else tuple(v)  # noqa: E731
    extents = [(n - 1) * s + 1 for n, s in zip(c["extents"], per(c["lhs_dilation"]), strict=True)]
    padding = c["padding"] if isinstance(c["padding"], str) else list(c["padding"])
    pairs = padding_pairs(padding, extents, c["window"], per(c["stride"]), per(c["dilation"]))
    return lax.conv_general_dilated(
        x,
        k,
        per(c["stride"]),
        pairs,
        per(c["lhs_dilation"]),
        per(c["dilation"]),
        dimension_numbers=numbers,
        feature_group_count=c["groups"],
        precision=lax.Precision.HIGHEST,
    )


def _jax_losses(cases, args, weights, channels_first):
    """The summed loss and its gradients by JAX in float64 (one jit for every case)."""

    def loss(*args):
        terms = [
            (_jax_conv(c, args[2 * i], args[2 * i + 1], channels_first) * weights[i]).sum()
            for i, c in enumerate(cases)
        ]
        return sum(terms)

    with jax.enable_x64(True):  # for this computation only: other tests run JAX in f32
        value, grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))(*args)
    return float(value), [np.asarray(g) for g in grads]


def _kept_convs(program) -> list:
    """The convs the CPU plan runs whole (its tiled kernel), not composed."""
    return [s for s in build_plan(program).steps if s.kind == "conv"]


def _check(cases, dtype=f32, channels_first=False, seed=0, tolerance=2e-5, rtol=0.0):
    """Every case's loss and gradients against JAX's on the same (rounded) values, within
    `tolerance` of each output's largest magnitude and `rtol` of each element; the kept convs
    of the program."""
    rng = np.random.default_rng(seed)
    cases = dict(cases)
    rounded = lambda a: a.astype(dtype.numpy).astype(np.float64)  # noqa: E731
    weights = [
        rounded(rng.standard_normal(_forward_type(c, dtype, channels_first).extents))
        for c in cases.values()
    ]
    program = _loss_program(list(cases.values()), dtype, channels_first, weights)
    kept = _kept_convs(program)
    assert len(kept) == 3 * len(cases), [s.kind for s in build_plan(program).steps]
    args = [rounded(rng.standard_normal(t.extents)) for t in program.parameter_types]
    got = accy.compile(program, "cpu")(*(a.astype(dtype.numpy) for a in args))
    total, expected = _jax_losses(list(cases.values()), args, weights, channels_first)
    for i, name in enumerate(cases):
        for j, what in enumerate(("x", "kernel")):
            e = expected[2 * i + j]
            np.testing.assert_allclose(
                np.asarray(got[1 + 2 * i + j], np.float64),
                e,
                rtol=rtol,
                atol=tolerance * max(float(np.abs(e).max()), 1.0),
                err_msg=f"{name}: the gradient in {what}",
            )
    if dtype not in (bf16, f16):  # a 16-bit sum of terms that cancel: no relative bound
        np.testing.assert_allclose(float(got[0]), total, rtol=tolerance)
    return kept


def _forward_type(c, dtype, channels_first):
    spatial, types = _types(c, dtype, channels_first)
    program = accy.trace.define("forward", types, lambda b, a: _conv(c, a[0], a[1], spatial))
    return program.type_of(program.outputs[0])


@pytest.mark.slow
def test_conv_losses_and_gradients_match_jax():
    kept = _check(CASES)
    forms = [geometry(s.op).form for s in kept]
    # per case: forward and input gradient as rows, kernel gradient as columns
    assert sorted(forms) == sorted(["rows", "rows", "columns"] * len(CASES))


@pytest.mark.slow
def test_a_channels_first_layout_is_transposed_to_channels_last_and_back():
    _check(
        {"strided": CASES["strided"], "1-d": CASES["one-dimensional"]}, channels_first=True, seed=1
    )


def test_several_parts_of_several_tiles_match_jax():
    """Large enough that the tiles are shared out in parts (and the kernel gradient's partial
    sums are added): the values of a part count fixed by the shape."""
    c = _case((16, 16), (3, 3), channels=16, outputs=16, batch=8)
    kept = _check({"large": c}, seed=2, tolerance=1e-5)
    assert all(geometry(s.op).parts > 1 and geometry(s.op).tiles > 1 for s in kept)


@pytest.mark.slow
def test_float64_convs_run_in_dgemm():
    cases = {n: CASES[n] for n in ("strided-dilated-large-window", "input-dilated")}
    _check(cases, dtype=f64, seed=3, tolerance=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [f32, f64], ids=["f32", "f64"])
def test_without_a_blas_the_tiles_multiply_in_loops_or_micro_kernels(monkeypatch, dtype):
    """f64 multiplies in plain loops then; f32 in the AVX-512 micro-kernels where the compiler
    targets AVX-512, else in loops too."""
    from accy.backends.cpu import compile as cpu_compile

    monkeypatch.setattr(cpu_compile, "find_blas", lambda: None)
    c = _case((6, 7), (3, 3), channels=2, outputs=3, batch=3, stride=(1, 2))
    cases = {"strided": c, "three-dimensional": CASES["three-dimensional"]}
    _check(cases, dtype=dtype, seed=4, tolerance=2e-5 if dtype == f32 else 1e-12)


@pytest.mark.parametrize(
    "dtype, blas",
    [
        (f32, True),
        pytest.param(bf16, True, marks=pytest.mark.slow),
        pytest.param(bf16, False, marks=pytest.mark.slow),
    ],
    ids=["f32", "bf16", "bf16-no-blas"],
)
def test_without_avx512_the_tiles_multiply_in_blas_or_loops(monkeypatch, dtype, blas):
    """The path of a machine without AVX-512: the same C built with `-mno-avx512f`."""
    from accy.backends.cpu import compile as cpu_compile
    from accy.backends.cpu import toolchain

    monkeypatch.setattr(toolchain, "BASE_FLAGS", (*toolchain.BASE_FLAGS, "-mno-avx512f"))
    if not blas:
        monkeypatch.setattr(cpu_compile, "find_blas", lambda: None)
    c = _case((24, 24), (3, 2), channels=3, outputs=18, batch=2, stride=(2, 1))  # 2 tiles
    cases = {"strided": c, "input-dilated": CASES["input-dilated"], "grouped": CASES["grouped"]}
    rtol = 2.0**-8 if dtype == bf16 else 0.0
    # A seed of its own each: the programs (their constants) differ, so none is a cache hit.
    _check(cases, dtype=dtype, seed=6 if blas else 7, tolerance=2e-5, rtol=rtol)


@pytest.mark.parametrize(
    "dtype", [bf16, pytest.param(f16, marks=pytest.mark.slow)], ids=["bf16", "f16"]
)
@pytest.mark.slow
def test_half_precision_convs_sum_in_f32_and_round_once(dtype):
    """Each gradient element is an f32 sum of exact products of 16-bit values, rounded once
    (half an ulp: 2^-9 of bf16, 2^-12 of f16, relative)."""
    cases = {n: CASES[n] for n in ("strided", "input-dilated", "many-outputs", "grouped")}
    rtol = 2.0**-8 if dtype == bf16 else 2.0**-10
    _check(cases, dtype=dtype, seed=5, tolerance=1e-5, rtol=rtol)


def test_integer_convs_are_composed():
    integer = accy.trace.define(
        "i",
        [t.with_dtype(accy.i32) for t in (spec(f32, n=2, w=6, c=4), spec(f32, w=3, c=4, o=4))],
        lambda b, a: a[0].conv(a[1], ["w"], "c", "o"),
    )
    assert _kept_convs(integer) == []
    assert cpu_orders(integer.operations[-1]) is None


def _multi_axis_loss(dtype) -> accy.Program:
    """A conv whose roles span several axes each, interleaved: batch n and m, contracted c
    and d, outputs p and o; asymmetric padding, a stride and a kernel dilation."""
    types = [
        spec(dtype, n=2, h=7, c=2, m=3, w=6, d=3),
        spec(dtype, p=2, h=3, c=2, w=2, d=3, o=3),
    ]
    attrs = conv_attrs(["h", "w"], ["c", "d"], [2, 1], [(1, 0), (0, 1)], [1, 1], [1, 2])

    def loss(b, args):
        y = b.emit("conv", [args[0], args[1]], attrs)
        return (y * y).sum()

    return accy.value_and_grad(accy.trace.define("multi", types, loss), wrt=(0, 1))


def test_several_axes_per_role_are_merged_and_laid_out_back():
    """Against the reference evaluator in f64 (JAX's convolution has one axis per role)."""
    program = _multi_axis_loss(f32)
    assert len(_kept_convs(program)) == 3
    rng = np.random.default_rng(8)
    args = [rng.standard_normal(t.extents) for t in program.parameter_types]
    truth = accy.reference.run(_multi_axis_loss(f64), args)
    got = accy.compile(program, "cpu")(*(a.astype(np.float32) for a in args))
    for g, t in zip(got, truth, strict=True):
        scale = max(float(np.abs(t).max()), 1.0)
        np.testing.assert_allclose(np.asarray(g, np.float64), t, rtol=0, atol=2e-6 * scale)


@pytest.mark.slow
def test_the_kernel_can_be_switched_off_for_the_composition(configure):
    c = _case((6, 5), (3, 3), channels=2, outputs=3, batch=1, stride=(1, 2))
    weights = [np.ones(_forward_type(c, f32, False).extents)]
    assert len(_kept_convs(_loss_program([c], weights=weights))) == 3
    configure(cpu_conv=False)
    program = _loss_program([c], weights=weights)
    assert _kept_convs(program) == [] and build_plan(program).program.count("conv") == 0
    rng = np.random.default_rng(9)
    args = [rng.standard_normal(t.extents) for t in program.parameter_types]
    got = accy.compile(program, "cpu")(*(a.astype(np.float32) for a in args))
    _, expected = _jax_losses([c], args, weights, False)
    for g, e in zip(got[1:], expected, strict=True):
        np.testing.assert_allclose(
            np.asarray(g, np.float64), e, rtol=0, atol=2e-5 * np.abs(e).max()
        )
