"""Generation: greedy or sampled decoding with a key/value cache.

`generate(model, ids, max_new_tokens)` runs two jitted programs: a prefill over the prompt
(one compile per prompt length) that fills the cache and picks the first new token, and one
decode step over a single token that is reused for every further token (the same signature
each time: the position is an input, not a constant). The cache has a fixed length (prompt +
new tokens); each step writes its keys and values into it with a scatter (the named-axis
`dynamic_update_slice`), and on "cpu" and "cuda" the cache is donated, so the step updates it
in place. Sampling (temperature, top-k, top-p) happens inside the step too, from an
`accy.random` key split once per token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import random
from ..backends.devices import Device, as_device
from ..core.types import TensorType, f32, i32
from ..errors import AccyError, AxisError
from ..frontend import jit
from ..frontend.named import NamedArray, named
from ..nn.functional import softmax
from .base import CausalLM, to_host


def _filtered(scores: Any, top_k: int | None, top_p: float | None) -> Any:
    """`scores` {..., vocab} with -inf outside the `top_k` largest and outside the smallest
    set of most likely tokens whose probability reaches `top_p` (the most likely is kept)."""
    b = scores.builder
    low = b.scalar(scores.dtype, float("-inf"))
    if top_k is not None:
        values, _ = scores.top_k(top_k, "vocab")
        threshold = values.min("vocab")
        scores = b.select(scores < threshold, low, scores)
    if top_p is not None and top_p < 1.0:
        probabilities = softmax(scores, "vocab")
        ordered = probabilities.sort("vocab", descending=True)
        before = ordered.cumsum("vocab") - ordered  # the mass of the more likely tokens
        kept = b.select(before < top_p, ordered, b.scalar(ordered.dtype, float("inf")))
        smallest = kept.min("vocab")
        scores = b.select(probabilities < smallest, low, scores)
    return scores


def _step(model, cache, ids, start, key, temperature, *, top_k=None, top_p=None, sample=False):
    """Logits of `ids` {batch, token} at positions start, start + 1, ...; the next token of
    each sequence (argmax, or drawn from the filtered softmax at `temperature`); the cache
    with the keys and values written; the next key."""
    tokens = ids.ty.extent("token")
    positions = ids.builder.iota(TensorType(i32, (("token", tokens),)), "token") + start
    logits, cache = model.decode(ids, cache, positions)
    last = logits["token", tokens - 1].convert(f32)
    if not sample:
        return last.argmax("vocab"), cache, key
    scores = _filtered(last / temperature, top_k, top_p)
    key, drawn = random.split(key)
    return random.categorical(drawn, scores, "vocab"), cache, key


def _prefill(*args: Any, **options: Any) -> Any:
    return _step(*args, **options)


def _decode(*args: Any, **options: Any) -> Any:
    return _step(*args, **options)


_STATICS = ("top_k", "top_p", "sample")
# One jitted step per phase (two functions, so that `accy.jit`'s cache per function keeps their
# traces apart and `traces` counts the decode step's compiles alone) and per whether the device
# takes donations (the cache is then updated in place).
_STEPS = {
    (phase, donating): jit(
        function, static_argnames=_STATICS, donate_argnums=(1,) if donating else ()
    )
    for phase, function in (("prefill", _prefill), ("decode", _decode))
    for donating in (True, False)
}


def _compiled(phase: str, device: str | Device) -> Any:
    return _STEPS[phase, as_device(device).takes_donations]


def decode_step(device: str | Device):
    """The jitted single-token step of `device` (its `traces` count its compiles)."""
    return _compiled("decode", device)


def _check(model: Any, ids: Any, max_new_tokens: int, temperature, top_k, top_p) -> None:
    if not isinstance(model, CausalLM):
        raise AccyError(
            f"generate takes an accy.models language model (GPT2, Llama), got "
            f"{type(model).__name__}"
        )
    if (
        not isinstance(ids, NamedArray)
        or ids.dtype.is_float
        or set(ids.axes)
        != {
            "batch",
            "token",
        }
    ):
        shown = ids.ty if isinstance(ids, NamedArray) else type(ids).__name__
        raise AxisError(
            f"generate: ids are integer token ids named ('batch', 'token'), got {shown}; "
            "accy.named(np.array([[...]], np.int32), ('batch', 'token'))"
        )
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise AccyError(f"generate: max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if top_k is not None and not (isinstance(top_k, int) and top_k >= 1):
        raise AccyError(f"generate: top_k must be a positive int or None, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise AccyError(f"generate: top_p must be in (0, 1], got {top_p!r}")
    if temperature is not None and not temperature > 0.0:
        raise AccyError(
            f"generate: temperature must be above 0, got {temperature!r} (for greedy decoding "
            "pass no key)"
        )
    limit = getattr(model.config, "positions", None)
    total = ids.ty.extent("token") + max_new_tokens
    if limit is not None and total > limit:
        raise AccyError(
            f"generate: {total} tokens (prompt {ids.ty.extent('token')} + {max_new_tokens} new) "
            f"exceed the model's {limit} positions"
        )


def generate(
    model: CausalLM,
    ids: NamedArray,
    max_new_tokens: int,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    key: Any = None,
    cache_length: int | None = None,
) -> NamedArray:
    """The prompt `ids` {batch, token} followed by `max_new_tokens` generated tokens each
    (i32 {batch, token}). Without a `key`, greedy decoding (the most likely token, the first
    of ties, as `transformers`' `generate(do_sample=False)`); with one (`accy.random.key`),
    sampling at `temperature` (default 1) from the `top_k` most likely tokens and the
    smallest set reaching probability `top_p`. Every sequence of the batch is as long as the
    prompt (no padding); generation runs on the model's device. The cache holds
    `cache_length` tokens (default: the model's positions, so that every call with the same
    batch reuses the same two compiled steps; at least prompt + new tokens).

    >>> import accy, numpy as np
    >>> config = accy.models.gpt2.Config(vocab=16, positions=12, embed=8, layers=1, heads=2)
    >>> model = accy.models.gpt2.GPT2.init(config, accy.random.key(0), device="reference")
    >>> prompt = accy.named(np.array([[1, 2]], np.int32), ("batch", "token"), "reference")
    >>> accy.models.generate(model, prompt, 4).shape
    {'batch': 1, 'token': 6}
    """
    _check(model, ids, max_new_tokens, temperature, top_k, top_p)
    device = model._device()
    ids = ids.to(device)
    batch, prompt = ids.ty.extent("batch"), ids.ty.extent("token")
    needed = prompt + max_new_tokens
    length = cache_length or getattr(model.config, "positions", None) or needed
    if length < needed:
        raise AccyError(
            f"generate: cache_length {length} is below the prompt + new tokens ({needed})"
        )
    cache = model.init_cache(batch, length, device=device)
    sample = key is not None
    options = {"top_k": top_k, "top_p": top_p, "sample": sample}
    key = key if sample else random.key(0)
    key = (
        key.to(device) if isinstance(key, NamedArray) else named(np.asarray(key), ("key",), device)
    )
    heat = named(np.float32(1.0 if temperature is None else temperature), (), device)
    token, cache, key = _compiled("prefill", device)(
        model, cache, ids, named(np.int32(0), (), device), key, heat, **options
    )
    produced = [to_host(token, ("batch",))]
    decode = _compiled("decode", device)
    for position in range(prompt, prompt + max_new_tokens - 1):
        step_ids = named(produced[-1].reshape(batch, 1), ("batch", "token"), device)
        start = named(np.int32(position), (), device)
        token, cache, key = decode(model, cache, step_ids, start, key, heat, **options)
        produced.append(to_host(token, ("batch",)))
    new = np.stack(produced, axis=1).astype(np.int32)
    whole = np.concatenate([to_host(ids, ("batch", "token")).astype(np.int32), new], axis=1)
    return named(whole, ("batch", "token"), device)


__all__ = ["decode_step", "generate"]
