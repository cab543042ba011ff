"""Random numbers inside programs: Threefry-2x32, counter-based, as JAX's default generator.

A key is two 32-bit words held as an `i32` tensor with an axis `key` of extent 2
(`accy.random.KEY`); it is an ordinary program input (`accy.random.key(seed)` makes one on the
host) or a constant (`constant_key`). Every draw is a pure function of the key and of the
element's position, so the same key gives the same numbers on every backend, bit for bit.

Nothing here is a new kind: Threefry is 20 rounds of 32-bit additions, rotations and
exclusive-ors, which are the `add` (wrapping), `shift_left`, `shift_right_logical`, `or` and
`xor` rows of the elementwise table; integer arithmetic is exact on every target, and the
rounds fuse into the draw's loop. The float conversions are exact too (bits into the mantissa,
minus 1), so `bits`, `uniform`, `bernoulli` and `nn.dropout` are bit-identical across
reference, cpu and cuda; `normal` (through `erf_inv`) and `categorical` (through `log`) match
to the last bit where the targets' libm agree (reference and cpu use the same glibc).

The scheme is JAX's partitionable one: element `i` (its row-major position in the requested
type with the axes taken in name order, so that a draw does not depend on the layout order of
its axes: `x` and `x` transposed drop the same elements) gets `threefry2x32(key, (0, i))`,
whose two words are xor-ed for 32 bits (`bits`) or joined for 64 (`uniform` of f64); `split`
gives key `j` the two words of `threefry2x32(key, (0, j))`. A key must be used once: either
split or drawn from. A key with more axes than `key` (a batch of keys from `split_along`) draws
one independent stream per batch element, broadcast by name.

In front-end code a key is a NamedArray (`key(seed)`), an argument of jitted functions like any
other; a draw's shape is a TensorType or a dict of axis extents with a `dtype`
(`normal(k, {"batch": 4, "feature": 3})`). Called on a concrete key outside any trace, a draw
runs as one compiled program (cached per signature), not operation by operation.

>>> import accy, numpy as np
>>> def draw(b, args):
...     first, second = accy.random.split(args[0])
...     return accy.random.uniform(first, accy.spec(accy.f32, n=3))
>>> p = accy.trace.define("draw", [accy.random.KEY], draw)
>>> u = accy.reference.run(p, [accy.random.key(0)])[0]
>>> bool(((0.0 <= u) & (u < 1.0)).all())
True
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .core.types import DType, TensorType, bf16, f16, f32, f64, i32, i64, spec
from .core.value import Value
from .errors import AxisError, DTypeError

KEY = spec(i32, key=2)
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
PARITY = 0x1BD11BDA  # Threefry's key-schedule constant


def key(seed: int, device: str | None = None) -> Any:
    """The key of an integer seed (JAX's raw key: high word, low word) as a NamedArray with
    the axis `key` (i32[key=2]), on `device` (if None the default device, see
    `accy.default_device`); programs take it as an input (`KEY`). Seeds are 64-bit: from
    -2**63 (negative ones as their two's complement, as JAX) to 2**64 - 1.

    >>> key(7).array.tolist(), key(-1).array.tolist()
    ([0, 7], [-1, -1])
    """
    from .frontend.named import named

    return named(_raw_key(seed), ("key",), device=device)


def _raw_key(seed: int) -> np.ndarray:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise DTypeError(f"random.key: a seed is an integer, got {type(seed).__name__} {seed!r}")
    seed = int(seed)
    if not -(2**63) <= seed < 2**64:
        raise DTypeError(
            f"random.key: the seed {seed} does not fit in 64 bits; give one from -2**63 to "
            "2**64 - 1 (fold_in mixes in more data)"
        )
    seed &= 0xFFFFFFFFFFFFFFFF
    return np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32).view(np.int32)


def constant_key(builder, seed: int) -> Value:
    """The key of `seed` as a constant of the program being traced."""
    return builder.constant(_raw_key(seed), KEY)


def _signed(word: int) -> int:
    """A 32-bit word as the i32 value with the same bits."""
    word &= 0xFFFFFFFF
    return word - (1 << 32) if word >= 1 << 31 else word


def _rotate_left(x: Value, r: int) -> Value:
    return x.shift_left(r) | x.shift_right_logical(32 - r)


def _word(k: Value, position: int) -> Value:
    """Word `position` of key `k` (its `key` axis removed)."""
    if not k.ty.has("key") or k.ty.extent("key") != 2 or k.dtype != i32:
        raise AxisError(f"a random key is i32 with an axis 'key' of extent 2, got {k.ty}")
    return _drop(k.slice("key", position, position + 1), "key")


def threefry2x32(k: Value, x0: Value, x1: Value) -> tuple[Value, Value]:
    """Threefry-2x32 (20 rounds) of the counter words (`x0`, `x1`) under key `k`; every value
    is i32 holding 32-bit words, broadcast by name.

    >>> import accy
    >>> def kat(b, args):  # Random123's known-answer test, also JAX's
    ...     k = b.constant([0x13198A2E, 0x03707344], KEY)
    ...     return threefry2x32(k, b.scalar(i32, 0x243F6A88), b.scalar(i32, _signed(0x85A308D3)))
    >>> out = accy.reference.run(accy.trace.define("kat", [], kat), [])
    >>> [hex(int(w) & 0xFFFFFFFF) for w in out]
    ['0xc4923a9c', '0x483df7a0']
    """
    k0, k1 = _word(k, 0), _word(k, 1)
    schedule = (k0, k1, k0 ^ k1 ^ PARITY)
    x0, x1 = x0 + schedule[0], x1 + schedule[1]
    for block in range(5):
        for r in ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, r) ^ x0
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + (block + 1)
    return x0, x1


def _counter(builder, type: TensorType) -> Value:
    """Each element's row-major position in `type`, as i32 (wrapping past 2^31 elements)."""
    positions = builder.zeros(TensorType(i32, ()))
    stride = 1
    for axis, extent in reversed(sorted(type.named_extents)):  # by name, not layout
        along = builder.iota(TensorType(i32, ((axis, extent),)), axis)
        positions = positions + along * _signed(stride)
        stride *= extent
    return builder.broadcast_to(positions, TensorType(i32, type.named_extents))


def _words(k: Value, type: TensorType) -> tuple[Value, Value]:
    """Both words for each element of `type`: `type`'s axes first, then the key's batch axes."""
    counter = _counter(k.builder, type)
    words = threefry2x32(k, k.builder.zeros(TensorType(i32, ())), counter)
    batch = tuple(a for a in k.ty.axes if a != "key" and not type.has(a))
    return tuple(w.transpose((*type.axes, *batch)) for w in words)


def bits(k: Value, type: Any) -> Value:
    """32 random bits per element of `type`'s axes (i32), plus the key's batch axes."""
    high, low = _words(k, shape_type(type, None, i32))
    return high ^ low


def _drop(x: Value, axis: str) -> Value:
    """`x` without its axis `axis` of extent 1."""
    return x.builder.reshape(x, [(a, n) for a, n in x.ty.named_extents if a != axis])


def _as_key(high: Value, low: Value) -> Value:
    """Two words (of any axes) as keys: a new last axis `key`."""
    b = high.builder
    return b.concatenate(
        [b.reshape(w, (*w.ty.named_extents, ("key", 1))) for w in (high, low)], "key"
    )


def split(k: Value, num: int = 2) -> tuple[Value, ...]:
    """`num` new keys from `k`, as a tuple (`first, second = split(key)`)."""
    keys = split_along(k, "split", num)
    return tuple(_drop(keys.slice("split", j, j + 1), "split") for j in range(num))


def split_along(k: Value, axis: str, num: int) -> Value:
    """`num` new keys stacked along a new axis `axis` (i32[axis=num, key=2]); drawing from
    them gives one independent stream per position of `axis`."""
    return _as_key(*_words(k, TensorType(i32, ((axis, num),))))


def fold_in(k: Value, data) -> Value:
    """A new key from `k` and an integer (traced i32 scalar or int), as JAX's fold_in."""
    b = k.builder
    data = data if hasattr(data, "ty") else b.scalar(i32, _signed(int(data)))
    return _as_key(*threefry2x32(k, b.zeros(TensorType(i32, ())), data))


def _unit_f32(words: Value) -> Value:
    """Uniform floats in [1, 2) minus 1: 23 random bits as the mantissa of a float in [1, 2)."""
    mantissa = words.shift_right_logical(9) | 0x3F800000
    return mantissa.bitcast_convert(f32) - 1.0


def _unit_f64(high: Value, low: Value) -> Value:
    b = high.builder
    wide = [b.convert(w, i64) & 0xFFFFFFFF for w in (high, low)]
    joined = wide[0].shift_left(32) | wide[1]
    mantissa = joined.shift_right_logical(12) | 0x3FF0000000000000
    return mantissa.bitcast_convert(f64) - 1.0


# The largest value below 1 of each dtype: a draw rounded to 16 bits must stay below 1.
_BELOW_ONE = {f16: 1.0 - 2.0**-11, bf16: 1.0 - 2.0**-8}


def shape_type(shape: Any, dtype: DType | None, default: DType = f32) -> TensorType:
    """The TensorType a draw of `shape` makes: a TensorType (with `dtype` if given), or a dict
    of axis extents (`{"batch": 4}`) of `dtype` (`default` if None).

    >>> shape_type({"batch": 4, "feature": 3}, None)
    <f32[batch=4, feature=3]>
    """
    if isinstance(shape, TensorType):
        return shape if dtype is None else shape.with_dtype(dtype)
    if isinstance(shape, dict) and all(
        isinstance(a, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 0
        for a, n in shape.items()
    ):
        return TensorType(dtype or default, tuple(shape.items()))
    raise AxisError(
        f"a draw's shape is a TensorType (accy.spec(accy.f32, batch=4)) or a dict of axis "
        f"extents ({{'batch': 4}}), got {shape!r}"
    )


def uniform(
    k: Value, type: Any, minval: float = 0.0, maxval: float = 1.0, dtype: DType | None = None
) -> Value:
    """Floats uniform in [minval, maxval) of `type` (f32, f64, f16 or bf16; see `shape_type`).

    23 random bits for f32 (52 for f64) fill the mantissa of a number in [1, 2), minus 1: a
    multiple of 2^-23 in [0, 1), scaled and shifted, then kept at least `minval`.
    """
    type = shape_type(type, dtype)
    dtype = type.dtype
    if not dtype.is_float:
        raise DTypeError(f"uniform draws floats; got the type {type}")
    if dtype == f64:
        unit = _unit_f64(*_words(k, type))
    else:
        unit = _unit_f32(bits(k, type))
        if dtype != f32:
            unit = unit.convert(dtype)
            unit = unit.builder.select(unit >= 1.0, _BELOW_ONE[dtype], unit)
    return (unit * (maxval - minval) + minval).max(_scalar_of(unit, minval))


def _scalar_of(like: Value, value: float) -> Value:
    return like.builder.scalar(like.dtype, value)


def normal(k: Value, type: Any, dtype: DType | None = None) -> Value:
    """Standard normal floats of `type`: sqrt(2) erf_inv(u) with u uniform in (-1, 1), as JAX.
    f16 and bf16 draw in f32 and round (a 16-bit u would reach -1, whose erf_inv is -inf).

    >>> import accy
    >>> p = accy.trace.define(
    ...     "n", [KEY], lambda b, a: normal(a[0], accy.spec(accy.f32, n=20000)).mean())
    >>> abs(float(accy.reference.run(p, [key(1)])[0])) < 0.03
    True
    >>> accy.random.normal(accy.random.key(0), {"n": 3}).shape
    {'n': 3}
    """
    type = shape_type(type, dtype)
    if type.dtype in (f16, bf16):
        return normal(k, type.with_dtype(f32)).convert(type.dtype)
    above_minus_one = float(np.nextafter(np.float32(-1.0), np.float32(0.0)))
    if type.dtype == f64:
        above_minus_one = float(np.nextafter(-1.0, 0.0))
    u = uniform(k, type, above_minus_one, 1.0)
    return u.erf_inv() * math.sqrt(2.0)


def bernoulli(k: Value, p, type: Any = None) -> Value:
    """bool, true with probability `p` (a float or a traced float value; the result has the
    axes of `type` and of `p`)."""
    if type is None:
        if not hasattr(p, "ty"):
            raise AxisError("bernoulli needs a type when p is a Python number")
        type = p.ty
    type = shape_type(type, None)
    dtype: DType = p.dtype if hasattr(p, "ty") else f32
    return uniform(k, TensorType(dtype, type.named_extents)) < p


def categorical(k: Value, logits: Value, axis: str) -> Value:
    """An i32 index along `axis` drawn with probabilities softmax(logits), by the Gumbel-max
    trick (argmax of logits plus Gumbel noise), as JAX."""
    if not logits.ty.has(axis):
        raise AxisError(f"categorical: axis {axis!r} is not on {logits.ty}")
    tiny = float(np.finfo(logits.dtype.numpy if logits.dtype != bf16 else np.float32).tiny)
    u = uniform(k, logits.ty, tiny, 1.0)
    gumbel = -(-u.log()).log()
    return (logits + gumbel).argmax(axis)


def gumbel(k: Value, type: Any, dtype: DType | None = None) -> Value:
    """Standard Gumbel floats of `type`: -log(-log(u)) with u uniform in (tiny, 1), as JAX."""
    type = shape_type(type, dtype)
    tiny = float(np.finfo(type.dtype.numpy if type.dtype != bf16 else np.float32).tiny)
    return -(-uniform(k, type, tiny, 1.0).log()).log()


def truncated_normal(
    k: Value, lower: float, upper: float, type: Any, dtype: DType | None = None
) -> Value:
    """Normal floats conditioned on [lower, upper] (`jax.random.truncated_normal`): the
    inverse error function of a uniform draw between erf(lower / sqrt 2) and
    erf(upper / sqrt 2), kept inside the bounds.

    >>> import accy
    >>> t = accy.random.truncated_normal(accy.random.key(0), -1.0, 2.0, {"n": 1000})
    >>> bool(((t >= -1.0) & (t <= 2.0)).min())
    True
    """
    type = shape_type(type, dtype)
    if not lower < upper:
        raise AxisError(f"truncated_normal: lower ({lower}) must be below upper ({upper})")
    if type.dtype in (f16, bf16):
        return truncated_normal(k, lower, upper, type.with_dtype(f32)).convert(type.dtype)
    a, b = (math.erf(v / math.sqrt(2.0)) for v in (lower, upper))
    u = uniform(k, type, a, b)
    out = u.erf_inv() * math.sqrt(2.0)
    scalar = type.dtype.numpy.type
    low = float(np.nextafter(scalar(lower), scalar(np.inf)))
    high = float(np.nextafter(scalar(upper), scalar(-np.inf)))
    return out.max(_scalar_of(out, low)).min(_scalar_of(out, high))


def randint(k: Value, type: Any, minval: int, maxval: int, dtype: DType | None = None) -> Value:
    """Integers uniform in [minval, maxval) of `type` (i32 by default): 32 random bits scaled
    to the span by a 64-bit multiply and shift (Lemire's method; a bias below 2^-32 per value).

    >>> import accy
    >>> r = accy.random.randint(accy.random.key(0), {"n": 1000}, 3, 7)
    >>> sorted(set(r.array.tolist()))
    [3, 4, 5, 6]
    """
    type = shape_type(type, dtype, i32)
    if type.dtype.is_float or type.dtype.name == "bool":
        raise DTypeError(f"randint draws integers; got the type {type}")
    span = int(maxval) - int(minval)
    if not 0 < span <= 2**32:
        raise AxisError(
            f"randint: maxval ({maxval}) must exceed minval ({minval}), by at most 2**32"
        )
    info = np.iinfo(type.dtype.numpy)
    if int(minval) < info.min or int(maxval) - 1 > info.max:
        raise DTypeError(f"randint: [{minval}, {maxval}) does not fit in {type.dtype}")
    b = k.builder
    word = b.convert(bits(k, type), i64) & 0xFFFFFFFF
    offset = (word * span).shift_right_logical(32)
    return b.convert(offset + int(minval), type.dtype)


def permutation(k: Value, x: Any, axis: str) -> Value:
    """`x` shuffled along `axis` (`jax.random.permutation`); for an int `x`, a random order
    of 0..x-1 along a new axis `axis`. The order sorts one 32-bit random key per position.

    >>> import accy
    >>> sorted(accy.random.permutation(accy.random.key(0), 5, "n").array.tolist())
    [0, 1, 2, 3, 4]
    """
    if isinstance(x, int) and not isinstance(x, bool):
        keys = bits(k, TensorType(i32, ((axis, x),)))
        return keys.argsort(axis)
    if not hasattr(x, "ty") or not x.ty.has(axis):
        got = x.ty if hasattr(x, "ty") else repr(x)
        raise AxisError(f"permutation: axis {axis!r} is not on {got}")
    order = bits(k, TensorType(i32, ((axis, x.ty.extent(axis)),))).argsort(axis)
    return x.gather(order, axis)


def choice(
    k: Value, x: Value, axis: str, shape: Any, replace: bool = True, p: Value | None = None
) -> Value:
    """Entries of `x` along `axis` drawn for the axes of `shape` (a dict of extents or a
    TensorType), which take `axis`'s place (`jax.random.choice`, by name): with replacement
    (uniform, or with probabilities `p` along `axis`) or without (a random permutation's first
    entries, or the Gumbel top-k with `p`).

    >>> import accy, numpy as np
    >>> x = accy.named(np.arange(10.0, dtype=np.float32), "n")
    >>> picked = accy.random.choice(accy.random.key(0), x, "n", {"pick": 4}, replace=False)
    >>> picked.axes, len(set(picked.array.tolist()))
    (('pick',), 4)
    """
    if not hasattr(x, "ty") or not x.ty.has(axis):
        got = x.ty if hasattr(x, "ty") else repr(x)
        raise AxisError(f"choice: axis {axis!r} is not on {got}")
    draws = shape_type(shape, None, i32)
    extent = x.ty.extent(axis)
    count = draws.size
    if p is not None and (not hasattr(p, "ty") or p.ty.axes != (axis,)):
        raise AxisError(f"choice: p must be a float array with the one axis {axis!r}")
    if replace:
        if p is None:
            indices = randint(k, draws.with_dtype(i32), 0, extent)
        else:
            logits = p.log().broadcast_to(
                TensorType(p.dtype, (*draws.named_extents, (axis, extent)))
            )
            indices = categorical(k, logits, axis)
        return x.gather(indices, axis)
    if count > extent:
        raise AxisError(
            f"choice: {count} draws without replacement from {extent} entries along {axis!r}"
        )
    if p is None:
        order = bits(k, TensorType(i32, ((axis, extent),))).argsort(axis)
    else:
        _, order = (p.log() + gumbel(k, p.ty)).top_k(extent, axis)
    first = order.slice(axis, 0, count)
    indices = k.builder.reshape(first, draws.named_extents)
    return x.gather(indices, axis)


# -- concrete keys -------------------------------------------------------------------------

_EAGER: dict[tuple, Any] = {}
_ARRAY = object()  # marks an argument passed to the compiled draw rather than baked in


def _runs_compiled(draw):
    """`draw` on a concrete key (a NamedArray, outside any trace) runs as one jitted program,
    cached per draw and static arguments, rather than one eager operation at a time."""

    @functools.wraps(draw)
    def wrapper(k, *args, **kwargs):
        if isinstance(k, Value) or not hasattr(k, "ty"):
            return draw(k, *args, **kwargs)
        if any(isinstance(a, Value) for a in (*args, *kwargs.values())):
            return draw(k, *args, **kwargs)  # a traced operand: the draw is traced with it
        arrays = [a for a in args if hasattr(a, "ty")]
        statics = tuple(_ARRAY if hasattr(a, "ty") else a for a in args)
        cache_key = (draw.__name__, statics, tuple(sorted(kwargs.items())))
        try:
            jitted = _EAGER.get(cache_key)
        except TypeError:  # an unhashable static argument: traced and run once
            jitted, cache_key = None, None
        if jitted is None:
            from .frontend.functions import jit

            def run(key, *given):
                supplied = iter(given)
                full = [next(supplied) if a is _ARRAY else a for a in statics]
                return draw(key, *full, **kwargs)

            jitted = jit(run)
            if cache_key is not None:
                if len(_EAGER) > 256:
                    _EAGER.clear()
                _EAGER[cache_key] = jitted
        return jitted(k, *arrays)

    return wrapper


for _name in (
    "bernoulli",
    "bits",
    "categorical",
    "choice",
    "fold_in",
    "gumbel",
    "normal",
    "permutation",
    "randint",
    "split",
    "split_along",
    "truncated_normal",
    "uniform",
):
    globals()[_name] = _runs_compiled(globals()[_name])
del _name
