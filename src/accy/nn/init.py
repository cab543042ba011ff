"""Initialisers: random arrays for parameters, drawn from an `accy.random` key, with fans named
by axis (`fan_in=("embed",)`), as `jax.nn.initializers` and `torch.nn.init`.

A key is what `accy.random.key(seed)` gives (a host array), a NamedArray key, or a traced key
inside a transformed function. Host and NamedArray keys draw on the NumPy evaluator (no
compile: the draws are the same bits on every backend) and give a NamedArray on `device`
(default "cpu"); a traced key records the draw in its trace and gives a traced value.

>>> import accy
>>> w = accy.nn.init.xavier_uniform(accy.random.key(0), {"embed": 4, "hidden": 8},
...                                 fan_in="embed", fan_out="hidden")
>>> w.shape, bool(abs(w.array).max() <= (6 / 12) ** 0.5)
({'embed': 4, 'hidden': 8}, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import random
from ..core import Value
from ..core.types import DType, TensorType, f32
from ..errors import AccyError, AxisError
from ..frontend.named import NamedArray, check_device, named

Shape = Mapping[str, int] | TensorType
Key = Any  # a host key (accy.random.key), a NamedArray key or a traced one


def _type(shape: Shape, dtype: DType) -> TensorType:
    if isinstance(shape, TensorType):
        return shape.with_dtype(dtype) if shape.dtype != dtype else shape
    if not isinstance(shape, Mapping):
        raise AxisError(
            f"an initialiser's shape is a dict from axis name to extent ({{'embed': 768}}) or "
            f"an accy.TensorType, got {shape!r}"
        )
    return TensorType(dtype, tuple(shape.items()))


def _key(key: Key) -> Value | NamedArray:
    """`key` as an operand of the draw: a traced key unchanged, others on the evaluator."""
    if isinstance(key, Value):
        return key
    if isinstance(key, NamedArray):
        return key.to("reference")
    array = np.asarray(key)
    if array.shape != (2,) or array.dtype.kind not in "iu":
        raise AccyError(
            f"a random key is two 32-bit words (accy.random.key(seed)), got an array of shape "
            f"{array.shape} and dtype {array.dtype}"
        )
    return named(array.view(np.int32) if array.dtype != np.int32 else array, ("key",), "reference")


def _finish(drawn: Any, device: str | None) -> Any:
    if isinstance(drawn, Value):
        return drawn
    return drawn.to(check_device(device or "cpu"))


def split(key: Key, num: int = 2) -> list[Any]:
    """`num` independent keys from `key`, as host arrays (traced keys: traced values).

    >>> import accy
    >>> a, b = accy.nn.init.split(accy.random.key(0))
    >>> a.shape, bool((a != b).any())
    ((2,), True)
    """
    keys = random.split(_key(key), num)
    if isinstance(key, Value):
        return list(keys)
    return [np.asarray(k.array) for k in keys]


def _axes(names: str | Sequence[str] | None, t: TensorType, role: str) -> tuple[str, ...]:
    if names is None:
        return ()
    names = (names,) if isinstance(names, str) else tuple(names)
    for name in names:
        if not t.has(name):
            raise AxisError(
                f"{role} names the axis {name!r}, which {t} does not have; name some of "
                f"{', '.join(t.axes)}"
            )
    return names


def fans(t: TensorType, fan_in=None, fan_out=None) -> tuple[int, int]:
    """The products of the extents of the `fan_in` and `fan_out` axes of `t`.

    >>> fans(TensorType(f32, (("a", 2), ("b", 3), ("c", 5))), "a", ("b", "c"))
    (2, 15)
    """
    ins = _axes(fan_in, t, "fan_in")
    outs = _axes(fan_out, t, "fan_out")
    return math.prod(t.extent(a) for a in ins), math.prod(t.extent(a) for a in outs)


def zeros(shape: Shape, dtype: DType = f32, device: str | None = None) -> NamedArray:
    """An array of zeros.

    >>> import accy
    >>> accy.nn.init.zeros({"a": 2}).array.tolist()
    [0.0, 0.0]
    """
    t = _type(shape, dtype)
    return named(np.zeros(t.extents, dtype.numpy), t.axes, check_device(device or "cpu"))


def ones(shape: Shape, dtype: DType = f32, device: str | None = None) -> NamedArray:
    """An array of ones.

    >>> import accy
    >>> accy.nn.init.ones({"a": 2}, accy.bf16).dtype
    accy.bf16
    """
    t = _type(shape, dtype)
    return named(np.ones(t.extents, dtype.numpy), t.axes, check_device(device or "cpu"))


def normal(
    key: Key, shape: Shape, std: float = 1.0, *, dtype: DType = f32, device: str | None = None
):
    """Normal numbers with mean 0 and standard deviation `std`.

    >>> import accy
    >>> w = accy.nn.init.normal(accy.random.key(1), {"n": 4000}, std=0.02)
    >>> bool(abs(float(w.array.std()) - 0.02) < 0.002)
    True
    """
    return _finish(random.normal(_key(key), _type(shape, dtype)) * float(std), device)


def uniform(
    key: Key,
    shape: Shape,
    low: float = 0.0,
    high: float = 1.0,
    *,
    dtype: DType = f32,
    device: str | None = None,
):
    """Numbers uniform in [low, high).

    >>> import accy
    >>> u = accy.nn.init.uniform(accy.random.key(0), {"n": 100}, -1.0, 1.0).array
    >>> bool(u.min() >= -1.0 and u.max() < 1.0)
    True
    """
    if not high > low:
        raise AccyError(f"uniform: high ({high}) must be above low ({low})")
    return _finish(random.uniform(_key(key), _type(shape, dtype), low, high), device)


def truncated_normal(
    key: Key,
    shape: Shape,
    std: float = 1.0,
    lower: float = -2.0,
    upper: float = 2.0,
    *,
    dtype: DType = f32,
    device: str | None = None,
):
    """Normal numbers with mean 0 and scale `std`, truncated to [lower, upper] standard
    deviations (by the inverse CDF of a uniform draw between the bounds' CDFs, as JAX).

    >>> import accy
    >>> w = accy.nn.init.truncated_normal(accy.random.key(2), {"n": 1000}, std=0.5)
    >>> bool(abs(w.array).max() <= 1.0)
    True
    """
    if not upper > lower:
        raise AccyError(f"truncated_normal: upper ({upper}) must be above lower ({lower})")
    low, high = (math.erf(b / math.sqrt(2.0)) for b in (lower, upper))
    u = random.uniform(_key(key), _type(shape, dtype), low, high)
    drawn = (u.erf_inv() * math.sqrt(2.0)).max(float(lower)).min(float(upper)) * float(std)
    return _finish(drawn, device)


def _scaled(kind: str, key: Key, t: TensorType, scale: float, device: str | None):
    if kind == "uniform":
        bound = math.sqrt(3.0) * scale
        return _finish(random.uniform(_key(key), t, -bound, bound), device)
    return _finish(random.normal(_key(key), t) * scale, device)


def xavier_uniform(
    key: Key,
    shape: Shape,
    fan_in=None,
    fan_out=None,
    *,
    gain: float = 1.0,
    dtype: DType = f32,
    device: str | None = None,
):
    """Glorot/Xavier uniform: U(-a, a) with a = gain sqrt(6 / (fan_in + fan_out)), the fans
    the products of the named axes' extents (`torch.nn.init.xavier_uniform_`); see the module
    docstring's example."""
    t = _type(shape, dtype)
    n_in, n_out = fans(t, fan_in, fan_out)
    return _scaled("uniform", key, t, gain * math.sqrt(2.0 / (n_in + n_out)), device)


def xavier_normal(
    key: Key,
    shape: Shape,
    fan_in=None,
    fan_out=None,
    *,
    gain: float = 1.0,
    dtype: DType = f32,
    device: str | None = None,
):
    """Glorot/Xavier normal: N(0, gain² 2 / (fan_in + fan_out)).

    >>> import accy
    >>> w = accy.nn.init.xavier_normal(accy.random.key(0), {"i": 100, "o": 100}, "i", "o")
    >>> round(float(w.array.std()), 1)
    0.1
    """
    t = _type(shape, dtype)
    n_in, n_out = fans(t, fan_in, fan_out)
    return _scaled("normal", key, t, gain * math.sqrt(2.0 / (n_in + n_out)), device)


def he_normal(
    key: Key,
    shape: Shape,
    fan_in=None,
    *,
    gain: float = math.sqrt(2.0),
    dtype: DType = f32,
    device: str | None = None,
):
    """He/Kaiming normal: N(0, gain² / fan_in), gain sqrt(2) for ReLU
    (`torch.nn.init.kaiming_normal_`).

    >>> import accy
    >>> w = accy.nn.init.he_normal(accy.random.key(0), {"i": 200, "o": 50}, fan_in="i")
    >>> round(float(w.array.std()), 1)
    0.1
    """
    t = _type(shape, dtype)
    n_in, _ = fans(t, fan_in)
    return _scaled("normal", key, t, gain / math.sqrt(n_in), device)


def he_uniform(
    key: Key,
    shape: Shape,
    fan_in=None,
    *,
    gain: float = math.sqrt(2.0),
    dtype: DType = f32,
    device: str | None = None,
):
    """He/Kaiming uniform: U(-a, a) with a = gain sqrt(3 / fan_in).

    >>> import accy
    >>> w = accy.nn.init.he_uniform(accy.random.key(0), {"i": 6, "o": 50}, fan_in="i")
    >>> bool(abs(w.array).max() <= 1.0)
    True
    """
    t = _type(shape, dtype)
    n_in, _ = fans(t, fan_in)
    return _scaled("uniform", key, t, gain / math.sqrt(n_in), device)


__all__ = [
    "fans",
    "he_normal",
    "he_uniform",
    "normal",
    "ones",
    "split",
    "truncated_normal",
    "uniform",
    "xavier_normal",
    "xavier_uniform",
    "zeros",
]
