"""`accy demo --preset finetune --from FOLDER`: fine-tune a Hugging Face checkpoint folder
(GPT-2 or Llama, read by `accy.models.from_pretrained`) on the Python standard library's
source (`demo/text.py`), then save it with `save_pretrained` into `OUT/finetuned` (a folder
`transformers` loads), printing the held-out loss and a greedy sample before and after.

Tokens: with a `tokenizer.json` in the folder (and the `tokenizers` package), the text is
tokenized with it and samples are decoded with it (the tokenizer files are copied to the
saved folder); without one, tokens are bytes, which needs a vocabulary of at least 256.
Training: AdamW (weight decay 0.1 on the matrices: `accy.nn.partition` by `nn.decayed`), a
warmup and cosine schedule given to the one jitted step as an input, windows of up to 64 tokens.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import optim
from ..errors import AccyError
from ..frontend import jit, named
from ..models import from_pretrained, generate
from ..models.base import to_host
from .text import ByteText

PROMPT = "import os\n\n\ndef "
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)
LEARNING_RATE, WARMUP, BATCH, WINDOW = 3e-4, 10, 8, 64


class Tokens:
    """Text to token ids and back: the folder's tokenizer, or bytes."""

    def __init__(self, folder: Path, vocab: int):
        self.tokenizer = None
        if (folder / "tokenizer.json").is_file():
            try:
                from tokenizers import Tokenizer
            except ImportError:
                Tokenizer = None
            if Tokenizer is not None:
                self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        if self.tokenizer is None and vocab < 256:
            raise AccyError(
                f"accy demo --preset finetune: {folder} has no tokenizer.json (or the tokenizers "
                f"package is missing), so the text is bytes, but the model's vocabulary has "
                f"{vocab} tokens (bytes need 256)"
            )

    def encode(self, data: np.ndarray) -> np.ndarray:
        if self.tokenizer is None:
            return data.astype(np.int32)
        text = bytes(data).decode("utf-8", errors="replace")
        return np.asarray(self.tokenizer.encode(text).ids, np.int32)

    def decode(self, ids: np.ndarray) -> str:
        if self.tokenizer is None:
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
        return self.tokenizer.decode([int(i) for i in ids])


@dataclass
class Finetune:
    """What a fine-tuning run produced."""

    steps: int = 0
    losses: list[float] = field(default_factory=list)
    held_out_before: float = 0.0
    held_out_after: float = 0.0
    sample_before: str = ""
    sample_after: str = ""
    saved: Path | None = None


def windows(tokens: np.ndarray, rng: np.random.Generator, size: int, length: int) -> np.ndarray:
    """`size` random windows of `length` tokens."""
    if len(tokens) <= length:
        raise AccyError(f"the text has {len(tokens)} tokens, fewer than a window of {length}")
    starts = rng.integers(0, len(tokens) - length, size)
    return np.stack([tokens[s : s + length] for s in starts]).astype(np.int32)


def finetune(
    folder: Path,
    device: str,
    out: Path,
    steps: int = 200,
    seed: int = 0,
    quiet: bool = False,
    text: ByteText | None = None,
    sample_tokens: int = 32,
    learning_rate: float = LEARNING_RATE,
) -> Finetune:
    """Fine-tune the model of `folder` for `steps` steps at a peak `learning_rate` and save it
    into `out/finetuned`."""
    from .common import demo_dependency, language_model_step

    tqdm = demo_dependency("tqdm").tqdm
    folder = Path(folder)
    model = from_pretrained(folder, device=device)
    tokens = Tokens(folder, model.config.vocab)
    text = ByteText.load(max_bytes=1_000_000) if text is None else text
    train, held = tokens.encode(text.train), tokens.encode(text.held_out)
    length = min(WINDOW, model.config.positions)  # the training windows: ids and targets
    held_batches = [
        windows(held, np.random.default_rng([seed, 1, i]), BATCH, length) for i in range(4)
    ]
    loss = jit(lambda m, ids: m.loss(ids))

    def held_out(m) -> float:
        return float(
            np.mean([loss(m, named(b, ("batch", "token"), device)).item() for b in held_batches])
        )

    prompt = tokens.encode(np.frombuffer(PROMPT.encode(), np.uint8))[None]
    sample_tokens = min(sample_tokens, model.config.positions - prompt.shape[1])

    def sample(m) -> str:
        ids = generate(m, named(prompt, ("batch", "token"), device), sample_tokens)
        return tokens.decode(to_host(ids, ("batch", "token"))[0, prompt.shape[1] :])

    run = Finetune(held_out_before=held_out(model), sample_before=sample(model))
    step, params, states = language_model_step(model, device, learning_rate)
    for number in tqdm(range(steps), disable=quiet, unit="step", mininterval=0.5):
        window = windows(train, np.random.default_rng([seed, 0, number]), BATCH, length + 1)
        ids, targets = (
            named(w, ("batch", "token"), device) for w in (window[:, :-1], window[:, 1:])
        )
        rate = optim.warmup_cosine(number + 1, steps, learning_rate, WARMUP)
        value, params, states = step(
            params, states, ids, targets, named(np.float32(rate), (), device)
        )
        run.losses.append(value.item())
        run.steps += 1
    model = params
    run.held_out_after, run.sample_after = held_out(model), sample(model)
    run.saved = out / "finetuned"
    model.save_pretrained(run.saved)
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, run.saved / name)
    return run


def report(run: Finetune) -> None:
    """Print the outcome of a fine-tuning run."""
    print(
        f"held-out loss {run.held_out_before:.3f} -> {run.held_out_after:.3f} nats/token "
        f"after {run.steps} steps"
    )
    print(f"sample before (greedy) after {PROMPT!r}: {run.sample_before!r}")
    print(f"sample after  (greedy) after {PROMPT!r}: {run.sample_after!r}")
    print(f"fine-tuned model (transformers loads it): {run.saved}")
