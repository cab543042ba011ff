"""Fused attention: `accy.nn.attention`, a custom call with its own kernels and gradient.

`attention(query, key, value)` is softmax(scale q·kᵀ + bias, masked) v over named axes. It is
declared once as custom-call records (`records.py`): type rule (`signature.py`), the
composition as reference and fallback (`composition.py`), a flash-attention kernel on the CPU
(`cpu.py`), cuDNN's fused attention on CUDA for bf16/f16 inside the program's CUDA graph
(`cuda.py`), accy's own FlashAttention kernels there for f32 (`flash_cuda.py`; the composition
where both decline), and JVP and VJP rules built on the forward's logsumexp and a backward
kernel.
"""

from __future__ import annotations

from typing import Any

from . import composition
from . import qkv as qkv_module
from . import signature as signature_module
from .grouped import GroupedSignature, check_grouped, grouped_records_for
from .records import records_for
from .signature import Shape, Signature, check, reject_options


def attention(
    query: Any,
    key: Any,
    value: Any,
    *,
    query_axis: str = "token",
    key_axis: str = "key",
    dim_axis: str = "dim",
    causal: bool = False,
    scale: float | None = None,
    bias: Any = None,
    implementation: str | None = None,
    group_axes: str | tuple[str, ...] = (),
) -> Any:
    """softmax(scale · query·key over `dim_axis` + bias) · value over `key_axis`, fused.

    `query` has axes {..., query_axis, dim_axis}, `key` and `value` {..., key_axis, dim_axis};
    every other axis (batch, head, ...) is shared by name and is a batch axis, in any layout.
    The result is {..., query_axis, dim_axis} (the shared axes in the query's order), in the
    query's dtype. `causal` masks the keys after each query position (equal extents needed);
    `scale` defaults to 1/sqrt(dim extent); `bias` is added to the scores and may have any of
    the scores' axes (the shared ones, `query_axis`, `key_axis`), in any order.

    `implementation` chooses how it is recorded: "composition" (scores, softmax, weighted sum,
    differentiated as written), "fused" (the custom call), or None (the default): the
    composition up to `FUSED_MIN_SCORES` scores per batch entry in bf16/f16 and up to
    `FULL_PRECISION_FUSED_MIN_SCORES` in f32/f64 (on two CPU cores the composition is faster
    there; on a GPU, pass "fused"), the custom call above. The custom call runs, on the CPU, a
    blocked online-softmax kernel (FlashAttention-2) whose extra memory is O(block²), not
    O(tokens × keys); on CUDA cuDNN's fused attention in bf16/f16 and FlashAttention kernels
    of accy's own in f32, inside the program's CUDA graph (what they decline runs as the
    composition, recomputing the probabilities in the backward pass); on the reference
    evaluator the NumPy composition. Reverse mode uses the backward kernel (and the
    composition for a bias's gradient), forward mode a JVP rule on the forward's logsumexp;
    derivatives of second and higher order go through the composition (the backward record's
    fallback).

    `group_axes` (grouped-query attention): batch axes of the query that `key` and `value`
    lack, each key/value entry shared by all the query's entries along them (as if broadcast
    along them). On CUDA, cuDNN reads the keys and values as they are (fewer key/value heads)
    and gives their gradients per key/value head; elsewhere they are broadcast.

    >>> import accy, numpy as np
    >>> spec = accy.spec(accy.f32, token=3, dim=2)
    >>> def f(b, a):
    ...     q, k, v = a
    ...     return accy.nn.attention(q, k.rename("token", "key"), v.rename("token", "key"),
    ...                              causal=True)
    >>> p = accy.trace.define("attend", [spec] * 3, f)
    >>> v = np.arange(6, dtype=np.float32).reshape(3, 2)
    >>> accy.reference.run(p, [np.zeros((3, 2), np.float32)] * 2 + [v])[0].tolist()
    [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]
    """
    reject_options(causal, scale, implementation)
    groups = (group_axes,) if isinstance(group_axes, str) else tuple(group_axes)
    if groups:
        grouped = GroupedSignature(
            query.ty.axes,
            key.ty.axes,
            value.ty.axes,
            groups,
            query_axis,
            key_axis,
            dim_axis,
            causal,
            None if scale is None else float(scale),
        )
        shape = check_grouped(grouped, query.ty, key.ty, value.ty)
        if bias is None and not _composed(implementation, shape):
            records = grouped_records_for(grouped).register()
            packed = records.forward.call(query.builder, query, key, value)
            out = query.builder.slice(packed, dim_axis, 0, shape.dim)
            return query.builder.convert(out, query.ty.dtype)
        key, value = (
            query.builder.broadcast_to(x, grouped.broadcast_type(x.ty, query.ty))
            for x in (key, value)
        )
    signature = Signature(
        query.ty.axes,
        key.ty.axes,
        value.ty.axes,
        None if bias is None else bias.ty.axes,
        query_axis,
        key_axis,
        dim_axis,
        causal,
        None if scale is None else float(scale),
    )
    types = [query.ty, key.ty, value.ty] + ([] if bias is None else [bias.ty])
    shape = check(signature, *types)
    operands = [query, key, value] + ([] if bias is None else [bias])
    builder = query.builder
    if _composed(implementation, shape):
        out, _ = composition.softmax_parts(builder, signature, shape, *operands)
    else:
        packed = records_for(signature).register().forward.call(builder, *operands)
        out = builder.slice(packed, dim_axis, 0, shape.dim)  # the last entry is the logsumexp
    return builder.convert(out, query.ty.dtype)


def _composed(implementation: str | None, shape: Shape) -> bool:
    """Whether `nn.attention` records the composition itself (see `implementation`)."""
    return implementation == "composition" or (
        implementation is None
        and signature_module.records_composition(shape.tokens * shape.keys, shape.dtype)
    )


def attention_qkv(
    qkv: Any,
    *,
    part_axis: str = "part",
    query_axis: str = "token",
    key_axis: str = "key",
    dim_axis: str = "dim",
    causal: bool = False,
    scale: float | None = None,
    bias: Any = None,
    implementation: str | None = None,
) -> Any:
    """Self-attention of the query, key and value stacked in `qkv` (entries 0, 1, 2 of
    `part_axis`): `nn.attention(q, k, v)` with k and v's `query_axis` renamed `key_axis`,
    the same options and result ({..., query_axis, dim_axis}, the other axes in `qkv`'s
    order). On CUDA, cuDNN reads q, k and v in place and writes their gradients into the
    gradient of `qkv` directly (no slices, no concatenation).

    >>> import accy, numpy as np
    >>> spec = accy.spec(accy.f32, token=3, part=3, dim=2)
    >>> p = accy.trace.define("attend", [spec], lambda b, a: accy.nn.attention_qkv(a[0]))
    >>> x = np.zeros((3, 3, 2), np.float32); x[:, 2] = np.arange(6).reshape(3, 2)
    >>> accy.reference.run(p, [x])[0].tolist()
    [[2.0, 3.0], [2.0, 3.0], [2.0, 3.0]]
    """
    reject_options(causal, scale, implementation)
    s = qkv_module.QkvSignature(
        qkv.ty.axes,
        part_axis,
        query_axis,
        key_axis,
        dim_axis,
        causal,
        None if scale is None else float(scale),
    )
    shape = qkv_module.check_qkv(s, qkv.ty)
    if _composed(implementation, shape) or bias is not None:
        options = dict(query_axis=query_axis, key_axis=key_axis, dim_axis=dim_axis)
        q, k, v = qkv_module.split_operand(qkv.builder, s, qkv)
        return attention(
            q, k, v, **options, causal=causal, scale=scale, bias=bias, implementation=implementation
        )
    builder = qkv.builder
    packed = qkv_module.qkv_records_for(s).register().forward.call(builder, qkv)
    out = builder.slice(packed, dim_axis, 0, shape.dim)  # the last entries are the logsumexp
    return builder.convert(out, qkv.ty.dtype)


__all__ = ["attention", "attention_qkv"]
