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

from ..core.types import TensorType, bf16, f16, i32
from .signature import LSE_SLOTS_16, Shape, Signature, is_16_bit, lse_slots

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
    if s.causal:  # the mask broadcast to the scores' layout: a select takes its first
        # operand's axis order, and the softmax's passes and the products after it read the
        # scores row by row only in their own {batch..., query, key} order
        mask = e.broadcast_to(causal_mask(e, s, shape), result.ty)
        result = e.select(mask, result, float("-inf"))
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
    """The forward record's packed result: [output | logsumexp] along the dim axis, in the
    operands' dtype (see `signature.packed_type`)."""
    out, lse = softmax_parts(e, s, shape, q, k, v, bias)
    return pack(e, s, shape, out, lse())


def pack(e: Any, s: Signature, shape: Shape, out: Any, rows: Any, tangent: bool = False) -> Any:
    """[out | rows] along the dim axis, in the operands' dtype (rows {batch..., query} gains a
    dim axis). In bf16/f16 the rows take `lse_slots` entries: [hi | lo | zeros] with hi the rows
    rounded and lo the rest rounded; a `tangent` (the JVP rule's d lse) goes into hi alone, as
    a cotangent is read from hi alone (`unpack`), lo being a rounding error of hi."""
    dtype = shape.dtype
    column = e.broadcast_to(
        rows, TensorType(rows.ty.dtype, (*rows.ty.named_extents, (s.dim_axis, 1)))
    )
    if not is_16_bit(dtype):
        return e.concatenate([e.convert(out, dtype), e.convert(column, dtype)], s.dim_axis)
    high = e.convert(column, dtype)
    low = e.sub(column, e.convert(high, column.ty.dtype))
    parts = [e.convert(out, dtype), high] + ([] if tangent else [e.convert(low, dtype)])
    return e.pad(e.concatenate(parts, s.dim_axis), s.dim_axis, 0, lse_slots(dtype) - len(parts) + 1)


def unpack(e: Any, s: Signature, shape: Shape, packed: Any, cotangent: bool = False):
    """(output {batch..., query, dim}, logsumexp {batch..., query}) of a packed result, in the
    accumulation dtype. The logsumexp is hi + lo in bf16/f16; of a `cotangent` (of a packed
    result), hi's entry alone (see `pack`)."""
    acc = shape.accumulation
    out = e.convert(e.slice(packed, s.dim_axis, 0, shape.dim), acc)
    parts = 2 if is_16_bit(shape.dtype) and not cotangent else 1
    rows = e.convert(e.slice(packed, s.dim_axis, shape.dim, shape.dim + parts), acc)
    return out, e.sum(rows, s.dim_axis)


def probabilities(e: Any, s: Signature, shape: Shape, q, k, bias, lse) -> Any:
    """P = exp(S - lse), from the forward's logsumexp (no second softmax)."""
    return e.unary("exp", e.sub(scores(e, s, shape, q, k, bias), lse))


def score_gradient(e: Any, s: Signature, shape: Shape, operands: list, packed, dpacked) -> Any:
    """dS = P ∘ (dP - delta), {batch..., query, key}, and P."""
    q, k, v, bias = (*operands, None)[:4]
    out, lse = unpack(e, s, shape, packed)
    dout, dlse = unpack(e, s, shape, dpacked, cotangent=True)
    p = probabilities(e, s, shape, q, k, bias, lse)
    dp = e.contract(dout, e.convert(v, shape.accumulation), s.dim_axis)
    delta = e.sub(e.sum(e.mul(dout, out), s.dim_axis), dlse)
    return e.mul(p, e.sub(dp, delta)), p


def backward(e: Any, s: Signature, shape: Shape, operands: list, packed, dpacked) -> Any:
    """The backward record's result {batch..., query: tokens + 2 keys, dim}: rows [dQ; dK; dV]
    in the operands' dtype (see `signature.backward_type`)."""
    acc, scale = shape.accumulation, shape_scale(s, shape)
    ds, p = score_gradient(e, s, shape, operands, packed, dpacked)
    q, k = e.convert(operands[0], acc), e.convert(operands[1], acc)
    dout, _ = unpack(e, s, shape, dpacked, cotangent=True)
    dq = e.mul(e.contract(ds, k, s.key_axis), scale)
    dk = e.mul(e.contract(ds, q, s.query_axis), scale)
    dv = e.contract(p, dout, s.query_axis)
    rows = [dq] + [e.rename(x, s.key_axis, s.query_axis) for x in (dk, dv)]
    order = (*s.batch_axes, s.query_axis, s.dim_axis)
    rows = [
        e.convert(x if x.ty.axes == order else e.transpose(x, order), shape.dtype) for x in rows
    ]
    return e.concatenate(rows, s.query_axis)


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


def _dim(s: Signature, q) -> int:
    return np.shape(q)[s.query.index(s.dim_axis)]


def _rounded(array: np.ndarray, like) -> np.ndarray:
    """`array` in the dtype of the operand `like` where that is 16-bit (the records' results
    are), else as it is (float64)."""
    dtype = np.asarray(like).dtype
    return array.astype(dtype) if dtype in (bf16.numpy, f16.numpy) else array


def numpy_forward(s: Signature, q, k, v, bias=None) -> np.ndarray:
    """The forward record's packed result: float64 for f32/f64 operands; for bf16/f16 ones,
    rounded to their dtype with the logsumexp as [hi | lo | zeros] (see `pack`)."""
    letters, sc, _, p, lse, da = numpy_parts(s, q, k, v, bias)
    out = np.einsum(f"{sc},{_spec(letters, s.value)}->{sc[:-1]}{da}", p, np.asarray(v, np.float64))
    dtype = np.asarray(q).dtype
    if dtype not in (bf16.numpy, f16.numpy):
        return np.concatenate([out, lse[..., None]], -1)
    high = lse.astype(dtype)
    low = (lse - high.astype(np.float64)).astype(dtype)
    zeros = np.zeros((*lse.shape, LSE_SLOTS_16 - 2), dtype)
    return np.concatenate([out.astype(dtype), high[..., None], low[..., None], zeros], -1)


def numpy_unpack(s: Signature, packed, dim: int, cotangent: bool = False):
    """(output, logsumexp) of a packed result in float64: hi + lo in bf16/f16, hi alone of a
    cotangent (see `unpack`)."""
    dtype = np.asarray(packed).dtype
    packed = np.asarray(packed, np.float64)
    parts = 2 if dtype in (bf16.numpy, f16.numpy) and not cotangent else 1
    return packed[..., :dim], packed[..., dim : dim + parts].sum(-1)


def numpy_score_gradient(s: Signature, operands, packed, dpacked):
    letters, sc, _, p, _, da = numpy_parts(s, *operands)
    dim = _dim(s, operands[0])
    out, _ = numpy_unpack(s, packed, dim)
    dout, dlse = numpy_unpack(s, dpacked, dim, cotangent=True)
    v = np.asarray(operands[2], np.float64)
    dp = np.einsum(f"{sc[:-1]}{da},{_spec(letters, s.value)}->{sc}", dout, v)
    delta = (dout * out).sum(-1) - dlse
    return letters, sc, da, p * (dp - delta[..., None]), p, dout


def numpy_backward(s: Signature, *arrays) -> np.ndarray:
    """The backward record's result (see `backward`): rows [dQ; dK; dV], float64 for f32/f64
    operands, rounded to the operands' dtype for bf16/f16."""
    operands, packed, dpacked = arrays[:-2], arrays[-2], arrays[-1]
    letters, sc, da, ds, p, dout = numpy_score_gradient(s, operands, packed, dpacked)
    q, k = (np.asarray(x, np.float64) for x in operands[:2])
    scale = s.scale_for(_dim(s, q))
    dq = np.einsum(f"{sc},{_spec(letters, s.key)}->{sc[:-1]}{da}", ds, k) * scale
    key_rows = f"{sc[:-2]}{sc[-1]}{da}"
    dk = np.einsum(f"{sc},{_spec(letters, s.query)}->{key_rows}", ds, q) * scale
    dv = np.einsum(f"{sc},{sc[:-1]}{da}->{key_rows}", p, dout)
    return _rounded(np.concatenate([dq, dk, dv], -2), operands[0])
