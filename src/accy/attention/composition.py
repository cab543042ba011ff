"""Attention as a composition: scores, softmax, weighted sum. The oracle of every kernel.

Each function exists twice, written once for traced values through an emitter `e`
(`accy.core.operations.OpsApi`: the records' fallbacks, JVP rule and bias gradient) and once in
NumPy on arrays laid out as the signature says (the records' reference implementations, in
float64). Both materialise the scores {batch..., query, key}: that is what the kernels avoid.

Gradients (S the scaled, biased, masked scores, P = exp(S - lse) the softmax, O = P V):
dP = dO Vᵀ, delta = rowsum(dO ∘ O) - dlse, dS = P ∘ (dP - delta), dQ = scale dS K,
dK = scale dSᵀ Q, dV = Pᵀ dO, dbias = dS summed over the axes the bias lacks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.types import TensorType, i32
from .signature import Shape, Signature

# -- traced -----------------------------------------------------------------------------------


def scores(e: Any, s: Signature, shape: Shape, q: Any, k: Any, bias: Any = None) -> Any:
    """S = scale q·k over dim (+ bias), -inf after the diagonal when causal:
    {batch (the query's order)..., query, key}, in the accumulation dtype."""
    acc = shape.accumulation
    q, k = e.convert(q, acc), e.convert(k, acc)
    result = e.contract(q, k, s.dim_axis)
    scale = shape_scale(s, shape)
    if scale != 1.0:  # a multiply by one would still be an operation, and a pass over the scores
        result = e.mul(result, scale)
    if bias is not None:
        result = e.add(result, e.convert(bias, acc))
    if s.causal:
        result = e.select(causal_mask(e, s, shape), result, float("-inf"))
    return result


def shape_scale(s: Signature, shape: Shape) -> float:
    return s.scale_for(shape.dim)


def causal_mask(e: Any, s: Signature, shape: Shape) -> Any:
    """True where key position <= query position: {query, key}."""
    t = TensorType(i32, ((s.query_axis, shape.tokens), (s.key_axis, shape.keys)))
    return e.compare("ge", e.iota(t, s.query_axis), e.iota(t, s.key_axis))


def softmax_parts(e: Any, s: Signature, shape: Shape, q, k, v, bias=None) -> tuple[Any, Any]:
    """(output {batch..., query, dim}, a function giving the logsumexp {batch..., query})."""
    logits = scores(e, s, shape, q, k, bias)
    peak = e.unary("stop_gradient", e.reduce_max(logits, s.key_axis))
    weights = e.unary("exp", e.sub(logits, peak))
    total = e.sum(weights, s.key_axis)
    out = e.contract(e.div(weights, total), e.convert(v, shape.accumulation), s.key_axis)
    return out, lambda: e.add(e.unary("log", total), peak)


def forward(e: Any, s: Signature, shape: Shape, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
    """The forward record's packed result: [output | logsumexp] along the dim axis."""
    out, lse = softmax_parts(e, s, shape, q, k, v, bias)
    return pack(e, s, out, lse())


def pack(e: Any, s: Signature, out: Any, rows: Any) -> Any:
    """[out | rows] along the dim axis (rows {batch..., query} gains a dim axis of extent 1)."""
    column = e.broadcast_to(
        rows, TensorType(rows.ty.dtype, (*rows.ty.named_extents, (s.dim_axis, 1)))
    )
    return e.concatenate([out, column], s.dim_axis)


def unpack(e: Any, s: Signature, shape: Shape, packed: Any) -> tuple[Any, Any]:
    """(output {batch..., query, dim}, logsumexp {batch..., query}) of a packed result."""
    out = e.slice(packed, s.dim_axis, 0, shape.dim)
    rows = e.slice(packed, s.dim_axis, shape.dim, shape.dim + 1)
    return out, e.sum(rows, s.dim_axis)


def probabilities(e: Any, s: Signature, shape: Shape, q, k, bias, lse) -> Any:
    """P = exp(S - lse), from the forward's logsumexp (no second softmax)."""
    return e.unary("exp", e.sub(scores(e, s, shape, q, k, bias), lse))


def score_gradient(e: Any, s: Signature, shape: Shape, operands: list, packed, dpacked) -> Any:
    """dS = P ∘ (dP - delta), {batch..., query, key}, and P."""
    q, k, v, bias = (*operands, None)[:4]
    out, lse = unpack(e, s, shape, packed)
    dout, dlse = unpack(e, s, shape, dpacked)
    p = probabilities(e, s, shape, q, k, bias, lse)
    dp = e.contract(dout, e.convert(v, shape.accumulation), s.dim_axis)
    delta = e.sub(e.sum(e.mul(dout, out), s.dim_axis), dlse)
    return e.mul(p, e.sub(dp, delta)), p


def backward(e: Any, s: Signature, shape: Shape, operands: list, packed, dpacked) -> Any:
    """The backward record's result {batch..., query: tokens + keys, dim: 2 dim}: rows
    [0, tokens) hold dQ in their first `dim` entries (zeros after), the rows after hold
    [dK | dV] (see `signature.backward_type`)."""
    acc, scale = shape.accumulation, shape_scale(s, shape)
    ds, p = score_gradient(e, s, shape, operands, packed, dpacked)
    q, k = e.convert(operands[0], acc), e.convert(operands[1], acc)
    dout, _ = unpack(e, s, shape, dpacked)
    dq = e.mul(e.contract(ds, k, s.key_axis), scale)
    dk = e.mul(e.contract(ds, q, s.query_axis), scale)
    dv = e.contract(p, dout, s.query_axis)
    dkv = e.rename(e.concatenate([dk, dv], s.dim_axis), s.key_axis, s.query_axis)
    return e.concatenate([e.pad(dq, s.dim_axis, 0, shape.dim), dkv], s.query_axis)


def bias_gradient(e: Any, s: Signature, shape: Shape, operands: list, packed, dpacked) -> Any:
    """dbias: dS summed over the axes the bias lacks, in the bias's layout and dtype."""
    bias = operands[3]
    ds, _ = score_gradient(e, s, shape, operands, packed, dpacked)
    lacking = tuple(a for a in ds.ty.axes if not bias.ty.has(a))
    summed = e.sum(ds, lacking) if lacking else ds
    return e.convert(e.transpose(summed, bias.ty.axes), bias.ty.dtype)


# -- NumPy ------------------------------------------------------------------------------------


def _letters(s: Signature) -> dict[str, str]:
    names = dict.fromkeys((*s.query, *s.key, *s.value, *(s.bias or ())))
    return {name: chr(ord("a") + i) for i, name in enumerate(names)}


def _spec(letters: dict[str, str], axes) -> str:
    return "".join(letters[a] for a in axes)


def numpy_parts(s: Signature, q, k, v, bias=None):
    """(letters, batch+query+key subscripts, S, P, lse) in float64, from arrays in the
    signature's layouts."""
    letters = _letters(s)
    batch = _spec(letters, s.batch_axes)
    qa, ka, da = letters[s.query_axis], letters[s.key_axis], letters[s.dim_axis]
    sc = f"{batch}{qa}{ka}"
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    dim = q.shape[s.query.index(s.dim_axis)]
    logits = np.einsum(f"{_spec(letters, s.query)},{_spec(letters, s.key)}->{sc}", q, k)
    logits = logits * s.scale_for(dim)
    if bias is not None:
        target = tuple(s.batch_axes) + (s.query_axis, s.key_axis)
        logits = logits + _broadcast(np.asarray(bias, np.float64), s.bias, target)
    if s.causal:
        tokens = logits.shape[-1]
        logits = np.where(np.tril(np.ones((tokens, tokens), bool)), logits, -np.inf)
    peak = logits.max(-1, keepdims=True)
    weights = np.exp(logits - peak)
    total = weights.sum(-1, keepdims=True)
    lse = (np.log(total) + peak)[..., 0]
    return letters, sc, logits, weights / total, lse, da


def _broadcast(array: np.ndarray, axes, target) -> np.ndarray:
    """`array` (axes `axes`) laid out in `target`'s order, with extent 1 where it lacks one."""
    present = [a for a in target if a in axes]
    moved = np.transpose(array, [axes.index(a) for a in present])
    return moved.reshape([array.shape[axes.index(a)] if a in axes else 1 for a in target])


def numpy_forward(s: Signature, q, k, v, bias=None) -> np.ndarray:
    """The forward record's packed result, in float64."""
    letters, sc, _, p, lse, da = numpy_parts(s, q, k, v, bias)
    out = np.einsum(f"{sc},{_spec(letters, s.value)}->{sc[:-1]}{da}", p, np.asarray(v, np.float64))
    return np.concatenate([out, lse[..., None]], -1)


def numpy_score_gradient(s: Signature, operands, packed, dpacked):
    letters, sc, _, p, _, da = numpy_parts(s, *operands)
    packed, dpacked = np.asarray(packed, np.float64), np.asarray(dpacked, np.float64)
    out, dout, dlse = packed[..., :-1], dpacked[..., :-1], dpacked[..., -1]
    v = np.asarray(operands[2], np.float64)
    dp = np.einsum(f"{sc[:-1]}{da},{_spec(letters, s.value)}->{sc}", dout, v)
    delta = (dout * out).sum(-1) - dlse
    return letters, sc, da, p * (dp - delta[..., None]), p, dout


def numpy_backward_query(s: Signature, *arrays) -> np.ndarray:
    operands, packed, dpacked = arrays[:-2], arrays[-2], arrays[-1]
    letters, sc, da, ds, _, _ = numpy_score_gradient(s, operands, packed, dpacked)
    k = np.asarray(operands[1], np.float64)
    dim = k.shape[s.key.index(s.dim_axis)]
    return np.einsum(f"{sc},{_spec(letters, s.key)}->{sc[:-1]}{da}", ds, k) * s.scale_for(dim)


def numpy_backward(s: Signature, *arrays) -> np.ndarray:
    """The backward record's result (see `backward`), in float64."""
    dq = numpy_backward_query(s, *arrays)
    dq = np.concatenate([dq, np.zeros_like(dq)], -1)
    return np.concatenate([dq, numpy_backward_key_value(s, *arrays)], -2)


def numpy_backward_key_value(s: Signature, *arrays) -> np.ndarray:
    operands, packed, dpacked = arrays[:-2], arrays[-2], arrays[-1]
    letters, sc, da, ds, p, dout = numpy_score_gradient(s, operands, packed, dpacked)
    q = np.asarray(operands[0], np.float64)
    dim = q.shape[s.query.index(s.dim_axis)]
    out_spec = f"{sc[:-2]}{sc[-1]}{da}"
    dk = np.einsum(f"{sc},{_spec(letters, s.query)}->{out_spec}", ds, q) * s.scale_for(dim)
    dv = np.einsum(f"{sc},{sc[:-1]}{da}->{out_spec}", p, dout)
    return np.concatenate([dk, dv], -1)
