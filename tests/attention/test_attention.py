"""`accy.nn.attention`: values and derivatives against NumPy and finite differences, on the
reference evaluator and the CPU, over axis orders, causal masks and biases; its errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import accy
from accy import f32, f64
from accy.errors import AxisError, DTypeError, TypeRuleError

from .programs import output_and_lse_loss

BATCH, HEADS, TOKENS, DIM = 2, 2, 5, 3


def numpy_attention(q, k, v, causal=False, scale=None, bias=None):
    """Attention on arrays laid out (batch, head, token|key, dim), written independently."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhtd,bhkd->bhtk", q, k) * scale
    if bias is not None:
        s = s + bias
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhtk,bhkd->bhtd", p / p.sum(-1, keepdims=True), v)


CANONICAL = {
    "q": ("batch", "head", "token", "dim"),
    "k": ("batch", "head", "key", "dim"),
}
LAYOUTS = [
    (
        ("batch", "head", "token", "dim"),
        ("batch", "head", "key", "dim"),
        ("batch", "head", "key", "dim"),
    ),
    (
        ("token", "head", "dim", "batch"),
        ("dim", "key", "batch", "head"),
        ("head", "key", "batch", "dim"),
    ),
]
EXTENTS = {"batch": BATCH, "head": HEADS, "token": TOKENS, "key": TOKENS, "dim": DIM}


def program(dtype, layouts, *, causal=False, scale=None, bias_axes=None, loss=False):
    """attention over operands laid out as `layouts` (q, k, v[, bias]); its output is laid out
    (batch, head, token, dim), or, with `loss`, a weighted sum of it (a scalar)."""
    axes = list(layouts) + ([bias_axes] if bias_axes else [])
    specs = [accy.spec(dtype, {a: EXTENTS[a] for a in names}) for names in axes]

    def body(b, args):
        bias = args[3] if bias_axes else None
        out = accy.nn.attention(*args[:3], causal=causal, scale=scale, bias=bias)
        out = out.transpose("batch", "head", "token", "dim")
        if loss:
            weights = b.constant(np.linspace(-1, 1, out.ty.size).reshape(out.ty.extents), out.ty)
            return (out * weights).sum(("batch", "head", "token", "dim"))
        return out

    return accy.trace.define("attend", specs, body)


def arrays(layouts, bias_axes=None, dtype=np.float64, seed=0):
    """Random operands in `layouts`, and the same in the canonical layout for NumPy."""
    rng = np.random.default_rng(seed)
    canonical = [
        rng.normal(size=[EXTENTS[a] for a in CANONICAL["q" if i == 0 else "k"]]) for i in range(3)
    ]
    laid = [
        np.transpose(x, [CANONICAL["q" if i == 0 else "k"].index(a) for a in names]).astype(dtype)
        for i, (x, names) in enumerate(zip(canonical, layouts, strict=True))
    ]
    bias = None
    if bias_axes:
        full = ("batch", "head", "token", "key")
        kept = [a for a in full if a in bias_axes]
        small = rng.normal(size=[EXTENTS[a] for a in kept])
        laid.append(np.transpose(small, [kept.index(a) for a in bias_axes]).astype(dtype))
        bias = small.reshape([EXTENTS[a] if a in bias_axes else 1 for a in full])
    return laid, canonical, bias


CASES = [
    pytest.param(
        layouts,
        causal,
        bias_axes,
        id=f"layout{i}-{'causal' if causal else 'full'}-bias{bias_axes and len(bias_axes)}",
    )
    for (i, layouts), causal, bias_axes in itertools.product(
        enumerate(LAYOUTS), (False, True), (None, ("key", "head", "token"))
    )
]


@pytest.mark.slow
@pytest.mark.parametrize("device", ["reference", "cpu"])
@pytest.mark.parametrize("layouts, causal, bias_axes", CASES)
def test_forward_matches_numpy(device, layouts, causal, bias_axes):
    p = program(f64, layouts, causal=causal, bias_axes=bias_axes)
    laid, canonical, bias = arrays(layouts, bias_axes)
    (out,) = accy.compile(p, device=device)(*laid)
    expected = numpy_attention(*canonical, causal=causal, bias=bias)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("layouts, causal, bias_axes", CASES)
def test_gradients_match_finite_differences(layouts, causal, bias_axes):
    p = program(f64, layouts, causal=causal, bias_axes=bias_axes, loss=True)
    laid, _, _ = arrays(layouts, bias_axes)
    wrt = tuple(range(len(laid)))
    accy.testing.check_grads(p, laid, wrt=wrt, order=2, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("layouts, causal, bias_axes", CASES)
def test_cpu_gradients_match_reference(layouts, causal, bias_axes):
    p = program(f64, layouts, causal=causal, bias_axes=bias_axes, loss=True)
    laid, _, _ = arrays(layouts, bias_axes, seed=1)
    gradient = accy.value_and_grad(p, wrt=tuple(range(len(laid))))
    expected = accy.reference.run(gradient, laid)
    got = accy.compile(gradient, device="cpu")(*laid)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_gradient_uses_the_backward_kernel_not_the_scores():
    """Without a bias, the gradient program holds no tensor of tokens x keys elements."""
    p = program(f32, LAYOUTS[0], causal=True, loss=True)
    gradient = accy.grad(p, wrt=(0, 1, 2))
    targets = [
        op.attrs["target"].split("[")[0] for op in gradient.operations if op.kind == "custom_call"
    ]
    assert targets == ["accy.nn.attention.forward", "accy.nn.attention.backward"]
    assert not [op for op in gradient.operations if op.type.has("token") and op.type.has("key")]


@pytest.mark.slow
def test_f32_cpu_matches_numpy_on_blocks_with_tails():
    """More tokens than one block (64) with a partial last block, causal, f32."""
    tokens, dim = 150, 16
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, 1, tokens, dim)).astype(np.float32) for _ in range(3))
    specs = [accy.spec(f32, batch=1, head=1, token=tokens, dim=dim)] * 3

    def body(b, a):
        return accy.nn.attention(
            a[0], a[1].rename("token", "key"), a[2].rename("token", "key"), causal=True
        )

    p = accy.trace.define("long", specs, body)
    (out,) = accy.compile(p, device="cpu")(q, k, v)
    np.testing.assert_allclose(out, numpy_attention(q, k, v, causal=True), rtol=2e-5, atol=2e-6)


def test_scale_and_unequal_extents():
    q = accy.named(np.ones((2, 3)), ("token", "dim"), device="reference")
    k = accy.named(np.arange(12.0).reshape(4, 3) / 10, ("key", "dim"), device="reference")
    out = accy.nn.attention(q, k, k, scale=0.5)
    expected = numpy_attention(
        q.array[None, None], k.array[None, None], k.array[None, None], scale=0.5
    )
    np.testing.assert_allclose(out.array, expected[0, 0], rtol=1e-12)


def _trace(specs, **options):
    return accy.trace.define("bad", specs, lambda b, a: accy.nn.attention(*a, **options))


def test_errors_are_clear():
    q = accy.spec(f32, token=4, dim=2)
    k = accy.spec(f32, key=4, dim=2)
    with pytest.raises(AxisError, match="the key .* has no axis 'key'"):
        _trace([q, q, q])
    with pytest.raises(AxisError, match="has no axis 'token'"):
        _trace([k, k, k])
    with pytest.raises(AxisError, match="axis 'dim' has extent 2 on the query .* 3 on the key"):
        _trace([q, accy.spec(f32, key=4, dim=3), k])
    with pytest.raises(AxisError, match="axis 'key' has extent 4 on the key .* 5 on the value"):
        _trace([q, k, accy.spec(f32, key=5, dim=2)])
    with pytest.raises(AxisError, match="causal=True .* equal extents"):
        _trace([q, accy.spec(f32, key=5, dim=2)] * 1 + [accy.spec(f32, key=5, dim=2)], causal=True)
    with pytest.raises(AxisError, match="shared \\(batch\\) axes"):
        _trace([accy.spec(f32, head=2, token=4, dim=2), k, k])
    with pytest.raises(DTypeError, match="one dtype"):
        _trace([q, accy.spec(f64, key=4, dim=2), k])
    with pytest.raises(AxisError, match="bias .* has axis 'dim'"):
        _trace([q, k, k, accy.spec(f32, dim=2)], bias=None) if False else accy.trace.define(
            "bad",
            [q, k, k, accy.spec(f32, dim=2)],
            lambda b, a: accy.nn.attention(*a[:3], bias=a[3]),
        )
    with pytest.raises(TypeRuleError, match="causal must be True or False"):
        _trace([q, k, k], causal=1)
    with pytest.raises(AxisError, match="three different axes"):
        _trace([q, k, k], key_axis="dim")


# -- 16-bit records: results in the operands' dtype ---------------------------------------------

HALF_TOLERANCE = {"bf16": 2e-2, "f16": 3e-3}  # of the largest expected magnitude


def _half_close(got, expected, dtype, what):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    tolerance = HALF_TOLERANCE[dtype.name] * max(float(np.max(np.abs(expected))), 1e-3)
    error = float(np.max(np.abs(got - expected)))
    assert error <= tolerance, f"{what}: max error {error:.3g} above {tolerance:.3g}"


def test_16_bit_records_have_16_bit_results():
    from accy.attention.signature import Signature, backward_type, check, packed_type

    s = Signature(CANONICAL["q"], CANONICAL["k"], CANONICAL["k"])
    for dtype, slots in ((accy.bf16, 8), (accy.f16, 8), (f32, 1), (f64, 1)):
        q = accy.spec(dtype, {a: EXTENTS[a] for a in CANONICAL["q"]})
        k = accy.spec(dtype, {a: EXTENTS[a] for a in CANONICAL["k"]})
        shape = check(s, q, k, k)
        packed, grads = packed_type(s, shape), backward_type(s, shape)
        assert packed.dtype == grads.dtype == dtype
        assert packed.extent("dim") == DIM + slots and packed.extent("token") == TOKENS
        assert grads.extent("token") == 3 * TOKENS and grads.extent("dim") == DIM


def _half_operands(specs, dtype, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=t.extents).astype(np.float32).astype(dtype.numpy) for t in specs]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [accy.bf16, accy.f16], ids=lambda d: d.name)
@pytest.mark.parametrize("causal, bias_axes", [(True, None), (False, ("key", "head", "token"))])
def test_16_bit_forward_record_rounds_like_the_reference(dtype, causal, bias_axes):
    """The forward record's result on the CPU and on the reference evaluator: the output within
    one rounding of the f64 output, the logsumexp hi + lo within about 2^-15 of it, zeros
    after, in the operands' dtype."""
    from accy.attention.records import records_for
    from accy.attention.signature import Signature

    layouts = LAYOUTS[1]
    s = Signature(*layouts, bias=bias_axes, causal=causal)
    axes = list(layouts) + ([bias_axes] if bias_axes else [])
    specs = [accy.spec(dtype, {a: EXTENTS[a] for a in names}) for names in axes]
    record = records_for(s).register().forward
    p = accy.trace.define("packed", specs, lambda b, a: record.call(b, *a))
    exact_specs = [t.with_dtype(f64) for t in specs]
    exact_program = accy.trace.define("packed", exact_specs, lambda b, a: record.call(b, *a))
    inputs = _half_operands(specs, dtype, seed=5)
    (exact,) = accy.reference.run(exact_program, [x.astype(np.float64) for x in inputs])
    exact = np.asarray(exact)  # f64: [O | lse]
    for device in ("reference", "cpu"):
        (got,) = accy.compile(p, device=device)(*inputs)
        assert np.asarray(got).dtype == dtype.numpy, device
        got = np.asarray(got, np.float64)
        _half_close(got[..., :DIM], exact[..., :DIM], dtype, f"{device} output")
        lse = got[..., DIM] + got[..., DIM + 1]
        np.testing.assert_allclose(lse, exact[..., DIM], rtol=2**-15, atol=1e-6)
        assert not np.any(got[..., DIM + 2 :]), device


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [accy.bf16, accy.f16], ids=lambda d: d.name)
@pytest.mark.parametrize("causal, bias_axes", [(True, None), (False, ("key", "head", "token"))])
def test_16_bit_gradients_match_the_f64_composition(dtype, causal, bias_axes):
    """value_and_grad in bf16/f16 on the reference evaluator (the records' NumPy references)
    and the CPU kernels, against the same program in f64 on the same rounded inputs."""
    layouts = LAYOUTS[1]
    p = program(dtype, layouts, causal=causal, bias_axes=bias_axes, loss=True)
    exact_program = program(f64, layouts, causal=causal, bias_axes=bias_axes, loss=True)
    wrt = tuple(range(len(p.parameter_types)))
    inputs = _half_operands(p.parameter_types, dtype, seed=6)
    expected = accy.reference.run(
        accy.value_and_grad(exact_program, wrt=wrt), [x.astype(np.float64) for x in inputs]
    )
    gradient = accy.value_and_grad(p, wrt=wrt)
    for device in ("reference", "cpu"):
        got = accy.compile(gradient, device=device)(*inputs)
        for name, g, e in zip(["loss", "dq", "dk", "dv", "dbias"], got, expected, strict=False):
            _half_close(g, e, dtype, f"{device} {name}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [accy.bf16, accy.f16], ids=lambda d: d.name)
def test_16_bit_backward_takes_a_cotangent_of_the_logsumexp(dtype):
    """A loss over the forward record's output and its logsumexp (hi + lo): the backward
    record gets a nonzero dlse (the hi entry of its cotangent), on the reference evaluator and
    the CPU kernel alike."""
    from accy.attention.signature import Signature

    layouts = LAYOUTS[0]
    s = Signature(*layouts, causal=True)

    def make(dt):
        specs = [accy.spec(dt, {a: EXTENTS[a] for a in names}) for names in layouts]
        return output_and_lse_loss(s, specs), specs

    gradient, specs = make(dtype)
    inputs = _half_operands(specs, dtype, seed=7)
    exact, _ = make(f64)
    expected = accy.reference.run(exact, [x.astype(np.float64) for x in inputs])
    for device in ("reference", "cpu"):
        got = accy.compile(gradient, device=device)(*inputs)
        for name, g, e in zip(["loss", "dq", "dk", "dv"], got, expected, strict=True):
            _half_close(g, e, dtype, f"{device} {name}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [accy.bf16, accy.f16], ids=lambda d: d.name)
def test_16_bit_forward_mode_matches_the_f64_composition(dtype):
    """accy.jvp in bf16/f16 (the JVP rule's tangent packed into the 16-bit result: d lse in
    hi), on the reference evaluator and the CPU, against the f64 program's."""
    p = program(dtype, LAYOUTS[1], causal=True)
    exact_program = program(f64, LAYOUTS[1], causal=True)
    tangents = accy.jvp(p, wrt=(0, 1, 2))
    inputs = _half_operands(tangents.parameter_types, dtype, seed=10)
    expected = accy.reference.run(
        accy.jvp(exact_program, wrt=(0, 1, 2)), [x.astype(np.float64) for x in inputs]
    )
    for device in ("reference", "cpu"):
        got = accy.compile(tangents, device=device)(*inputs)
        for name, g, e in zip(["output", "tangent"], got, expected, strict=True):
            _half_close(g, e, dtype, f"{device} {name}")
