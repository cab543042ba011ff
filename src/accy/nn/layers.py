"""Layers as `Module`s over named axes: `Linear`, `Embedding`, `LayerNorm`, `RMSNorm`,
`Dropout`, `Conv`, `MultiHeadAttention` (grouped-query heads, causal or masked, rotary position
embeddings, a key/value cache), `MLP`, `SwiGLU` and `Stacked` (one layer repeated along a named
axis, run by a scan).

Each layer has an `init` classmethod drawing its parameters from an `accy.random` key and a
`__call__` that works on named arrays (eagerly) and on traced values (inside `accy.jit`).

>>> import accy, numpy as np
>>> lin = accy.nn.Linear.init(accy.random.key(0), {"embed": 4}, {"hidden": 3})
>>> x = accy.named(np.ones((2, 4), np.float32), ("batch", "embed"))
>>> lin(x).shape
{'batch': 2, 'hidden': 3}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import optree

from ..backends.devices import CPU
from ..core import Value
from ..core.types import DType, TensorType, f32, i32
from ..errors import AccyError, AxisError
from ..frontend.named import NamedArray, named
from ..frontend.tracing import NAMESPACE, flatten, innermost, leaf_paths
from . import functional as F
from . import init as initialisers
from .fp8 import fp8_matmul
from .module import Module, decayed, field

Array = Any  # a NamedArray or a traced value


def _names(axes: Mapping[str, int] | Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(axes, str):
        return (axes,)
    return tuple(axes)


def _check_axes(layer: str, x: Array, axes: Sequence[str], role: str) -> None:
    missing = [a for a in axes if not x.ty.has(a)]
    if missing:
        raise AxisError(
            f"{layer}: its input {x.ty} has no {role} axis {', '.join(map(repr, missing))}; "
            f"the layer was built for {', '.join(map(repr, axes))}: rename the input's axes "
            "(x.rename(old, new)) or build the layer with other names"
        )


class Linear(Module):
    """`x` contracted with `weight` {inputs..., outputs...} over the input axes, plus `bias`
    {outputs...} (None: no bias). `x` may have any other (batch) axes. With `fp8` the
    contraction is an FP8 GEMM (`accy.nn.fp8_matmul`; a mixed-precision policy's `fp8=` sets
    it)."""

    weight: Array
    bias: Array | None
    inputs: tuple[str, ...] = field(static=True)
    outputs: tuple[str, ...] = field(static=True)
    fp8: bool = field(static=True, default=False)

    @classmethod
    def init(
        cls,
        key: Any,
        inputs: Mapping[str, int],
        outputs: Mapping[str, int],
        *,
        use_bias: bool = True,
        dtype: DType = f32,
        device: str | None = None,
    ) -> Linear:
        """Weights U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as PyTorch's `nn.Linear`, zero bias.

        >>> import accy
        >>> lin = accy.nn.Linear.init(accy.random.key(0), {"a": 2}, {"head": 3, "dim": 4})
        >>> lin.weight.shape, lin.bias.shape
        ({'a': 2, 'head': 3, 'dim': 4}, {'head': 3, 'dim': 4})
        """
        shape = {**inputs, **outputs}
        if len(shape) != len(inputs) + len(outputs):
            raise AxisError(
                f"Linear: the input axes {tuple(inputs)} and output axes {tuple(outputs)} must "
                "have different names"
            )
        weight = initialisers.he_uniform(
            key, shape, tuple(inputs), gain=1.0 / math.sqrt(3.0), dtype=dtype, device=device
        )
        bias = initialisers.zeros(outputs, dtype, device) if use_bias else None
        return cls(weight, bias, tuple(inputs), tuple(outputs))

    def __call__(self, x: Array) -> Array:
        _check_axes("Linear", x, self.inputs, "input")
        if self.fp8:
            y = fp8_matmul(x, self.weight, self.inputs)
        else:
            y = x.contract(self.weight, self.inputs)
        return y if self.bias is None else y + self.bias


class Embedding(Module):
    """Rows of `weight` {vocab, embed...} picked by integer ids; `unembed` maps back to scores
    over the vocabulary (the transpose, for tied output layers), an FP8 GEMM with `fp8`."""

    weight: Array
    vocab: str = field(static=True, default="vocab")
    fp8: bool = field(static=True, default=False)

    @classmethod
    def init(
        cls,
        key: Any,
        vocab: Mapping[str, int],
        embed: Mapping[str, int],
        *,
        std: float = 1.0,
        dtype: DType = f32,
        device: str | None = None,
    ) -> Embedding:
        """Rows drawn N(0, std²) (PyTorch's default std is 1, GPT-2's 0.02).

        >>> import accy, numpy as np
        >>> e = accy.nn.Embedding.init(accy.random.key(0), {"vocab": 5}, {"embed": 3})
        >>> e(accy.named(np.array([1, 4], np.int32), "token")).shape
        {'token': 2, 'embed': 3}
        """
        (name,) = tuple(vocab)
        weight = initialisers.normal(key, {**vocab, **embed}, std, dtype=dtype, device=device)
        return cls(weight, name)

    @property
    def embed(self) -> tuple[str, ...]:
        return tuple(a for a in self.weight.ty.axes if a != self.vocab)

    def __call__(self, ids: Array) -> Array:
        if ids.dtype.is_float:
            raise AccyError(f"Embedding: ids must be integers, got {ids.ty}")
        return self.weight.gather(ids, self.vocab)

    def unembed(self, x: Array) -> Array:
        """Scores over the vocabulary: `x` contracted with the table over the embedding axes.

        >>> import accy, numpy as np
        >>> e = accy.nn.Embedding.init(accy.random.key(0), {"vocab": 5}, {"embed": 3})
        >>> e.unembed(accy.named(np.ones(3, np.float32), "embed")).shape
        {'vocab': 5}
        """
        _check_axes("Embedding.unembed", x, self.embed, "embedding")
        if self.fp8:
            return fp8_matmul(x, self.weight, self.embed)
        return x.contract(self.weight, self.embed)


class LayerNorm(Module):
    """Layer normalisation over `axis`, times `weight` plus `bias` (either may be None)."""

    weight: Array | None
    bias: Array | None
    axis: str = field(static=True, default="embed")
    eps: float = field(static=True, default=1e-5)

    @classmethod
    def init(
        cls,
        axis: Mapping[str, int],
        *,
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: DType = f32,
        device: str | None = None,
    ) -> LayerNorm:
        """Unit weight, zero bias.

        >>> import accy, numpy as np
        >>> norm = accy.nn.LayerNorm.init({"embed": 2})
        >>> y = norm(accy.named(np.array([1.0, 3.0], np.float32), "embed"))
        >>> [round(v, 4) for v in y.array.tolist()]
        [-1.0, 1.0]
        """
        (name,) = tuple(axis)
        weight = initialisers.ones(axis, dtype, device) if use_weight else None
        bias = initialisers.zeros(axis, dtype, device) if use_bias else None
        return cls(weight, bias, name, eps)

    def __call__(self, x: Array) -> Array:
        _check_axes("LayerNorm", x, (self.axis,), "normalised")
        y = F.layer_norm(x, self.axis, self.eps)
        if self.weight is not None:
            y = y * self.weight
        return y if self.bias is None else y + self.bias


class RMSNorm(Module):
    """x / sqrt(mean(x²) + eps) over `axis`, times `weight`; computed in f32 whatever the
    input's dtype and cast back before the weight, as Llama's."""

    weight: Array | None
    axis: str = field(static=True, default="embed")
    eps: float = field(static=True, default=1e-6)

    @classmethod
    def init(
        cls,
        axis: Mapping[str, int],
        *,
        eps: float = 1e-6,
        dtype: DType = f32,
        device: str | None = None,
    ) -> RMSNorm:
        """Unit weight.

        >>> import accy, numpy as np
        >>> norm = accy.nn.RMSNorm.init({"embed": 2})
        >>> [round(v, 3) for v in norm(accy.named(np.array([3.0, 4.0], np.float32), "embed"))
        ...  .array.tolist()]
        [0.849, 1.131]
        """
        (name,) = tuple(axis)
        return cls(initialisers.ones(axis, dtype, device), name, eps)

    def __call__(self, x: Array) -> Array:
        _check_axes("RMSNorm", x, (self.axis,), "normalised")
        y = F.rms_norm(x.convert(f32), self.axis, self.eps).convert(x.dtype)
        return y if self.weight is None else y * self.weight


class Dropout(Module):
    """Zeroes each element with probability `rate` (scaling the others by 1/(1 - rate)) when
    given a key; without a key (inference) it is the identity."""

    rate: float = field(static=True, default=0.1)

    def __call__(self, x: Array, key: Any = None) -> Array:
        """`x` with dropout drawn from `key` (an `accy.random` key), or `x` when key is None.

        >>> import accy, numpy as np
        >>> x = accy.named(np.ones(4, np.float32), "n", device="reference")
        >>> accy.nn.Dropout(0.5)(x).array.tolist()
        [1.0, 1.0, 1.0, 1.0]
        """
        if key is None or self.rate == 0.0:
            return x
        if isinstance(key, np.ndarray):
            key = named(key, ("key",), x.device if isinstance(x, NamedArray) else CPU)
        elif isinstance(key, NamedArray) and isinstance(x, NamedArray):
            key = key.to(x.device)  # a key (made on the CPU) follows the array it drops from
        return F.dropout(key, x, self.rate)


class Conv(Module):
    """A convolution over the `spatial` axes: `weight` {spatial..., input, output}, `bias`
    {output} (or None). The result has the input's axes with `input` replaced by `output`."""

    weight: Array
    bias: Array | None
    spatial: tuple[str, ...] = field(static=True)
    input: str = field(static=True)
    output: str = field(static=True)
    stride: Any = field(static=True, default=1)
    padding: Any = field(static=True, default="valid")

    @classmethod
    def init(
        cls,
        key: Any,
        kernel: Mapping[str, int],
        input: Mapping[str, int],
        output: Mapping[str, int],
        *,
        stride: Any = 1,
        padding: Any = "valid",
        use_bias: bool = True,
        dtype: DType = f32,
        device: str | None = None,
    ) -> Conv:
        """He-uniform weights over the fan-in (kernel window x input channels), zero bias.

        >>> import accy, numpy as np
        >>> conv = accy.nn.Conv.init(accy.random.key(0), {"h": 3, "w": 3}, {"channel": 2},
        ...                          {"feature": 4}, padding="same")
        >>> conv(accy.named(np.ones((5, 5, 2), np.float32), ("h", "w", "channel"))).shape
        {'h': 5, 'w': 5, 'feature': 4}
        """
        (input_name,), (output_name,) = tuple(input), tuple(output)
        shape = {**kernel, **input, **output}
        fan_in = (*kernel, input_name)
        weight = initialisers.he_uniform(
            key, shape, fan_in, gain=1.0 / math.sqrt(3.0), dtype=dtype, device=device
        )
        bias = initialisers.zeros(output, dtype, device) if use_bias else None
        padding = padding if isinstance(padding, str) else tuple(padding)
        stride = stride if isinstance(stride, int) else tuple(stride)
        return cls(weight, bias, tuple(kernel), input_name, output_name, stride, padding)

    def __call__(self, x: Array) -> Array:
        _check_axes("Conv", x, (*self.spatial, self.input), "spatial or input")
        padding = self.padding if isinstance(self.padding, str) else list(self.padding)
        y = x.conv(self.weight, self.spatial, self.input, self.output, self.stride, padding)
        return y if self.bias is None else y + self.bias


def rope_frequencies(d: int, theta: float, scaling: tuple | None = None) -> np.ndarray:
    """The inverse frequencies theta^(-2i/d) of RoPE over a head dim of `d`, f32; with
    `scaling` = (factor, low_freq_factor, high_freq_factor, original_max_positions), Llama
    3's: long wavelengths divided by `factor`, short ones kept, the band between smoothed (as
    `transformers`' "llama3" rope_type).

    >>> rope_frequencies(4, 10000.0).tolist()
    [1.0, 0.009999999776482582]
    >>> [round(f, 6) for f in rope_frequencies(4, 10000.0, (8.0, 1.0, 4.0, 16)).tolist()]
    [0.576056, 0.00125]
    """
    frequencies = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if scaling is not None:
        factor, low, high, original = scaling
        wavelength = 2 * math.pi / frequencies
        scaled = np.where(wavelength > original / low, frequencies / factor, frequencies)
        smooth = (original / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelength >= original / high) & (wavelength <= original / low)
        frequencies = np.where(medium, smoothed, scaled)
    return frequencies.astype(np.float32)


def rotary(
    x: Array, positions: Array, theta: float, dim: str = "dim", scaling: tuple | None = None
) -> Array:
    """Rotary position embeddings (RoPE) of `x` at integer `positions` (axes shared with `x`,
    e.g. {token}), in Hugging Face's layout: the first and second halves of `dim` are the two
    coordinates of each rotated pair (`rotate_half`), frequencies theta^(-2i/d). Computed in
    f32, returned in `x`'s dtype; `scaling` as `rope_frequencies`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.ones((2, 4), np.float32), ("token", "dim"), device="reference")
    >>> pos = accy.named(np.array([0, 1], np.int32), "token", device="reference")
    >>> [round(v, 3) for v in rotary(x, pos, 10000.0)["token", 1].array.tolist()]
    [-0.301, 0.99, 1.382, 1.01]
    """
    d = x.ty.extent(dim)
    if d % 2:
        raise AxisError(f"rotary: the axis {dim!r} of {x.ty} needs an even extent")
    half = d // 2
    b = x.builder
    inverse = b.constant(rope_frequencies(d, theta, scaling), TensorType(f32, ((dim, half),)))
    angles = positions.convert(f32) * inverse
    cos, sin = angles.cos(), angles.sin()
    wide = x.convert(f32)
    first, second = wide.slice(dim, 0, half), wide.slice(dim, half, d)
    rotated = b.concatenate([first * cos - second * sin, second * cos + first * sin], dim)
    return rotated.convert(x.dtype)


class MultiHeadAttention(Module):
    """Self-attention with named heads: `query` projects `embed` to {head, group, dim} (the
    `group` axis only with grouped-query attention: `group` query heads share each key/value
    head), `key` and `value` to {head, dim}, `output` back to `embed`; the fused
    `nn.attention` underneath. Optionally rotary position embeddings (`rope_theta`).

    Call it on `x` {..., token, embed}: `causal` masks later tokens; `mask`, a bool array of
    the scores' axes ({token, key}, batch axes too) keeps where true; `positions` are the
    tokens' integer positions (RoPE and the cache; default 0, 1, ...). With `cache` (key and
    value arrays {..., key, head, dim} of a fixed length), this call's keys and values are
    written into it at `positions`, the queries attend to every cached key at a position up to
    their own, and the call returns `(output, cache)`.
    """

    query: Linear
    key: Linear
    value: Linear
    output: Linear
    embed: str = field(static=True, default="embed")
    causal: bool = field(static=True, default=True)
    rope_theta: float | None = field(static=True, default=None)
    rope_scaling: tuple | None = field(static=True, default=None)  # see `rope_frequencies`

    @classmethod
    def init(
        cls,
        key: Any,
        embed: Mapping[str, int],
        heads: int,
        head_dim: int,
        *,
        kv_heads: int | None = None,
        causal: bool = True,
        rope_theta: float | None = None,
        use_bias: bool = True,
        dtype: DType = f32,
        device: str | None = None,
    ) -> MultiHeadAttention:
        """`heads` query heads of `head_dim`, `kv_heads` key/value heads (default `heads`; it
        must divide `heads`).

        >>> import accy, numpy as np
        >>> mha = accy.nn.MultiHeadAttention.init(accy.random.key(0), {"embed": 8}, 4, 2,
        ...                                       kv_heads=2, rope_theta=10000.0)
        >>> mha.query.weight.shape
        {'embed': 8, 'head': 2, 'group': 2, 'dim': 2}
        >>> x = accy.named(np.ones((3, 8), np.float32), ("token", "embed"))
        >>> mha(x).shape
        {'token': 3, 'embed': 8}
        """
        kv_heads = heads if kv_heads is None else kv_heads
        if heads % kv_heads:
            raise AxisError(
                f"MultiHeadAttention: kv_heads ({kv_heads}) must divide heads ({heads})"
            )
        (embed_name,) = tuple(embed)
        group = heads // kv_heads
        query_axes = (
            {"head": kv_heads} | ({"group": group} if group > 1 else {}) | {"dim": head_dim}
        )
        kq, kk, kv, ko = initialisers.split(key, 4)
        options = {"use_bias": use_bias, "dtype": dtype, "device": device}
        return cls(
            Linear.init(kq, embed, query_axes, **options),
            Linear.init(kk, embed, {"head": kv_heads, "dim": head_dim}, **options),
            Linear.init(kv, embed, {"head": kv_heads, "dim": head_dim}, **options),
            Linear.init(ko, query_axes, embed, **options),
            embed_name,
            causal,
            rope_theta,
        )

    @property
    def grouped(self) -> bool:
        return "group" in self.query.outputs

    def __call__(
        self,
        x: Array,
        *,
        mask: Array | None = None,
        positions: Array | None = None,
        cache: tuple[Array, Array] | None = None,
        key: Any = None,
    ):
        _check_axes("MultiHeadAttention", x, ("token", self.embed), "token or embedding")
        q, k, v = self.query(x), self.key(x), self.value(x)
        if positions is None and (self.rope_theta is not None or cache is not None):
            positions = x.builder.iota(TensorType(i32, (("token", x.ty.extent("token")),)), "token")
        if self.rope_theta is not None:
            q, k = (
                rotary(t, positions, self.rope_theta, scaling=self.rope_scaling) for t in (q, k)
            )
        if cache is not None:
            return self._attend_cached(q, k, v, positions, cache, mask)
        k, v = k.rename("token", "key"), v.rename("token", "key")
        bias = None
        if mask is not None:
            if self.causal:
                t = TensorType(i32, (("token", q.ty.extent("token")), ("key", k.ty.extent("key"))))
                mask = mask & (q.builder.iota(t, "key") <= q.builder.iota(t, "token"))
            bias = _mask_bias(mask, q.dtype)
        # Grouped-query heads: k and v without the query's `group` axis (cuDNN reads them so).
        groups = ("group",) if self.grouped else ()
        mixed = F.attention(
            q, k, v, causal=self.causal and bias is None, bias=bias, group_axes=groups
        )
        return self.output(mixed)

    def _shared(self, k: Array, v: Array, q: Array) -> tuple[Array, Array]:
        """Keys and values broadcast along the query's `group` axis (grouped-query heads),
        laid out as the query, {..., head, group, dim}: cuDNN's fused attention merges
        (head, group) into one dimension of its heads in every operand."""
        if not self.grouped:
            return k, v
        extent = ("group", q.ty.extent("group"))

        def spread(t: Array) -> Array:
            named = list(t.ty.named_extents)
            at = t.ty.axes.index("head") + 1 if t.ty.has("head") else len(named)
            return t.broadcast_to(TensorType(t.dtype, (*named[:at], extent, *named[at:])))

        return spread(k), spread(v)

    def _attend_cached(self, q, k, v, positions, cache, mask):
        cached_k, cached_v = cache
        b = q.builder
        # This call's keys and values go to the rows of their positions (a scatter that sets:
        # the cache keeps its length, and one compiled step serves every position).
        new_k = cached_k.scatter(positions, k, "key", combine="set")
        new_v = cached_v.scatter(positions, v, "key", combine="set")
        keys = new_k.ty.extent("key")
        key_positions = b.iota(TensorType(i32, (("key", keys),)), "key")
        visible = key_positions <= positions
        if mask is not None:
            visible = visible & mask
        bias = _mask_bias(visible, q.dtype)
        mixed = F.attention(q, *self._shared(new_k, new_v, q), bias=bias)
        return self.output(mixed), (new_k, new_v)


def _mask_bias(mask: Array, dtype: DType) -> Array:
    """0 where `mask` holds, -inf elsewhere, in `dtype`: the additive form of a boolean mask."""
    if mask.dtype.is_float:
        raise AccyError(f"an attention mask is a bool array (true: attend), got {mask.ty}")
    b = mask.builder
    return b.select(mask, b.scalar(dtype, 0.0), b.scalar(dtype, float("-inf")))


class MLP(Module):
    """`down(activation(up(x)))`: two `Linear`s around an activation (GELU by default)."""

    up: Linear
    down: Linear
    activation: Callable = field(static=True, default=F.gelu)

    @classmethod
    def init(
        cls,
        key: Any,
        embed: Mapping[str, int],
        hidden: Mapping[str, int],
        *,
        activation: Callable = F.gelu,
        use_bias: bool = True,
        dtype: DType = f32,
        device: str | None = None,
    ) -> MLP:
        """
        >>> import accy, numpy as np
        >>> mlp = accy.nn.MLP.init(accy.random.key(0), {"embed": 4}, {"hidden": 16})
        >>> mlp(accy.named(np.ones(4, np.float32), "embed")).shape
        {'embed': 4}
        """
        k1, k2 = initialisers.split(key)
        options = {"use_bias": use_bias, "dtype": dtype, "device": device}
        return cls(
            Linear.init(k1, embed, hidden, **options),
            Linear.init(k2, hidden, embed, **options),
            activation,
        )

    def __call__(self, x: Array) -> Array:
        return self.down(self.activation(self.up(x)))


class SwiGLU(Module):
    """`down(silu(gate(x)) * up(x))`, Llama's MLP (no biases by default)."""

    gate: Linear
    up: Linear
    down: Linear

    @classmethod
    def init(
        cls,
        key: Any,
        embed: Mapping[str, int],
        hidden: Mapping[str, int],
        *,
        use_bias: bool = False,
        dtype: DType = f32,
        device: str | None = None,
    ) -> SwiGLU:
        """Gate, up and down projections initialised as `Linear.init` (no bias by default).

        >>> import accy, numpy as np
        >>> mlp = accy.nn.SwiGLU.init(accy.random.key(0), {"embed": 4}, {"hidden": 8})
        >>> mlp(accy.named(np.ones(4, np.float32), "embed")).shape
        {'embed': 4}
        """
        k1, k2, k3 = initialisers.split(key, 3)
        options = {"use_bias": use_bias, "dtype": dtype, "device": device}
        return cls(
            Linear.init(k1, embed, hidden, **options),
            Linear.init(k2, embed, hidden, **options),
            Linear.init(k3, hidden, embed, **options),
        )

    def __call__(self, x: Array) -> Array:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def _trace_of(values: Sequence[Any]) -> Any:
    """The builder of the trace the values belong to (the innermost), or None if all are
    concrete named arrays."""
    found = innermost(values)
    if found is not None:
        return found
    return next((v.builder for v in values if isinstance(v, Value)), None)


class Stacked(Module):
    """One layer repeated along the axis `axis`: `layers` is a module whose every array has
    that axis first (the parameters of all the layers, stacked), as Haliax's `Stacked`. Inside
    a traced function the layers run as one `scan` over the axis (so the program, and its
    compile time, do not grow with depth; `remat` recomputes each layer's intermediates in the
    backward pass instead of storing them); with `unroll`, or on named arrays outside any
    trace, as a loop over its slices (a program that grows with depth, but on small models on
    the CPU a faster one)."""

    layers: Module
    axis: str = field(static=True, default="layer")
    remat: bool = field(static=True, default=False)
    unroll: bool = field(static=True, default=False)

    @classmethod
    def init(
        cls,
        count: int,
        make: Callable[[Any], Module],
        key: Any,
        *,
        axis: str = "layer",
        remat: bool = False,
    ) -> Stacked:
        """`count` layers `make(key_i)`, their arrays stacked along `axis`.

        >>> import accy
        >>> def make(key):
        ...     return accy.nn.Linear.init(key, {"embed": 4}, {"hidden": 4})
        >>> s = accy.nn.Stacked.init(3, make, accy.random.key(0))
        >>> s.layers.weight.axes, s.count
        (('layer', 'embed', 'hidden'), 3)
        """
        return cls.stack([make(k) for k in initialisers.split(key, count)], axis, remat)

    @classmethod
    def stack(cls, layers: Sequence[Module], axis: str = "layer", remat: bool = False) -> Stacked:
        """The modules `layers` (one structure) as one `Stacked` along `axis`.

        >>> import accy
        >>> norms = [accy.nn.LayerNorm.init({"embed": 2}) for _ in range(3)]
        >>> accy.nn.Stacked.stack(norms).layers.weight.shape
        {'layer': 3, 'embed': 2}
        """
        if not layers:
            raise AccyError("Stacked needs at least one layer")

        def join(*arrays):
            first = arrays[0]
            return named(
                np.stack([np.asarray(a) for a in arrays]), (axis, *first.axes), first.device
            )

        return cls(optree.tree_map(join, *layers, namespace=NAMESPACE), axis, remat)

    @property
    def count(self) -> int:
        leaves = optree.tree_leaves(self.layers, namespace=NAMESPACE)
        return leaves[0].ty.extent(self.axis)

    def layer(self, index: int) -> Module:
        """The `index`-th layer (its arrays without `axis`).

        >>> import accy
        >>> s = accy.nn.Stacked.stack([accy.nn.LayerNorm.init({"embed": 2})] * 2)
        >>> s.layer(1).weight.shape
        {'embed': 2}
        """
        return optree.tree_map(lambda a: a[self.axis, index], self.layers, namespace=NAMESPACE)

    def __call__(self, x: Array, *args: Any, **kwargs: Any) -> Array:
        """`x` through every layer in turn: `layer(x, *args, **kwargs)`.

        >>> import accy, numpy as np
        >>> s = accy.nn.Stacked.init(2, lambda k: accy.nn.LayerNorm.init({"embed": 2}),
        ...                          accy.random.key(0))
        >>> [round(v, 4) for v in s(accy.named(np.array([1.0, 3.0], np.float32), "embed"))
        ...  .array.tolist()]
        [-1.0, 1.0]
        """
        final, _ = self.scan(lambda layer, h: (layer(h, *args, **kwargs), ()), x)
        return final

    def scan(self, fn: Callable, carry: Array, xs: Sequence[Array] = ()) -> tuple[Array, tuple]:
        """Fold `fn(layer, carry, *x_slices) -> (carry, ys)` over the layers: `xs` are arrays
        with `axis` (one slice per layer: a key/value cache), `ys` a tuple of arrays, returned
        stacked along `axis`. Returns (final carry, stacked ys).

        >>> import accy, numpy as np
        >>> s = accy.nn.Stacked.stack([accy.nn.LayerNorm.init({"embed": 2})] * 3)
        >>> x = accy.named(np.array([1.0, 3.0], np.float32), "embed")
        >>> final, (means,) = s.scan(lambda layer, h: (layer(h), (h.sum(),)), x)
        >>> means.shape
        {'layer': 3}
        """
        leaves, treedef = optree.tree_flatten(self.layers, namespace=NAMESPACE)
        xs = list(xs)
        builder = _trace_of([carry, *leaves, *xs])
        if builder is None or self.unroll:
            return self._loop(fn, carry, xs)
        width = len(leaves)

        def body(_, args):
            layer = treedef.unflatten(list(args[1 : 1 + width]))
            new, ys = fn(layer, args[0], *args[1 + width :])
            return (new, *ys)

        (final,), ys = builder.scan(
            body, carries=[carry], xs=[*leaves, *xs], axis=self.axis, remat=self.remat
        )
        return final, tuple(ys)

    def _loop(self, fn: Callable, carry: Array, xs: list[Array]) -> tuple[Array, tuple]:
        outputs = []
        for index in range(self.count):
            carry, ys = fn(self.layer(index), carry, *(x[self.axis, index] for x in xs))
            outputs.append(ys)
        if not outputs[0]:
            return carry, ()
        return carry, tuple(self._stack([y[i] for y in outputs]) for i in range(len(outputs[0])))

    def _stack(self, values: list[Array]) -> Array:
        """Per-layer arrays as one array with `axis` first (traced values: a concatenation)."""
        first = values[0]
        if all(isinstance(v, NamedArray) for v in values):
            return named(
                np.stack([np.asarray(v) for v in values]), (self.axis, *first.axes), first.device
            )
        b = _trace_of(values)
        shaped = [b.reshape(v, ((self.axis, 1), *v.ty.named_extents)) for v in values]
        return b.concatenate(shaped, self.axis)


def decay_mask(tree: Any) -> list[bool]:
    """Per leaf of `tree` (in `flatten` order), whether weight decay applies (`decayed`, each
    leaf judged as one layer holds it: the axis a `Stacked` adds does not make a stacked gain a
    matrix): `adamw`'s `mask` for an optimizer over the leaves, as nanoGPT decays.

    >>> import accy
    >>> norms = accy.nn.Stacked.stack([accy.nn.LayerNorm.init({"embed": 2})] * 3)
    >>> lin = accy.nn.Linear.init(accy.random.key(0), {"a": 2}, {"b": 3})
    >>> accy.nn.decay_mask({"norms": norms, "lin": lin})
    [True, False, False, False]
    """
    stacks = _stacked_axes(tree, "")
    leaves = flatten(tree)[0]
    return [
        decayed(path, leaf, [axis for prefix, axis in stacks if path.startswith(prefix)])
        for path, leaf in zip(leaf_paths(tree), leaves, strict=True)
    ]


def _stacked_axes(tree: Any, prefix: str) -> list[tuple[str, str]]:
    """(path prefix of its layers' leaves, axis) for each `Stacked` in `tree`, nested ones too."""
    found = []
    paths, nodes, _ = optree.tree_flatten_with_path(
        tree, is_leaf=lambda node: isinstance(node, Stacked), namespace=NAMESPACE
    )
    for path, node in zip(paths, nodes, strict=True):
        if isinstance(node, Stacked):
            where = prefix + "".join(f"[{p!r}]" for p in path) + "['layers']"
            found += [(where, node.axis), *_stacked_axes(node.layers, where)]
    return found


__all__ = [
    "Conv",
    "Dropout",
    "Embedding",
    "LayerNorm",
    "Linear",
    "MLP",
    "MultiHeadAttention",
    "RMSNorm",
    "Stacked",
    "SwiGLU",
    "decay_mask",
    "rotary",
]
