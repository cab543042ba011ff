"""Self-attention over one projected tensor: `nn.attention_qkv(qkv, part_axis=...)`.

A transformer's query, key and value usually come out of one projection GEMM as a single
tensor {..., token, part: 3, head, dim}. Taking q, k and v out of it (three slices) and putting
their gradients back into it (a concatenation) are copies of the whole projection each; cuDNN
reads q, k and v in place by strides and writes dQ, dK and dV straight into d(qkv), so the
records here take the projection itself:

- `forward(qkv)` -> [output | logsumexp], the same result as `nn.attention`'s forward record
  (`signature.packed_type` of the split signature);
- `backward(qkv, packed, dpacked)` -> d(qkv), in the operand's own layout.

Where no kernel takes them (the CPU, f32, a layout cuDNN cannot read) their fallbacks slice q,
k and v out and call `nn.attention`'s records (`records.py`), so those programs compute what
the three slices and `nn.attention` did, value for value. With a bias, or where
`nn.attention` would record the composition, `nn.attention_qkv` (`accy.attention`) is exactly
that composition of slices and `nn.attention`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.types import TensorType
from ..custom import CustomCall
from ..errors import AxisError
from . import composition as c
from . import cuda
from .records import Records, cpu_declines, records_for
from .signature import Shape, Signature, check, packed_type

PARTS = 3  # query, key, value, in this order along the part axis


@dataclass(frozen=True)
class QkvSignature:
    """One self-attention call over a stacked operand: its axes in layout order, which axis
    stacks query, key and value (entries 0, 1, 2), and `nn.attention`'s roles and options.
    The key axis is the query axis renamed (self-attention: as many keys as tokens).

    >>> s = QkvSignature(("batch", "token", "part", "head", "dim"), "part", causal=True)
    >>> s.split.query, s.split.key
    (('batch', 'token', 'head', 'dim'), ('batch', 'key', 'head', 'dim'))
    >>> s.target("forward")
    'accy.nn.attention.qkv_forward[qkv=batch,token,part,head,dim;part=part;causal;scale=default]'
    """

    qkv: tuple[str, ...]
    part_axis: str = "part"
    query_axis: str = "token"
    key_axis: str = "key"
    dim_axis: str = "dim"
    causal: bool = False
    scale: float | None = None

    @property
    def split(self) -> Signature:
        """The signature of `nn.attention` on the three entries (q, k and v apart)."""
        query = tuple(a for a in self.qkv if a != self.part_axis)
        key = tuple(self.key_axis if a == self.query_axis else a for a in query)
        return Signature(
            query,
            key,
            key,
            None,
            self.query_axis,
            self.key_axis,
            self.dim_axis,
            self.causal,
            self.scale,
        )

    def target(self, part: str) -> str:
        """The custom-call target of the record `part` ("forward" or "backward")."""
        fields = [f"qkv={','.join(self.qkv)}", f"part={self.part_axis}"]
        return f"accy.nn.attention.qkv_{part}[{';'.join(fields + self.split.option_fields())}]"

    def split_types(self, qkv: TensorType) -> tuple[TensorType, TensorType, TensorType]:
        """The types of q, k and v: `qkv`'s without the part axis, the key's query axis
        renamed to the key axis."""
        named = [(a, e) for a, e in qkv.named_extents if a != self.part_axis]
        q = TensorType(qkv.dtype, tuple(named))
        renamed = tuple((self.key_axis if a == self.query_axis else a, e) for a, e in named)
        k = TensorType(qkv.dtype, renamed)
        return q, k, k


def check_qkv(s: QkvSignature, qkv: TensorType) -> Shape:
    """Check the stacked operand (the part axis of extent 3, no key axis); its extents, or
    a clear error.

    >>> from accy import spec, bf16
    >>> s = QkvSignature(("token", "part", "dim"), "part")
    >>> check_qkv(s, spec(bf16, token=4, part=3, dim=8)).tokens
    4
    >>> check_qkv(s, spec(bf16, token=4, part=2, dim=8))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    accy.errors.AxisError: nn.attention_qkv: the part axis 'part' of ... has extent 2; ...
    """
    if not qkv.has(s.part_axis):
        raise AxisError(
            f"nn.attention_qkv: the operand {qkv} has no part axis {s.part_axis!r}; it stacks "
            "query, key and value along that axis (name it with part_axis=)"
        )
    if qkv.extent(s.part_axis) != PARTS:
        raise AxisError(
            f"nn.attention_qkv: the part axis {s.part_axis!r} of {qkv} has extent "
            f"{qkv.extent(s.part_axis)}; it must hold query, key and value (extent 3)"
        )
    if s.part_axis in (s.query_axis, s.key_axis, s.dim_axis) or qkv.has(s.key_axis):
        raise AxisError(
            f"nn.attention_qkv: the operand {qkv} must not have the key axis {s.key_axis!r} "
            f"(the keys are its {s.query_axis!r} positions), and the part axis "
            f"{s.part_axis!r} must be none of the query, key and dim axes"
        )
    return check(s.split, *s.split_types(qkv))


def split_operand(e: Any, s: QkvSignature, qkv: Any) -> list[Any]:
    """q, k and v taken out of `qkv` (traced), the key's and value's query axis renamed."""
    parts = [e.sum(e.slice(qkv, s.part_axis, j, j + 1), s.part_axis) for j in range(PARTS)]
    return [parts[0]] + [e.rename(x, s.query_axis, s.key_axis) for x in parts[1:]]


def _gradient_into_qkv(e: Any, s: QkvSignature, shape: Shape, grads: Any, qkv: Any) -> Any:
    """`nn.attention`'s backward result (rows [dQ; dK; dV]) as d(qkv), in `qkv`'s layout."""
    t, keys = shape.tokens, shape.keys
    query_axes = s.split.query
    entries = []
    for start, stop in ((0, t), (t, t + keys), (t + keys, t + 2 * keys)):
        rows = e.transpose(e.slice(grads, s.query_axis, start, stop), query_axes)
        one = tuple((a, 1 if a == s.part_axis else n) for a, n in qkv.ty.named_extents)
        entries.append(e.reshape(rows, one))
    return e.concatenate(entries, s.part_axis)


def numpy_split(s: QkvSignature, qkv: np.ndarray) -> list[np.ndarray]:
    """q, k and v of a stacked array (NumPy), each in the split signature's layout."""
    at = s.qkv.index(s.part_axis)
    return [np.take(qkv, j, axis=at) for j in range(PARTS)]


def numpy_backward(s: QkvSignature, qkv: np.ndarray, packed, dpacked) -> np.ndarray:
    """The backward record's reference: `nn.attention`'s, its rows laid out as `qkv`."""
    q, k, v = numpy_split(s, qkv)
    grads = c.numpy_backward(s.split, q, k, v, packed, dpacked)
    t = q.shape[s.split.query.index(s.query_axis)]  # keys: as many
    grad_axes = (*s.split.batch_axes, s.query_axis, s.dim_axis)  # `signature.backward_type`
    order = [grad_axes.index(a) for a in s.split.query]
    at = grad_axes.index(s.query_axis)
    entries = []
    for start in (0, t, 2 * t):
        rows = np.take(grads, np.arange(start, start + t), axis=at)
        entries.append(np.transpose(rows, order))
    return np.stack(entries, axis=s.qkv.index(s.part_axis))


def _checked(s: QkvSignature, qkv: TensorType) -> TensorType:
    """The backward's result type: d(qkv), laid out as `qkv` (checked first)."""
    check_qkv(s, qkv)
    return qkv


@functools.cache  # not a cache: one registered record per signature for the process's life
def qkv_records_for(s: QkvSignature) -> Records:
    """The records of stacked signature `s` (made once per signature, registered by the
    caller; `nn.attention`'s records of `s.split` are registered with them).

    >>> r = qkv_records_for(QkvSignature(("token", "part", "dim")))
    >>> r.backward.target
    'accy.nn.attention.qkv_backward[qkv=token,part,dim;part=part;scale=default]'
    """
    apart = records_for(s.split)

    def backward_fallback(qkv, packed, dpacked):
        e = qkv.builder
        shape = check_qkv(s, qkv.ty)
        grads = apart.register().backward.call(e, *split_operand(e, s, qkv), packed, dpacked)
        return _gradient_into_qkv(e, s, shape, grads, qkv)

    backward = CustomCall(
        s.target("backward"),
        result_type=lambda qkv, packed, dpacked: _checked(s, qkv),
        reference=lambda qkv, packed, dpacked: numpy_backward(s, qkv, packed, dpacked),
        fallback=backward_fallback,
        kernels={"cpu": cpu_declines, "cuda": cuda.kernel_factory(s, "backward")},
        mapped_axes=s.split.batch_axes,
        register=False,
    )

    def vjp(e, primals, result, cotangent):
        return [backward.call(e, primals[0], result, cotangent)]

    def jvp(e, primals, tangents, result):
        split_primals = split_operand(e, s, primals[0])
        split_tangents = split_operand(e, s, tangents[0])
        return apart.register().forward.jvp(e, split_primals, split_tangents, result)

    def forward_fallback(qkv):
        return apart.register().forward.call(qkv.builder, *split_operand(qkv.builder, s, qkv))

    forward = CustomCall(
        s.target("forward"),
        result_type=lambda qkv: packed_type(s.split, check_qkv(s, qkv)),
        reference=lambda qkv: c.numpy_forward(s.split, *numpy_split(s, qkv)),
        jvp=jvp,
        vjp=vjp,
        fallback=forward_fallback,
        kernels={"cpu": cpu_declines, "cuda": cuda.kernel_factory(s, "forward")},
        mapped_axes=s.split.batch_axes,
        register=False,
    )
    return Records(forward, backward)


__all__ = ["QkvSignature", "check_qkv", "qkv_records_for", "split_operand"]
