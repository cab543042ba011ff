"""Neural-network building blocks as compositions of the closed set of kinds.

Nothing here is a new operation kind: each function records ordinary operations, so
differentiation and every backend handle it without special rules. The functions take traced
values and `accy.NamedArray`s alike (on a NamedArray they run eagerly):

>>> import accy, numpy as np
>>> x = accy.named(np.array([0.0, 0.0], np.float32), ("vocab",), device="reference")
>>> accy.nn.softmax(x, "vocab").array.tolist()
[0.5, 0.5]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import optree

from .. import random
from ..attention import attention, attention_qkv
from ..core.builder import Value
from ..core.types import DType, TensorType, bf16, bool_, f16, f32, i32
from ..errors import AccyError, AxisError, DTypeError
from .fp8 import OPERAND_DTYPES, Fp8Policy

__all__ = [
    "MixedPrecision",
    "attention",
    "attention_qkv",
    "avg_pool",
    "causal_mask",
    "cross_entropy",
    "dropout",
    "gelu",
    "gelu_tanh",
    "layer_norm",
    "log_softmax",
    "logaddexp",
    "logsumexp",
    "max_pool",
    "mish",
    "mixed_precision",
    "one_hot",
    "pick",
    "relu",
    "rms_norm",
    "silu",
    "softmax",
    "softplus",
    "stop_gradient",
]


def stop_gradient(x: Value) -> Value:
    """`x`, but differentiation treats it as a constant (its derivative is zero).

    Softmax and logsumexp use it on the max they subtract: the result does not depend on that
    shift, so differentiating through it would only add work.

    >>> import accy, numpy as np
    >>> f = lambda x: (x * accy.nn.stop_gradient(x)).sum()
    >>> accy.grad(f)(accy.named(np.array([1.0, 3.0], np.float32), "n")).array.tolist()
    [1.0, 3.0]
    """
    return x.builder.unary("stop_gradient", x)


def relu(x: Value) -> Value:
    """max(x, 0), with derivative 0 at x = 0 (as JAX's `jax.nn.relu` and PyTorch).

    It is `select(x <= 0, 0, x)` rather than `max(x, 0)`: max splits ties evenly, which would
    give relu'(0) = 0.5. A NaN input stays NaN (the comparison is false), as with max.

    >>> import accy
    >>> p = accy.trace.define("r", [accy.spec(accy.f32, n=3)], lambda b, a: accy.nn.relu(a[0]))
    >>> accy.reference.run(p, [[-1.0, 0.0, 2.0]])[0].tolist()
    [0.0, 0.0, 2.0]
    >>> loss = accy.trace.define(
    ...     "l", [accy.spec(accy.f32, n=3)], lambda b, a: accy.nn.relu(a[0]).sum("n"))
    >>> accy.reference.run(accy.grad(loss), [[-1.0, 0.0, 2.0]])[0].tolist()
    [0.0, 0.0, 1.0]
    """
    return x.builder.select(x <= 0.0, 0.0, x)


def logsumexp(x: Value, axis: str) -> Value:
    """log(sum(exp(x))) over `axis`, computed stably (the max is subtracted first).

    >>> import accy, numpy as np
    >>> p = accy.trace.define(
    ...     "l", [accy.spec(accy.f32, n=2)], lambda b, a: accy.nn.logsumexp(a[0], "n"))
    >>> round(float(accy.reference.run(p, [[0.0, 0.0]])[0]), 4)
    0.6931
    """
    peak = stop_gradient(x.max(axis))
    return (x - peak).exp().sum(axis).log() + peak


def softmax(x: Value, axis: str) -> Value:
    """exp(x) / sum(exp(x)) over `axis`, with the max subtracted first.

    >>> import accy
    >>> p = accy.trace.define(
    ...     "s", [accy.spec(accy.f32, n=2)], lambda b, a: accy.nn.softmax(a[0], "n"))
    >>> accy.reference.run(p, [[1.0, 1.0]])[0].tolist()
    [0.5, 0.5]
    """
    weights = (x - stop_gradient(x.max(axis))).exp()
    return weights / weights.sum(axis)


def log_softmax(x: Value, axis: str) -> Value:
    """x - logsumexp(x) over `axis`: the log of softmax, without its underflow.

    >>> import accy
    >>> p = accy.trace.define(
    ...     "l", [accy.spec(accy.f32, n=2)], lambda b, a: accy.nn.log_softmax(a[0], "n"))
    >>> [round(v, 4) for v in accy.reference.run(p, [[0.0, 0.0]])[0].tolist()]
    [-0.6931, -0.6931]
    """
    return x - logsumexp(x, axis)


def logaddexp(a: Value, b) -> Value:
    """log(exp(a) + exp(b)) without overflow, with derivative 1/2 each where a == b (max's
    even tie split); equal infinities give that infinity (not NaN).

    >>> import accy
    >>> p = accy.trace.define(
    ...     "l", [accy.spec(accy.f32, n=2)] * 2, lambda b, a: accy.nn.logaddexp(a[0], a[1]))
    >>> [round(v, 4) for v in accy.reference.run(p, [[0.0, 1000.0], [0.0, 0.0]])[0].tolist()]
    [0.6931, 1000.0]
    """
    builder = a.builder
    larger = a.max(b)
    delta = a - b
    result = larger + (-delta.abs()).exp().log1p()
    # Equal infinities: delta is NaN but the answer is that infinity (a + b is it).
    return builder.select(delta.ne(delta), a + b, result)


def softplus(x: Value) -> Value:
    """log(1 + exp(x)), as logaddexp(x, 0): no overflow, derivative logistic(x).

    >>> import accy
    >>> p = accy.trace.define("s", [accy.spec(accy.f32, n=2)], lambda b, a: accy.nn.softplus(a[0]))
    >>> [round(v, 4) for v in accy.reference.run(p, [[0.0, 100.0]])[0].tolist()]
    [0.6931, 100.0]
    """
    return logaddexp(x, 0.0)


def silu(x: Value) -> Value:
    """x * logistic(x) (also called swish).

    >>> import accy
    >>> p = accy.trace.define("s", [accy.spec(accy.f32, n=1)], lambda b, a: accy.nn.silu(a[0]))
    >>> round(float(accy.reference.run(p, [[1.0]])[0][0]), 4)
    0.7311
    """
    return x * x.logistic()


def mish(x: Value) -> Value:
    """x * tanh(softplus(x)).

    >>> import accy
    >>> p = accy.trace.define("m", [accy.spec(accy.f32, n=1)], lambda b, a: accy.nn.mish(a[0]))
    >>> round(float(accy.reference.run(p, [[1.0]])[0][0]), 4)
    0.8651
    """
    return x * softplus(x).tanh()


def gelu(x: Value, approximate: bool = False) -> Value:
    """GELU, x * Phi(x) with Phi the standard normal CDF: exact (through erf) by default, the
    tanh approximation (`gelu_tanh`) when `approximate`.

    >>> import accy
    >>> p = accy.trace.define("g", [accy.spec(accy.f32, n=1)], lambda b, a: accy.nn.gelu(a[0]))
    >>> round(float(accy.reference.run(p, [[1.0]])[0][0]), 4)
    0.8413
    """
    if approximate:
        return gelu_tanh(x)
    return x * 0.5 * ((x * (1.0 / math.sqrt(2.0))).erf() + 1.0)


def rms_norm(x: Value, axis: str, eps: float = 1e-6) -> Value:
    """x / sqrt(mean(x^2) + eps) over `axis` (no scale).

    >>> import accy
    >>> p = accy.trace.define(
    ...     "r", [accy.spec(accy.f32, c=2)], lambda b, a: accy.nn.rms_norm(a[0], "c"))
    >>> [round(v, 3) for v in accy.reference.run(p, [[3.0, 4.0]])[0].tolist()]
    [0.849, 1.131]
    """
    return x * ((x * x).mean(axis) + eps).rsqrt()


def layer_norm(x: Value, axis: str, eps: float = 1e-5) -> Value:
    """(x - mean) / sqrt(var + eps) over `axis` (no scale or bias).

    >>> import accy
    >>> p = accy.trace.define(
    ...     "n", [accy.spec(accy.f32, c=2)], lambda b, a: accy.nn.layer_norm(a[0], "c"))
    >>> [round(v, 3) for v in accy.reference.run(p, [[1.0, 3.0]])[0].tolist()]
    [-1.0, 1.0]
    """
    centered = x - x.mean(axis)
    variance = (centered * centered).mean(axis)
    return centered * (variance + eps).rsqrt()


def gelu_tanh(x: Value) -> Value:
    """GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as
    `jax.nn.gelu(x, approximate=True)` and PyTorch's `gelu(x, approximate="tanh")`. One unary
    op (`gelu_tanh`, its derivative `gelu_tanh_slope`), so that a GPU's GEMM computes it in its
    epilogue.

    >>> import accy
    >>> p = accy.trace.define("g", [accy.spec(accy.f32, n=1)], lambda b, a: accy.nn.gelu_tanh(a[0]))
    >>> round(float(accy.reference.run(p, [[1.0]])[0][0]), 4)
    0.8412
    """
    return x.builder.unary("gelu_tanh", x)


def cross_entropy(logits: Value, labels: Value, axis: str) -> Value:
    """Softmax cross-entropy per example over the classes along `axis`; the labels' dtype says
    which form they take:

    - integer labels (the class index of each example, without `axis`): logsumexp(logits) minus
      the logit at the label, as optax's `softmax_cross_entropy_with_integer_labels`. The logit
      is picked by comparing each class position with the label inside the reduction, so no
      one-hot tensor of examples x classes is stored; the logits' gradient is
      softmax(logits) - [position == label]. An index outside [0, classes) picks nothing (its
      loss is the logsumexp alone).
    - float labels (a probability distribution along `axis`, e.g. one-hot):
      -sum(labels * log_softmax(logits)). As optax's `softmax_cross_entropy`, both arguments are
      differentiable: the derivative with respect to the labels is -log_softmax(logits), with
      respect to the logits softmax(logits) * sum(labels) - labels.

    >>> import accy
    >>> p = accy.trace.define("x", [accy.spec(accy.f32, n=2)] * 2,
    ...                       lambda b, a: accy.nn.cross_entropy(a[0], a[1], "n"))
    >>> round(float(accy.reference.run(p, [[0.0, 0.0], [1.0, 0.0]])[0]), 4)  # log 2
    0.6931
    >>> q = accy.trace.define("y", [accy.spec(accy.f32, row=2, n=3), accy.spec(accy.i32, row=2)],
    ...                       lambda b, a: accy.nn.cross_entropy(a[0], a[1], "n"))
    >>> [round(float(v), 4) for v in accy.reference.run(q, [[[0, 0, 0], [0, 9, 0]], [2, 1]])[0]]
    [1.0986, 0.0002]
    """
    if labels.dtype.is_float:
        if not labels.ty.has(axis):
            raise AxisError(
                f"cross_entropy: float labels are a distribution over {axis!r}, but they have "
                f"axes {labels.ty.axes}; pass integer class indices for one label per example"
            )
        return -(labels * log_softmax(logits, axis)).sum(axis)
    if labels.dtype == bool_:
        raise DTypeError("cross_entropy: labels are class indices (integers) or probabilities")
    if labels.ty.has(axis):
        raise AxisError(
            f"cross_entropy: integer labels are one class index per example, so they cannot "
            f"have the class axis {axis!r} (their axes are {labels.ty.axes})"
        )
    return logsumexp(logits, axis) - pick(logits, labels, axis)


def pick(x: Value, indices: Value, axis: str) -> Value:
    """x at position `indices` along `axis`, per element of the other axes (indices have every
    axis of x but `axis`): the sum over `axis` of x where the position equals the index. The
    comparison is fused into the reduction, and its gradient is a select, so nothing of x's size
    is stored beyond x itself. An index out of range picks 0.

    >>> import accy
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, row=2, n=3), accy.spec(accy.i32, row=2)],
    ...                       lambda b, a: accy.nn.pick(a[0], a[1], "n"))
    >>> accy.reference.run(p, [[[1, 2, 3], [4, 5, 6]], [2, 0]])[0].tolist()
    [3.0, 4.0]
    """
    b = x.builder
    # Positions over all of x's axes (iota is fused, never stored): the mask, and so the
    # select, keep x's layout whatever the order of the indices' axes.
    positions = b.iota(TensorType(indices.dtype, x.ty.named_extents), axis)
    return b.select(positions.eq(indices), x, 0.0).sum(axis)


def causal_mask(
    scores: Value, query: str = "token", key: str = "key", masked: float = float("-inf")
) -> Value:
    """`scores` where the key position is at most the query position, `masked` elsewhere (a
    causal attention mask, from `iota` and `compare`: no tokens x tokens constant is stored).
    With the default -inf, softmax gives the masked keys exactly zero weight.

    >>> import accy
    >>> p = accy.trace.define("m", [accy.spec(accy.f32, token=2, key=2)],
    ...                       lambda b, a: accy.nn.causal_mask(a[0]))
    >>> accy.reference.run(p, [[[1, 2], [3, 4]]])[0].tolist()
    [[1.0, -inf], [3.0, 4.0]]
    """
    b = scores.builder
    t = TensorType(i32, scores.ty.named_extents)  # scores' layout (iotas are fused, not stored)
    return b.select(b.iota(t, key) <= b.iota(t, query), scores, masked)


def one_hot(builder, indices: Value, axis: str, extent: int, dtype) -> Value:
    """A `dtype` tensor with a new axis `axis` that is 1 where its position equals the index.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("one_hot", [accy.spec(accy.i32, token=2)],
    ...                       lambda b, a: accy.nn.one_hot(b, a[0], "vocab", 3, accy.f32))
    >>> accy.reference.run(p, [np.array([2, 0], np.int32)])[0].tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    """
    positions = builder.iota(
        TensorType(indices.dtype, (*indices.ty.named_extents, (axis, extent))), axis
    )
    return positions.eq(indices).convert(dtype)


def dropout(key: Value, x: Value, rate: float) -> Value:
    """`x` with each element zeroed with probability `rate` and the others scaled by
    1 / (1 - rate), drawn from `key` (an `accy.random` key): the same key drops the same
    elements on every backend.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("d", [accy.random.KEY, accy.spec(accy.f32, n=1000)],
    ...                       lambda b, a: accy.nn.dropout(a[0], a[1], 0.25))
    >>> out = accy.reference.run(p, [accy.random.key(0), np.ones(1000, np.float32)])[0]
    >>> sorted({round(float(v), 4) for v in out}), 0.2 < float((out == 0).mean()) < 0.3
    ([0.0, 1.3333], True)
    """
    if not 0.0 <= rate < 1.0:
        raise AccyError(f"dropout: the rate must be in [0, 1), got {rate}")
    if rate == 0.0:
        return x
    keep = random.bernoulli(key, 1.0 - rate, x.ty.with_dtype(x.dtype))
    return x.builder.select(keep, x * (1.0 / (1.0 - rate)), 0.0)


def max_pool(x: Value, window: dict, stride=None, padding="valid") -> Value:
    """The maximum over windows (`window`: axis -> extent; stride defaults to the window).
    Each window's gradient goes to its first maximum (row-major), as JAX's reduce_window.

    >>> import accy
    >>> p = accy.trace.define("m", [accy.spec(accy.f32, w=4)],
    ...                       lambda b, a: accy.nn.max_pool(a[0], {"w": 2}))
    >>> accy.reference.run(p, [[1.0, 3.0, 2.0, 0.0]])[0].tolist()
    [3.0, 2.0]
    """
    return x.reduce_window("max", window, stride, padding)


def avg_pool(x: Value, window: dict, stride=None, padding="valid") -> Value:
    """The mean over windows; padded elements count as zeros (flax's count_include_pad).

    >>> import accy
    >>> p = accy.trace.define("a", [accy.spec(accy.f32, w=4)],
    ...                       lambda b, a: accy.nn.avg_pool(a[0], {"w": 2}))
    >>> accy.reference.run(p, [[1.0, 3.0, 2.0, 0.0]])[0].tolist()
    [2.0, 1.0]
    """
    size = math.prod(window.values())
    return x.reduce_window("sum", window, stride, padding) / float(size)


@dataclass(frozen=True)
class MixedPrecision:
    """A mixed-precision policy for training: parameters (and the optimizer's state) kept in
    `params_dtype`, the forward and backward pass computed in `compute_dtype`, results (the
    loss) in `output_dtype`. Make one with `mixed_precision`.

    Gradients come back in `params_dtype`: the transpose of `convert` converts each cotangent
    back to its operand's dtype. f16's narrow range underflows small gradients, so an f16
    policy scales the loss by `loss_scale` (2^12) before differentiation and the gradients
    back down after (`unscale`); bf16 has f32's range and needs no scaling (`loss_scale` 1).

    `fp8` (an `accy.nn.fp8.Fp8Policy`, or None) picks the layers whose GEMMs `cast_to_compute`
    switches to FP8 (`accy.nn.fp8_matmul`); the master parameters stay as they are.
    """

    params_dtype: DType
    compute_dtype: DType
    output_dtype: DType
    fp8: Fp8Policy | None = None

    @property
    def loss_scale(self) -> float:
        return F16_LOSS_SCALE if self.compute_dtype == f16 else 1.0

    def cast_to_compute(self, tree: Any) -> Any:
        """Every floating-point leaf of `tree` (values or named arrays) in `compute_dtype`,
        and the layers `fp8` picks switched to FP8 GEMMs."""
        cast = _cast_floats(tree, self.compute_dtype)
        return cast if self.fp8 is None else self.fp8.apply(cast)

    def cast_to_output(self, tree: Any) -> Any:
        """Every floating-point leaf of `tree` in `output_dtype`."""
        return _cast_floats(tree, self.output_dtype)

    def cast_to_params(self, tree: Any) -> Any:
        """Every floating-point leaf of `tree` in `params_dtype`."""
        return _cast_floats(tree, self.params_dtype)

    def scale(self, loss: Any) -> Any:
        """The loss to differentiate: times `loss_scale` (f16 only)."""
        return loss if self.loss_scale == 1.0 else loss * self.loss_scale

    def unscale(self, grads: Any) -> Any:
        """Gradients of a scaled loss divided by `loss_scale` again (f16 only)."""
        if self.loss_scale == 1.0:
            return grads
        return optree.tree_map(lambda g: g * (1.0 / self.loss_scale), grads, namespace="accy")


F16_LOSS_SCALE = 2.0**12
"""The static loss scale of f16 policies: the gradients of a loss of order 1 in the demo's
models are above 2^-20, and f16 keeps 2^-24 and up (subnormals included)."""


def mixed_precision(
    params_dtype: DType = f32,
    compute_dtype: DType = bf16,
    output_dtype: DType = f32,
    *,
    fp8: Any = None,
) -> MixedPrecision:
    """The mixed-precision policy: f32 master parameters, `compute_dtype` for the model's
    arithmetic, `output_dtype` for its results. `fp8` picks the GEMMs that run in FP8: group
    names (`("mlp", "head")`; the groups are `accy.nn.fp8.GROUPS`), a predicate on a layer's
    dotted path (`lambda path: path.endswith("mlp.up")`), or None for none.

    >>> import accy, numpy as np
    >>> policy = accy.nn.mixed_precision(accy.f32, accy.bf16, accy.f32)
    >>> x = accy.named(np.array([1.0 + 2**-9], np.float32), ("lane",), device="reference")
    >>> policy.cast_to_compute({"x": x})["x"].array.tolist(), policy.loss_scale
    ([1.0], 1.0)
    >>> accy.nn.mixed_precision(compute_dtype=accy.f16).loss_scale
    4096.0
    >>> accy.nn.mixed_precision(fp8=("mlp", "head")).fp8
    Fp8Policy(groups=('mlp', 'head'))
    """
    for role, dtype in (
        ("params", params_dtype),
        ("compute", compute_dtype),
        ("output", output_dtype),
    ):
        if not isinstance(dtype, DType) or not dtype.is_float:
            raise DTypeError(
                f"mixed_precision: {role}_dtype must be a float dtype (accy.f32, accy.bf16, "
                f"accy.f16, accy.f64), got {dtype!r}"
            )
    chosen = fp8 if fp8 is None or isinstance(fp8, Fp8Policy) else Fp8Policy(fp8)
    if chosen is not None and compute_dtype not in OPERAND_DTYPES:
        raise DTypeError(
            f"mixed_precision: fp8= needs compute_dtype accy.bf16, accy.f16 or accy.f32 (what "
            f"accy.nn.fp8_matmul takes), got {compute_dtype!r}"
        )
    return MixedPrecision(params_dtype, compute_dtype, output_dtype, chosen)


def _cast_floats(tree: Any, dtype: DType) -> Any:
    def cast(leaf):
        held = getattr(leaf, "dtype", None)
        is_float = isinstance(held, DType) and held.is_float
        return leaf.convert(dtype) if is_float and held != dtype else leaf

    return optree.tree_map(cast, tree, namespace="accy")
