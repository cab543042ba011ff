"""The custom-call records of attention: forward and backward.

Both come from `records_for(signature)`, declared once here with `accy.CustomCall`:

- `forward(q, k, v[, bias])` -> [output | logsumexp] in the operands' dtype
  (`signature.packed_type`; in bf16/f16 the logsumexp is two 16-bit entries, hi + lo):
  reference the NumPy composition, kernels on CPU (`cpu.py`) and CUDA (`cuda.py`: cuDNN for
  bf16/f16; `flash_cuda.py`: f32), a JVP rule that reuses the forward's logsumexp, a VJP rule
  that calls the backward record, and the traced composition as fallback;
- `backward(q, k, v[, bias], packed, dpacked)` -> rows [dQ; dK; dV] in one result, in the
  operands' dtype (`signature.backward_type`): the backward kernel, taking the output
  cotangent `dpacked` = [dO | dlse], the output and the logsumexp `packed`. Its fallback is
  the composition's gradient formulas, so second derivatives go through the composition.

The bias gradient is the composition's (`composition.bias_gradient`), which materialises the
scores; without a bias nothing of size tokens x keys is ever built. Both records map over the
batch axes (`mapped_axes`), so `accy.shard` runs them on each device's batch entries.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..custom import CustomCall, register
from . import composition as c
from . import cpu, cuda, flash_cuda
from .signature import Signature, backward_type, check, packed_type


@dataclass(frozen=True)
class Records:
    """The two records of one signature."""

    forward: CustomCall
    backward: CustomCall

    def register(self) -> Records:
        """Register both (a no-op for those already registered)."""
        for record in (self.forward, self.backward):
            register(record)
        return self


def cpu_declines(operand_types, result_type) -> None:
    """The CPU kernel function of records whose fallbacks call `nn.attention`'s records (the
    stacked and grouped ones): none, so that those records' CPU kernels run."""
    return None


def _shape(s: Signature, operands) -> Any:
    return check(s, *(x.ty for x in operands))


def _cuda_kernel(s: Signature, part: str):
    """CUDA's kernel of record `part`: cuDNN's where it takes the call, else the f32 kernels'
    (both return None for what they decline: the composition runs)."""
    cudnn, flash = cuda.kernel_factory(s, part), flash_cuda.kernel_factory(s, part)

    def factory(operand_types, result_type):
        return cudnn(operand_types, result_type) or flash(operand_types, result_type)

    return factory


def _like(e: Any, x: Any, operand: Any) -> Any:
    """`x` in `operand`'s layout and dtype (the cotangent of `operand`)."""
    if x.ty.axes != operand.ty.axes:
        x = e.transpose(x, operand.ty.axes)
    return e.convert(x, operand.ty.dtype)


@functools.cache  # not a cache: one registered record per signature for the process's life
def records_for(s: Signature) -> Records:
    """The records of signature `s` (made once per signature, registered by the caller).

    >>> from accy.attention.signature import Signature
    >>> r = records_for(Signature(("token", "dim"), ("key", "dim"), ("key", "dim")))
    >>> r.forward.target
    'accy.nn.attention.forward[q=token,dim;k=key,dim;v=key,dim;scale=default]'
    >>> sorted(r.forward.kernels)
    ['cpu_object', 'cuda_ptx']
    """
    count = 3 if s.bias is None else 4

    def backward_fallback(*args):
        operands = list(args[:count])
        return c.backward(args[0].builder, s, _shape(s, operands), operands, args[-2], args[-1])

    backward = CustomCall(
        s.target("backward"),
        result_type=lambda *types: backward_type(s, check(s, *types[:count])),
        reference=lambda *arrays: c.numpy_backward(s, *arrays),
        fallback=backward_fallback,
        kernels={
            "cpu": cpu.kernel_factory(s, "backward"),
            "cuda": _cuda_kernel(s, "backward"),
        },
        mapped_axes=s.batch_axes,  # each batch entry's attention is its own: shardable
        register=False,
    )

    def vjp(e, primals, result, cotangent):
        shape = _shape(s, primals)
        grads = backward.call(e, *primals, result, cotangent)
        t, keys = shape.tokens, shape.keys
        dq = e.slice(grads, s.query_axis, 0, t)
        dk, dv = (
            e.rename(e.slice(grads, s.query_axis, start, start + keys), s.query_axis, s.key_axis)
            for start in (t, t + keys)
        )
        cotangents = [_like(e, dq, primals[0]), _like(e, dk, primals[1]), _like(e, dv, primals[2])]
        if count == 4:
            cotangents.append(c.bias_gradient(e, s, shape, primals, result, cotangent))
        return cotangents

    def jvp(e, primals, tangents, result):
        # dS = scale (dq k + q dk) + dbias; dP = P (dS - rowsum(P dS)); dO = dP V + P dV, and
        # d lse = rowsum(P dS). P comes from the forward's logsumexp, not a second softmax.
        shape = _shape(s, primals)
        acc = shape.accumulation
        q, k, v = (e.convert(x, acc) for x in primals[:3])
        tq, tk, tv = (e.convert(x, acc) for x in tangents[:3])
        out, lse = c.unpack(e, s, shape, result)
        bias = primals[3] if count == 4 else None
        p = c.probabilities(e, s, shape, q, k, bias, lse)
        ds = e.add(e.contract(tq, k, s.dim_axis), e.contract(q, tk, s.dim_axis))
        ds = e.mul(ds, s.scale_for(shape.dim))
        if count == 4:
            ds = e.add(ds, e.convert(tangents[3], acc))
        pds = e.mul(p, ds)
        dlse = e.sum(pds, s.key_axis)
        dout = e.sub(e.contract(pds, v, s.key_axis), e.mul(out, dlse))
        dout = e.add(dout, e.contract(p, tv, s.key_axis))
        return c.pack(e, s, shape, dout, dlse, tangent=True)

    def forward_fallback(*args):
        return c.forward(args[0].builder, s, _shape(s, args), *args)

    forward = CustomCall(
        s.target("forward"),
        result_type=lambda *types: packed_type(s, check(s, *types)),
        reference=lambda *arrays: c.numpy_forward(s, *arrays),
        jvp=jvp,
        vjp=vjp,
        fallback=forward_fallback,
        kernels={
            "cpu": cpu.kernel_factory(s, "forward"),
            "cuda": _cuda_kernel(s, "forward"),
        },
        mapped_axes=s.batch_axes,  # each batch entry's attention is its own: shardable
        register=False,
    )
    return Records(forward, backward)
