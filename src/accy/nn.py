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

from .core.builder import Value
from .core.types import TensorType, bool_, i32
from .errors import AxisError, DTypeError


def stop_gradient(x: Value) -> Value:
    """`x`, but differentiation treats it as a constant (its derivative is zero).

    Softmax and logsumexp use it on the max they subtract: the result does not depend on that
    shift, so differentiating through it would only add work.
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
    return x - logsumexp(x, axis)


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
    """GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    >>> import accy
    >>> p = accy.trace.define("g", [accy.spec(accy.f32, n=1)], lambda b, a: accy.nn.gelu_tanh(a[0]))
    >>> round(float(accy.reference.run(p, [[1.0]])[0][0]), 4)
    0.8412
    """
    inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
    return x * 0.5 * (inner.tanh() + 1.0)


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
    """A `dtype` tensor with a new axis `axis` that is 1 where its position equals the index."""
    positions = builder.iota(
        TensorType(indices.dtype, (*indices.ty.named_extents, (axis, extent))), axis
    )
    return positions.eq(indices).convert(dtype)
