"""Language models from `accy.nn` layers, with Hugging Face in and out, and generation.

- `accy.models.gpt2.GPT2` and `accy.models.llama.Llama`: `from_pretrained(folder)` reads a
  local `transformers` folder, `save_pretrained(folder)` writes one `transformers` loads.
- `accy.models.from_pretrained(folder)` picks the model by the folder's `model_type`.
- `accy.models.generate(model, ids, max_new_tokens, ...)`: greedy or sampled decoding with a
  key/value cache, one compiled decode step for every token.
"""

from __future__ import annotations

import os

from ..core.types import DType
from . import gpt2, hub, llama
from .base import CausalLM, next_token_loss
from .generate import generate

ARCHITECTURES = {"gpt2": gpt2.GPT2, "llama": llama.Llama}


def from_pretrained(
    folder: str | os.PathLike, *, dtype: DType | str = "float32", device: str = "cpu"
) -> CausalLM:
    """The model of a local Hugging Face folder, by its config's `model_type` (gpt2, llama).

    >>> import accy, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> config = accy.models.llama.Config(vocab=16, embed=8, hidden=16, layers=1, heads=2)
    >>> accy.models.llama.Llama.init(config, accy.random.key(0)).save_pretrained(folder)
    >>> type(accy.models.from_pretrained(folder)).__name__
    'Llama'
    """
    model_type = hub.read_config(folder).get("model_type")
    if model_type not in ARCHITECTURES:
        raise hub.PretrainedError(
            f"{folder}: model_type {model_type!r} is not one accy reads; it reads "
            f"{', '.join(ARCHITECTURES)}"
        )
    return ARCHITECTURES[model_type].from_pretrained(folder, dtype=dtype, device=device)


__all__ = [
    "CausalLM",
    "from_pretrained",
    "generate",
    "gpt2",
    "hub",
    "llama",
    "next_token_loss",
]
