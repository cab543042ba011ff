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

The scheme is JAX's partitionable one: element `i` (row-major position in the requested type)
gets `threefry2x32(key, (0, i))`, whose two words are xor-ed for 32 bits (`bits`) or joined for
64 (`uniform` of f64); `split` gives key `j` the two words of `threefry2x32(key, (0, j))`. A key
must be used once: either split or drawn from. A key with more axes than `key` (a batch of
keys from `split_along`) draws one independent stream per batch element, broadcast by name.

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

import math

import numpy as np

from .core.types import DType, TensorType, bf16, f16, f32, f64, i32, i64, spec
from .core.value import Value
from .errors import AxisError, DTypeError

KEY = spec(i32, key=2)
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
PARITY = 0x1BD11BDA  # Threefry's key-schedule constant


def key(seed: int) -> np.ndarray:
    """The key of an integer seed as a host array (JAX's raw key: high word, low word).

    >>> key(7).tolist()
    [0, 7]
    """
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32).view(np.int32)


def constant_key(builder, seed: int) -> Value:
    """The key of `seed` as a constant of the program being traced."""
    return builder.constant(key(seed), KEY)


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
    for axis, extent in reversed(type.named_extents):
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


def bits(k: Value, type: TensorType) -> Value:
    """32 random bits per element of `type`'s axes (i32), plus the key's batch axes."""
    high, low = _words(k, type)
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


def uniform(k: Value, type: TensorType, minval: float = 0.0, maxval: float = 1.0) -> Value:
    """Floats uniform in [minval, maxval) of `type` (f32, f64, f16 or bf16).

    23 random bits for f32 (52 for f64) fill the mantissa of a number in [1, 2), minus 1: a
    multiple of 2^-23 in [0, 1), scaled and shifted, then kept at least `minval`.
    """
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


def normal(k: Value, type: TensorType) -> Value:
    """Standard normal floats of `type`: sqrt(2) erf_inv(u) with u uniform in (-1, 1), as JAX.

    >>> import accy
    >>> p = accy.trace.define(
    ...     "n", [KEY], lambda b, a: normal(a[0], accy.spec(accy.f32, n=20000)).mean())
    >>> abs(float(accy.reference.run(p, [key(1)])[0])) < 0.03
    True
    """
    above_minus_one = float(np.nextafter(np.float32(-1.0), np.float32(0.0)))
    if type.dtype == f64:
        above_minus_one = float(np.nextafter(-1.0, 0.0))
    u = uniform(k, type, above_minus_one, 1.0)
    return u.erf_inv() * math.sqrt(2.0)


def bernoulli(k: Value, p, type: TensorType | None = None) -> Value:
    """bool, true with probability `p` (a float or a traced float value; the result has the
    axes of `type` and of `p`)."""
    if type is None:
        if not hasattr(p, "ty"):
            raise AxisError("bernoulli needs a type when p is a Python number")
        type = p.ty
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
