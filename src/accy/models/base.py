"""What the decoder-only language models share: `CausalLM` (logits, the loss, a key/value
cache and the decode step that `generate` runs), and the host-side conversions between named
arrays and the plain arrays of Hugging Face files.

Axes: ids are {batch, token} (or {token}), logits {batch, token, vocab}; inside, `embed` is the
residual width, `head`/`group`/`dim` the attention heads, `hidden` the MLP width, and `layer`
the stacked layers. A cache is two arrays {layer, batch, key, head, dim} (keys and values) of a
fixed length: `decode` writes this call's tokens into them at `positions`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.types import DType, TensorType, bf16, f16, f32, i32
from ..errors import AxisError, DTypeError
from ..frontend.named import NamedArray, named
from ..nn import functional as F
from ..nn.module import Module
from . import hub

Array = Any
DTYPE_NAMES = {"float32": f32, "bfloat16": bf16, "float16": f16}


def dtype_named(name: Any) -> DType:
    """An accy float dtype from a name in a config ("float32", "bfloat16") or an accy dtype.

    >>> dtype_named("bfloat16"), dtype_named(None)
    (accy.bf16, accy.f32)
    """
    if name is None:
        return f32
    if isinstance(name, DType):
        if not name.is_float:
            raise DTypeError(f"model weights are floats (f32, bf16, f16), not {name}")
        return name
    if name not in DTYPE_NAMES:
        raise DTypeError(
            f"the dtype {name!r} is not one of {', '.join(DTYPE_NAMES)} (or accy.f32, accy.bf16)"
        )
    return DTYPE_NAMES[name]


def hf_dtype_name(dtype: DType) -> str:
    return next(name for name, d in DTYPE_NAMES.items() if d == dtype)


def to_named(array: np.ndarray, axes: Sequence[str], dtype: DType, device: str) -> NamedArray:
    """A host array of a file as a NamedArray of `dtype` (converted on the host).

    >>> import numpy as np
    >>> print(to_named(np.ones((2, 3)), ("a", "b"), f32, "cpu").ty)
    f32[a=2, b=3]
    """
    return named(np.ascontiguousarray(np.asarray(array).astype(dtype.numpy)), tuple(axes), device)


def to_host(x: NamedArray, axes: Sequence[str], dtype: DType | None = None) -> np.ndarray:
    """The NumPy array of `x` with its axes in the order `axes` (whatever its layout).

    >>> import numpy as np
    >>> to_host(to_named(np.zeros((2, 3)), ("a", "b"), f32, "cpu"), ("b", "a")).shape
    (3, 2)
    """
    missing = set(axes) ^ set(x.axes)
    if missing:
        raise AxisError(f"expected the axes {tuple(axes)}, but the array is {x.ty}")
    host = np.transpose(np.asarray(x), [x.axes.index(a) for a in axes])
    return host if dtype is None else host.astype(dtype.numpy)


def weights_dtype(tree: Any) -> DType:
    """The dtype of the model's floating-point arrays (the first found)."""
    import optree

    for leaf in optree.tree_leaves(tree, namespace="accy"):
        if isinstance(leaf, NamedArray) and leaf.dtype.is_float:
            return leaf.dtype
    return f32


class CausalLM(Module):
    """A decoder-only language model. Subclasses hold `blocks` (an `nn.Stacked`) and define
    `embed(ids, positions)`, `block(layer, x, positions, cache)` and `head(x)`, plus
    `kv_heads` and `head_dim` for the cache; for Hugging Face folders, `config_class` (with
    `from_hf`/`to_hf`, and `bos`/`eos` token ids), `model_type`, `from_tensors` and `to_tensors`."""

    @classmethod
    def from_pretrained(
        cls, folder: str | os.PathLike, *, dtype: DType | str = "float32", device: str = "cpu"
    ) -> Any:
        """The model of a local `transformers` folder of this architecture, its weights in
        `dtype` (f32 by default, or accy.bf16 / "bfloat16") on `device`. See `save_pretrained`
        for an example."""
        config = cls.config_class.from_hf(hub.read_config(folder, cls.model_type))
        tensors = hub.read_tensors(folder)
        return cls.from_tensors(config, tensors, dtype=dtype, device=device, where=str(folder))

    def save_pretrained(
        self,
        folder: str | os.PathLike,
        *,
        dtype: DType | str | None = None,
        max_shard_size: str | int | None = None,
    ) -> None:
        """Write a folder that `transformers`' `from_pretrained` loads (GPT2LMHeadModel,
        LlamaForCausalLM, ...): config.json, generation_config.json and the weights in `dtype`
        (default: the model's), one safetensors file or shards of `max_shard_size` ("5GB").

        >>> import accy, tempfile
        >>> config = accy.models.gpt2.Config(vocab=8, positions=8, embed=4, layers=1, heads=2)
        >>> model = accy.models.gpt2.GPT2.init(config, accy.random.key(0))
        >>> folder = tempfile.mkdtemp()
        >>> model.save_pretrained(folder)
        >>> type(accy.models.gpt2.GPT2.from_pretrained(folder)).__name__
        'GPT2'
        """
        tensors = self.to_tensors(dtype)
        dtype = dtype_named(dtype) if dtype is not None else weights_dtype(self)
        cfg = self.config
        config = cfg.to_hf() | {"dtype": hf_dtype_name(dtype)}
        config["torch_dtype"] = config["dtype"]
        hub.write_folder(
            folder,
            config,
            tensors,
            hub.size_in_bytes(max_shard_size),
            # the special token ids, as every model's config holds them (`bos`, `eos`)
            {"generation_config.json": {"bos_token_id": cfg.bos, "eos_token_id": cfg.eos}},
        )

    def __call__(self, ids: Array, *, positions: Array | None = None) -> Array:
        """Next-token logits {..., token, vocab} of integer `ids` {..., token}."""
        positions = self._positions(ids, positions)
        x = self.embed(ids, positions)

        def step(layer, h):
            return self.block(layer, h, positions, None)[0], ()

        x, _ = self.blocks.scan(step, x)
        return self.head(x)

    def decode(self, ids: Array, cache: tuple[Array, Array], positions: Array):
        """Logits of `ids` {batch, token} at `positions` {token}, attending to every cached
        key up to each token's position, and the cache with this call's keys and values
        written in: (logits, cache).

        >>> import accy, numpy as np
        >>> config = accy.models.gpt2.Config(vocab=8, positions=8, embed=4, layers=1, heads=2)
        >>> model = accy.models.gpt2.GPT2.init(config, accy.random.key(0), device="reference")
        >>> ids = accy.named(np.array([[1, 2]], np.int32), ("batch", "token"), "reference")
        >>> at = accy.named(np.array([0, 1], np.int32), "token", "reference")
        >>> logits, cache = model.decode(ids, model.init_cache(1, 8), at)
        >>> logits.shape
        {'batch': 1, 'token': 2, 'vocab': 8}
        >>> cache[0].axes
        ('layer', 'batch', 'key', 'head', 'dim')
        """
        x = self.embed(ids, positions)

        def step(layer, h, keys, values):
            h, (keys, values) = self.block(layer, h, positions, (keys, values))
            return h, (keys, values)

        x, cache = self.blocks.scan(step, x, cache)
        return self.head(x), cache

    def loss(self, ids: Array, targets: Array | None = None) -> Array:
        """The mean next-token cross-entropy of `ids` {batch, token}: as `transformers`' loss
        with `labels=ids` (the logits of every token but the last against the next token),
        or, given `targets` (ids shifted by one), of every token against its target.

        >>> import accy, numpy as np
        >>> config = accy.models.gpt2.Config(vocab=8, positions=8, embed=4, layers=1, heads=2)
        >>> model = accy.models.gpt2.GPT2.init(config, accy.random.key(0), device="reference")
        >>> ids = accy.named(np.array([[1, 2, 3]], np.int32), ("batch", "token"), "reference")
        >>> 1.5 < model.loss(ids).item() < 2.7  # about log 8 for a random model
        True
        """
        if targets is None:
            return next_token_loss(self(ids), ids)
        return F.cross_entropy(self(ids), targets, "vocab").mean()

    def init_cache(
        self, batch: int, length: int, dtype: DType | None = None, device: str | None = None
    ) -> tuple[NamedArray, NamedArray]:
        """An empty cache for `batch` sequences of up to `length` tokens (keys and values,
        each {layer, batch, key, head, dim}, in the model's dtype); see `decode`."""
        dtype = dtype or weights_dtype(self)
        shape = (self.blocks.count, batch, length, self.kv_heads, self.head_dim)
        axes = ("layer", "batch", "key", "head", "dim")
        device = device or self._device()
        return tuple(named(np.zeros(shape, dtype.numpy), axes, device) for _ in range(2))

    def _device(self) -> str:
        import optree

        leaves = optree.tree_leaves(self, namespace="accy")
        return next((x.device for x in leaves if isinstance(x, NamedArray)), "cpu")

    @staticmethod
    def _positions(ids: Array, positions: Array | None) -> Array:
        if positions is not None:
            return positions
        if not ids.ty.has("token"):
            raise AxisError(f"a language model takes ids with a 'token' axis, got {ids.ty}")
        if ids.dtype.is_float:
            raise DTypeError(f"ids are integer token ids, got {ids.ty}")
        t = TensorType(i32, (("token", ids.ty.extent("token")),))
        return ids.builder.iota(t, "token")


def next_token_loss(logits: Array, ids: Array) -> Array:
    """Mean cross-entropy of `logits` {batch, token, vocab} at each token but the last against
    the next token of `ids`.

    >>> import accy, numpy as np
    >>> logits = accy.named(np.zeros((1, 3, 4), np.float32), ("batch", "token", "vocab"))
    >>> ids = accy.named(np.array([[0, 1, 2]], np.int32), ("batch", "token"))
    >>> round(next_token_loss(logits, ids).item(), 4)  # log 4
    1.3863
    """
    tokens = ids.ty.extent("token")
    if tokens < 2:
        raise AxisError(f"the next-token loss needs at least two tokens, got {ids.ty}")
    scores = logits.slice("token", 0, tokens - 1)
    targets = ids.slice("token", 1, tokens)
    return F.cross_entropy(scores, targets, "vocab").mean()


__all__ = ["CausalLM", "dtype_named", "next_token_loss", "to_host", "to_named"]
