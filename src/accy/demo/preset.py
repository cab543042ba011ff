"""`accy demo --preset NAME`: GPT-2 (`accy.models.gpt2`, sized by `demo/gpt2.py`'s `Config`)
over byte-level tokens of the Python standard library's source (`demo/text.py`), trained with
AdamW for a number of steps or a wall time; a progress bar with the loss, tokens/s and (on
cuda) model FLOP utilisation; the held-out loss in nats per byte every `eval_every` steps; a
loss plot and a checkpoint in `out`; a sample decoded greedily (`accy.models.generate`) from a
prompt at the end. The layers are unrolled (`nn.Stacked(unroll=True)`), faster on small
models than a scan.

Presets: `gpt2-small` (12 layers, 12 heads x 64, width 768, context 1024, batch 8: the GPU
job) and `tiny` (2 layers, 2 heads, width 64, context 64, batch 8: the loss goes down on the
CPU within a minute).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import models, nn, random
from ..backends.devices import as_device
from ..errors import AccyError
from ..frontend import jit, named
from . import gpt2
from .common import (
    CHECKPOINT,
    Checkpoint,
    demo_dependency,
    host,
    language_model_step,
    save_checkpoint,
)
from .gpt2 import Config
from .text import VOCAB, ByteText

GPU_PEAK_FLOPS = 989e12  # the H100/H200 dense bf16 peak that bench/WORKLOADS.md uses
PROMPT = b"import os\n\n\ndef "


@dataclass(frozen=True)
class Preset:
    config: Config
    learning_rate: float
    warmup: int
    steps: int  # the default; --minutes may stop sooner
    eval_every: int
    eval_batches: int


PRESETS = {
    "gpt2-small": Preset(
        Config(layers=12, heads=12, width=768, batch=8, tokens=1024, vocab=VOCAB),
        learning_rate=6e-4,
        warmup=100,
        steps=5000,
        eval_every=250,
        eval_batches=8,
    ),
    "tiny": Preset(
        Config(layers=2, heads=2, width=64, batch=8, tokens=64, vocab=VOCAB),
        learning_rate=3e-3,
        warmup=10,
        steps=1500,
        eval_every=25,
        eval_batches=8,
    ),
}


def preset_named(name: str) -> Preset:
    """The preset called `name`, or an error listing the presets.

    >>> preset_named("tiny").config.layers
    2
    """
    if name not in PRESETS:
        raise AccyError(
            f"accy demo --preset {name!r}: no such preset; the presets are "
            f"{', '.join(sorted(PRESETS))}"
        )
    return PRESETS[name]


@dataclass
class Run:
    """What a preset run produced: the per-step training losses, the held-out losses (nats
    per byte) by step, throughput, and the greedy sample."""

    steps: int = 0
    losses: list[float] = field(default_factory=list)
    held_out: list[tuple[int, float]] = field(default_factory=list)
    tokens_per_s: float = 0.0
    mfu: float | None = None
    sample: bytes = b""


def learning_rate(preset: Preset, step: int, progress: float) -> float:
    """Linear warmup over `preset.warmup` steps, then a cosine decay to a tenth of the peak
    as `progress` (the larger of the fractions of steps and of wall time used) goes to 1.

    >>> learning_rate(PRESETS["tiny"], 0, 0.0) == 3e-3 / 10
    True
    """
    peak = preset.learning_rate
    if step < preset.warmup:
        return peak * (step + 1) / preset.warmup
    return peak * (0.1 + 0.45 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


class ByteModel:
    """The model of one preset on one device, `accy.models.gpt2.GPT2` over bytes (its layers
    unrolled), and its jitted functions: the AdamW training step (learning rate as an
    input; `common.language_model_step`), the held-out loss, and greedy decoding
    (`accy.models.generate`)."""

    def __init__(self, preset: Preset, device: str, dtype: str, seed: int = 0):
        self.preset, self.config, self.device = preset, preset.config, device
        c = self.config
        config = models.gpt2.Config(
            vocab=c.vocab, positions=c.tokens, embed=c.width, layers=c.layers, heads=c.heads
        )
        self.model = models.gpt2.GPT2.init(config, random.key(seed), device=device)
        self.model = self.model.replace(blocks=self.model.blocks.replace(unroll=True))
        policy = gpt2.policy_for(dtype)
        self.step, self.params, self.state = language_model_step(
            self.model, device, preset.learning_rate, gpt2.WEIGHT_DECAY, policy
        )

        def loss(model, ids, targets):
            if policy is None:
                return model.loss(ids, targets)
            scores = policy.cast_to_output(policy.cast_to_compute(model)(ids))
            return nn.cross_entropy(scores, targets, "vocab").mean()

        self.loss = jit(loss)

    def ids(self, array: np.ndarray):
        return named(array, ("batch", "token"), device=self.device)

    def held_out_loss(self, params, batches) -> float:
        """Mean cross-entropy over the fixed held-out `batches`, in nats per byte."""
        values = [float(self.loss(params, self.ids(i), self.ids(t))) for i, t in batches]
        return float(np.mean(values))

    def generate(self, params, prompt: bytes, length: int) -> bytes:
        """`length` bytes after `prompt`, each the model's most likely next byte (greedy, with
        a key/value cache); prompt and sample fit in the context."""
        ids = self.ids(np.frombuffer(prompt, np.uint8).astype(np.int32)[None])
        out = models.generate(params, ids, length)
        return bytes(int(b) for b in host(out.array)[0, len(prompt) :])


def train_preset(
    name: str,
    device: str,
    out: Path,
    dtype: str = "f32",
    steps: int | None = None,
    minutes: float | None = None,
    seed: int = 0,
    quiet: bool = False,
    sample_bytes: int = 48,
    text: ByteText | None = None,
) -> Run:
    """Train preset `name`, checkpointing to `out`; stops after `steps` (default the
    preset's) or `minutes` of wall time, whichever comes first; a run with a time limit still
    takes its first step (the held-out loss's compile counts against the limit)."""
    tqdm = demo_dependency("tqdm").tqdm
    preset = preset_named(name)
    c = preset.config
    steps = preset.steps if steps is None else steps
    text = ByteText.load() if text is None else text
    model = ByteModel(preset, device, dtype, seed)
    params, state = model.params, model.state
    held = np.random.default_rng([seed, 1])
    held_batches = [text.batch(held, c.batch, c.tokens, True) for _ in range(preset.eval_batches)]
    flops = gpt2.model_flops(c)
    run = Run()
    started = time.perf_counter()
    budget = None if minutes is None else 60.0 * minutes
    run.held_out.append((0, model.held_out_loss(params, held_batches)))
    progress = tqdm(total=steps, disable=quiet, unit="step", mininterval=0.5)
    progress.write(f"held-out loss before training: {run.held_out[0][1]:.3f} nats/byte")
    training_time, tokens_done = 0.0, 0
    while run.steps < steps:
        elapsed = time.perf_counter() - started
        if budget is not None and elapsed >= budget and run.steps > 0:
            break
        fraction = max(run.steps / steps, elapsed / budget if budget else 0.0)
        rate = learning_rate(preset, run.steps, fraction)
        ids, targets = text.batch(np.random.default_rng([seed, 0, run.steps]), c.batch, c.tokens)
        tick = time.perf_counter()
        value, params, state = model.step(
            params,
            state,
            model.ids(ids),
            model.ids(targets),
            named(np.float32(rate), (), device=device),
        )
        run.losses.append(float(value))  # waits for the step
        seconds = time.perf_counter() - tick
        run.steps += 1
        if run.steps > 1:  # the first step includes tracing and compiling
            training_time += seconds
            tokens_done += c.batch * c.tokens
        else:
            progress.write(f"traced and compiled the training step in {seconds:.1f} s")
        shown = {"loss": f"{run.losses[-1]:.3f}"}
        if training_time > 0:
            run.tokens_per_s = tokens_done / training_time
            shown["tokens/s"] = f"{run.tokens_per_s:,.0f}"
            if as_device(device).is_cuda:
                run.mfu = flops * (run.steps - 1) / training_time / GPU_PEAK_FLOPS
                shown["MFU"] = f"{run.mfu:.1%}"
        progress.set_postfix(shown)
        progress.update(1)
        if run.steps % preset.eval_every == 0:
            run.held_out.append((run.steps, model.held_out_loss(params, held_batches)))
            progress.write(f"step {run.steps}: held-out {run.held_out[-1][1]:.3f} nats/byte")
    progress.close()
    if run.held_out[-1][0] != run.steps:
        run.held_out.append((run.steps, model.held_out_loss(params, held_batches)))
    save_checkpoint(out / CHECKPOINT, Checkpoint(run.steps, run.losses, {"model": params}, state))
    plot(run, out / "loss.png", name)
    run.sample = model.generate(params, PROMPT, sample_bytes)
    return run


def plot(run: Run, path: Path, name: str) -> None:
    """Training loss per step and held-out loss, in nats per byte."""
    matplotlib = demo_dependency("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(np.arange(1, len(run.losses) + 1), run.losses, linewidth=1, label="training")
    steps, values = zip(*run.held_out, strict=True)
    axes.plot(steps, values, "o-", label="held-out files")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy (nats per byte)")
    axes.set_title(f"accy demo --preset {name}: the Python standard library, byte by byte")
    axes.legend()
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def report(run: Run, out: Path) -> None:
    """Print the outcome of a preset run."""
    first, last = run.held_out[0][1], run.held_out[-1][1]
    print(
        f"final held-out loss {last:.3f} nats/byte after {run.steps} steps (before training "
        f"{first:.3f}; uniform over bytes {math.log(256):.3f})"
    )
    mfu = f", MFU {run.mfu:.1%}" if run.mfu is not None else ""
    print(f"throughput {run.tokens_per_s:,.0f} tokens/s{mfu}")
    print(f"sample (greedy) after {PROMPT!r}: {run.sample!r}")
    print(f"loss curve: {out / 'loss.png'}")
    print(f"checkpoint: {out / CHECKPOINT}")
