"""Grouped-query attention (`nn.attention(..., group_axes=...)`): against the key and value
broadcast along the group axes (the same values and derivatives, on the reference evaluator
and the CPU), the backward's reference against the broadcast one, and its errors."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bf16, f32
from accy.attention import composition
from accy.attention.grouped import GroupedSignature, backward_type, numpy_backward

Q = ("batch", "token", "head", "group", "dim")
K = ("batch", "key", "head", "dim")
EXTENTS = {"batch": 2, "token": 5, "key": 5, "head": 2, "group": 3, "dim": 4}


def _spec(dtype, axes):
    return accy.spec(dtype, {a: EXTENTS[a] for a in axes})


def _loss(grouped, causal):
    def body(b, args):
        q, k, v = args
        if grouped:
            out = accy.nn.attention(q, k, v, causal=causal, group_axes="group")
        else:
            wide = accy.TensorType(k.ty.dtype, tuple((a, EXTENTS[a]) for a in Q if a != "token"))
            wide = accy.TensorType(k.ty.dtype, (("batch", 2), ("key", 5), *wide.named_extents[1:]))
            out = accy.nn.attention(q, k.broadcast_to(wide), v.broadcast_to(wide), causal=causal)
        weights = np.linspace(-1, 1, out.ty.size).reshape(out.ty.extents).astype(np.float32)
        w = b.constant(weights, accy.spec(f32, dict(out.ty.named_extents)))
        return (out.convert(f32) * w).sum(tuple(out.ty.axes))

    return body


def _inputs(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [
        rng.normal(size=_spec(dtype, a).extents).astype(np.float32).astype(dtype.numpy)
        for a in (Q, K, K)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [f32, bf16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grouped_records_compute_what_the_broadcast_did(dtype, causal):
    """value_and_grad with the grouped records equals, bit for bit, the key and value
    broadcast along the group axis (their fallback is that), on the reference and the CPU."""
    specs = [_spec(dtype, a) for a in (Q, K, K)]
    xs = _inputs(dtype)
    results = {}
    for grouped in (True, False):
        program = accy.trace.define("p", specs, _loss(grouped, causal))
        if grouped:
            targets = [op.attrs.get("target", "") for op in program.operations]
            assert any(t.startswith("accy.nn.attention.grouped_forward[") for t in targets)
        gradient = accy.value_and_grad(program, wrt=(0, 1, 2))
        reference = [np.asarray(r) for r in accy.reference.run(gradient, xs)]
        cpu = [np.asarray(r) for r in accy.compile(gradient, device="cpu")(*xs)]
        results[grouped] = reference, cpu
    for got, expected in zip(results[True], results[False], strict=True):
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape and g.dtype == e.dtype and np.array_equal(g, e)


def test_forward_mode_matches_the_broadcast():
    specs = [_spec(f32, a) for a in (Q, K, K)]
    xs, ts = _inputs(f32, 1), _inputs(f32, 2)
    results = []
    for grouped in (True, False):
        program = accy.trace.define("p", specs, _loss(grouped, True))
        results.append(
            [np.asarray(r) for r in accy.reference.run(accy.jvp(program, wrt=(0, 1, 2)), xs + ts)]
        )
    for g, e in zip(*results, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_the_backward_reference_sums_the_broadcast_gradients_over_the_group():
    """dQ, dK and dV one after another in each batch entry's block; dK and dV the broadcast
    operands' gradients summed over the group axis (NumPy, independently of the records)."""
    s = GroupedSignature(Q, K, K, ("group",), causal=True)
    q, k, v = _inputs(f32, 3)
    wide = (np.broadcast_to(x[:, :, :, None], (2, 5, 2, 3, 4)) for x in (k, v))
    bk, bv = (np.ascontiguousarray(x) for x in wide)
    packed = composition.numpy_forward(s.split, q, bk, bv)
    dpacked = np.random.default_rng(4).normal(size=packed.shape).astype(np.float32)
    result = numpy_backward(s, q, k, v, packed, dpacked)
    types = [_spec(f32, a) for a in (Q, K, K)]
    assert result.shape == backward_type(s, *types).extents == (2, (30 + 10 + 10) * 4)
    rows = composition.numpy_backward(s.split, q, bk, bv, packed, dpacked)  # (b, h, g, t, d)
    dq = np.transpose(rows[:, :, :, :5], (0, 3, 1, 2, 4))
    dk, dv = (np.transpose(rows[:, :, :, a : a + 5].sum(2), (0, 2, 1, 3)) for a in (5, 10))
    per_batch = [x.reshape(2, -1) for x in (dq, dk, dv)]
    np.testing.assert_allclose(result, np.concatenate(per_batch, axis=1), rtol=1e-6, atol=1e-6)


def test_a_bias_broadcasts_the_key_and_value():
    """With a bias the grouped call is the broadcast one (the composition's records)."""
    specs = [_spec(f32, a) for a in (Q, K, K)] + [accy.spec(f32, token=5, key=5)]

    def body(b, args):
        return accy.nn.attention(*args[:3], bias=args[3], group_axes=("group",))

    program = accy.trace.define("p", specs, body)
    kinds = [op.kind for op in program.operations]
    assert kinds.count("broadcast_in_dim") >= 2
    assert not any("grouped" in op.attrs.get("target", "") for op in program.operations)


@pytest.mark.parametrize(
    "groups, key_axes, why",
    [
        (("grp",), K, "group axis 'grp' must be a batch axis of the query"),
        (("dim",), K, "group axis 'dim' must be a batch axis"),
        (("group",), ("batch", "key", "head", "group", "dim"), "has the group axis 'group'"),
        (("head",), K, "has the group axis 'head'"),
    ],
)
def test_bad_group_axes_say_what_is_wrong(groups, key_axes, why):
    specs = [_spec(f32, Q), _spec(f32, key_axes), _spec(f32, key_axes)]
    with pytest.raises(accy.AccyError, match=why):
        accy.trace.define("p", specs, lambda b, a: accy.nn.attention(*a, group_axes=groups))


def test_the_key_axes_get_the_groups_where_the_query_has_them():
    s = GroupedSignature(
        ("head", "group", "batch", "token", "dim"), ("head", "batch", "key", "dim"), K, ("group",)
    )
    assert s.broadcast_axes(("head", "batch", "key", "dim")) == (
        "head",
        "group",
        "batch",
        "key",
        "dim",
    )
    assert s.broadcast_axes(("batch", "key", "dim")) == ("group", "batch", "key", "dim")
