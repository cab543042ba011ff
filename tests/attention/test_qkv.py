"""`nn.attention_qkv`: self-attention over one stacked q/k/v operand, against `nn.attention` on
the three slices (the same values and derivatives, on the reference evaluator and the CPU),
against NumPy written independently, and its errors."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bf16, f32
from accy.attention.qkv import QkvSignature, numpy_backward, qkv_records_for
from accy.errors import AxisError

EXTENTS = {"batch": 2, "token": 5, "part": 3, "head": 2, "dim": 4}
LAYOUTS = [("batch", "token", "part", "head", "dim"), ("part", "head", "batch", "token", "dim")]


def _weighted(b, out):
    """A weighted sum of the attention's output (a scalar whose gradient reaches every entry)."""
    w = np.linspace(-1, 1, out.ty.size).reshape(out.ty.extents).astype(np.float32)
    return (out.convert(f32) * b.constant(w, accy.spec(f32, dict(out.ty.named_extents)))).sum(
        tuple(out.ty.axes)
    )


def _stacked(causal, implementation):
    def body(b, args):
        out = accy.nn.attention_qkv(args[0], causal=causal, implementation=implementation)
        return _weighted(b, out.transpose("batch", "head", "token", "dim"))

    return body


def _sliced(causal, implementation):
    """What a caller wrote before `attention_qkv`: three slices, then `nn.attention`."""

    def body(b, args):
        q, k, v = (args[0].slice("part", j, j + 1, 1).sum("part") for j in range(3))
        k, v = k.rename("token", "key"), v.rename("token", "key")
        out = accy.nn.attention(q, k, v, causal=causal, implementation=implementation)
        return _weighted(b, out.transpose("batch", "head", "token", "dim"))

    return body


def _input(spec, seed=0):
    x = np.random.default_rng(seed).normal(size=spec.extents).astype(np.float32)
    return x.astype(spec.dtype.numpy)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=["btphd", "phbtd"])
@pytest.mark.parametrize("dtype", [f32, bf16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("implementation", ["fused", None])
def test_the_stacked_records_compute_what_the_slices_did(layout, dtype, causal, implementation):
    """value_and_grad over the stacked records equals, bit for bit, the slices and
    `nn.attention` (their fallback is exactly that), on the reference evaluator and the CPU."""
    spec = accy.spec(dtype, {a: EXTENTS[a] for a in layout})
    x = _input(spec)
    results = {}
    for name, body in (("stacked", _stacked), ("sliced", _sliced)):
        program = accy.trace.define(name, [spec], body(causal, implementation))
        gradient = accy.value_and_grad(program, wrt=(0,))
        reference = [np.asarray(r) for r in accy.reference.run(gradient, [x])]
        cpu = [np.asarray(r) for r in accy.compile(gradient, device="cpu")(x)]
        results[name] = reference, cpu
    for got, expected in zip(results["stacked"], results["sliced"], strict=True):
        for g, e in zip(got, expected, strict=True):
            assert g.dtype == e.dtype and np.array_equal(g, e)
    target = "accy.nn.attention.qkv_forward"
    program = accy.trace.define("stacked", [spec], _stacked(causal, implementation))
    assert any(op.attrs.get("target", "").startswith(target) for op in program.operations)


def test_values_and_the_gradient_against_numpy():
    """Forward and d(qkv) against NumPy written here (softmax over the keys, its gradient),
    in f64 on the reference evaluator."""
    layout = LAYOUTS[0]
    spec = accy.spec(accy.f64, {a: EXTENTS[a] for a in layout})
    x = np.random.default_rng(1).normal(size=spec.extents)
    w = np.linspace(-1, 1, 2 * 2 * 5 * 4).reshape(2, 2, 5, 4)  # (batch, head, token, dim)

    def body(b, args):
        out = accy.nn.attention_qkv(args[0], causal=True, implementation="fused")
        out = out.transpose("batch", "head", "token", "dim")
        return (out * b.constant(w, out.ty)).sum(tuple(out.ty.axes))

    program = accy.value_and_grad(accy.trace.define("p", [spec], body), wrt=(0,))
    value, grad = (np.asarray(r) for r in accy.reference.run(program, [x]))
    q, k, v = (np.transpose(x[:, :, j], (0, 2, 1, 3)) for j in range(3))  # (b, h, t, d)
    s = np.einsum("bhtd,bhkd->bhtk", q, k) / 2.0  # 1 / sqrt(dim 4)
    s = np.where(np.tril(np.ones((5, 5), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert value == pytest.approx(float((np.einsum("bhtk,bhkd->bhtd", p, v) * w).sum()))
    dp = np.einsum("bhtd,bhkd->bhtk", w, v)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / 2.0
    expected = [
        np.einsum("bhtk,bhkd->bhtd", ds, k),
        np.einsum("bhtk,bhtd->bhkd", ds, q),
        np.einsum("bhtk,bhtd->bhkd", p, w),
    ]
    for j, e in enumerate(expected):
        np.testing.assert_allclose(grad[:, :, j], np.transpose(e, (0, 2, 1, 3)), atol=1e-12)


def test_forward_mode_matches_the_slices():
    """The JVP rule (the split records' rule on the tangent's slices) against the slices'."""
    spec = accy.spec(f32, {a: EXTENTS[a] for a in LAYOUTS[0]})
    x, t = _input(spec, 2), _input(spec, 3)
    results = []
    for body in (_stacked(True, "fused"), _sliced(True, "fused")):
        program = accy.trace.define("p", [spec], body)
        results.append([np.asarray(r) for r in accy.reference.run(accy.jvp(program), [x, t])])
    for g, e in zip(*results, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_the_backward_reference_is_the_split_one_laid_out_as_qkv():
    from accy.attention import composition

    s = QkvSignature(LAYOUTS[1], causal=True)
    spec = accy.spec(f32, {a: EXTENTS[a] for a in LAYOUTS[1]})
    x = _input(spec, 4)
    packed = composition.numpy_forward(s.split, *(np.take(x, j, axis=0) for j in range(3)))
    dpacked = np.random.default_rng(5).normal(size=packed.shape).astype(np.float32)
    grads = numpy_backward(s, x, packed, dpacked)
    assert grads.shape == x.shape
    split = [np.take(x, j, axis=0) for j in range(3)]
    rows = composition.numpy_backward(s.split, *split, packed, dpacked)
    # The split records' rows: (head, batch, token: [dQ; dK; dV], dim).
    for j in range(3):
        np.testing.assert_array_equal(grads[j], rows[:, :, 5 * j : 5 * (j + 1)])
    assert qkv_records_for(s).backward.target.startswith("accy.nn.attention.qkv_backward[")


@pytest.mark.parametrize(
    "extents, options, why",
    [
        ({"token": 4, "dim": 2}, {}, "has no part axis 'part'"),
        ({"token": 4, "part": 2, "dim": 2}, {}, "has extent 2; it must hold query, key and value"),
        ({"token": 4, "part": 3, "key": 4, "dim": 2}, {}, "must not have the key axis 'key'"),
        ({"token": 4, "part": 3, "dim": 2}, {"part_axis": "dim"}, "extent 2"),
        ({"token": 4, "part": 3, "dim": 2}, {"implementation": "flash"}, "implementation must"),
    ],
)
def test_bad_operands_say_what_is_wrong(extents, options, why):
    spec = accy.spec(f32, extents)
    with pytest.raises(accy.AccyError, match=why):
        accy.trace.define("p", [spec], lambda b, a: accy.nn.attention_qkv(a[0], **options))


def test_the_part_axis_may_not_be_a_role():
    spec = accy.spec(f32, token=3, part=3, dim=3)
    with pytest.raises(AxisError, match="must be none of the query, key and dim axes"):
        accy.trace.define("p", [spec], lambda b, a: accy.nn.attention_qkv(a[0], part_axis="dim"))
