"""`accy demo`: train the named-axis transformer on the sorting task, end to end.

One compiled program does a whole training step (loss, gradients through `value_and_grad`,
and the Adam update); another gives the logits used to decode held-out samples greedily.
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from .. import optim
from ..core import Program
from ..errors import AccyError, RuntimeUnavailable
from .data import VOCAB, SortingTask
from .model import Config, initial_parameters, loss_program, parameter_specs, predict_program

DEFAULT_STEPS = 2000
PEAK_LEARNING_RATE = 3e-3
WARMUP = 100
HELD_OUT_SEED_OFFSET = 1_000_003


@dataclass
class TrainingState:
    step: int
    parameters: list[np.ndarray]
    optimizer_state: list[np.ndarray]
    losses: list[float]


def demo_dependency(name: str) -> ModuleType:
    """Module `name` of the `demo` extra (tqdm, matplotlib), or an error saying how to get it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise RuntimeUnavailable(
            f"accy demo needs {name}, which is part of accy's 'demo' extra; install it with "
            f"pip install 'accy[demo]'"
        ) from None


def executable(program: Program, device: str) -> Callable[..., list[np.ndarray]]:
    """A function running `program` on `device` ("cpu", "cuda" or "reference")."""
    if device == "reference":
        from .. import reference

        return lambda *arrays: reference.run(program, arrays)
    from .. import compile as compile_program

    return compile_program(program, device=device)


def host(array) -> np.ndarray:
    """A NumPy array for `array`, copying it from the GPU when it lives there (CuPy)."""
    return array.get() if hasattr(array, "get") else np.asarray(array)


def save_checkpoint(path: Path, state: TrainingState) -> None:
    """Write the checkpoint atomically: a temporary file in the same folder, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"param_{i}": host(p) for i, p in enumerate(state.parameters)}
    arrays |= {f"opt_{i}": host(s) for i, s in enumerate(state.optimizer_state)}
    arrays["step"] = np.array(state.step)
    arrays["losses"] = np.array(state.losses, np.float64)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as file:
            np.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path, parameters: int, slots: int) -> TrainingState:
    """The state saved at `path`; a file that is not a whole checkpoint (empty, truncated,
    corrupted, or from another model) is an `AccyError` that says how to start over."""
    try:
        # Opened here, not by np.load, which leaves the file open when the archive is damaged.
        with open(path, "rb") as file, np.load(file) as data:
            return TrainingState(
                step=int(data["step"]),
                parameters=[data[f"param_{i}"] for i in range(parameters)],
                optimizer_state=[data[f"opt_{i}"] for i in range(slots)],
                losses=[float(x) for x in data["losses"]],
            )
    # np.load reads the archive lazily: a damaged one fails in any of these, as any member is read.
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as error:
        reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise AccyError(
            f"cannot resume: the checkpoint at {path} is damaged or incomplete ({reason}); "
            f"delete it to start over, or run without --resume (which overwrites it)"
        ) from None


def decode(logits_of, parameters, task: SortingTask, inputs: np.ndarray) -> np.ndarray:
    """Greedy decoding: fill in the sorted half one token at a time from the model's choices."""
    ids = inputs.copy()
    ids[:, task.length + 1 :] = 0  # hide the answer
    for position in range(task.length, task.tokens):
        (scores,) = logits_of(*parameters, ids)
        choice = host(scores)[:, position, :].argmax(axis=-1)
        if position + 1 < task.tokens:
            ids[:, position + 1] = choice
        else:
            last = choice
    answer = np.concatenate([ids[:, task.length + 1 :], last[:, None]], axis=1)
    return answer


def evaluate(logits_of, parameters, task, config, seed, batches=8):
    """Held-out accuracy: per sorted token, and per whole sequence, with greedy decoding."""
    rng = np.random.default_rng(seed + HELD_OUT_SEED_OFFSET)
    token_hits = sequence_hits = total = 0
    examples = []
    for _ in range(batches):
        inputs, targets, _ = task.batch(rng, config.batch)
        answer = decode(logits_of, parameters, task, inputs)
        truth = targets[:, task.length :]
        token_hits += int((answer == truth).sum())
        sequence_hits += int((answer == truth).all(axis=1).sum())
        total += len(answer)
        examples.extend(zip(inputs[:, : task.length], answer, truth, strict=True))
    return token_hits / (total * task.length), sequence_hits / total, examples[:4]


def plot_losses(losses: list[float], path: Path) -> None:
    matplotlib = demo_dependency("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(np.arange(1, len(losses) + 1), losses, linewidth=1)
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (cross-entropy)")
    axes.set_title("accy demo: a named-axis transformer learns to sort digits")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def train(steps: int, seed: int, device: str, out: Path, resume: bool, quiet: bool = False):
    """Train, checkpointing to `out`; returns (state, token accuracy, sequence accuracy)."""
    tqdm = demo_dependency("tqdm").tqdm

    task = SortingTask()
    config = Config(vocab=VOCAB, tokens=task.tokens)
    optimizer = optim.Adam(learning_rate=PEAK_LEARNING_RATE)
    names = list(parameter_specs(config))
    started = time.perf_counter()
    step_program = optim.training_step(loss_program(config), len(names), optimizer)
    run_step = executable(step_program, device)
    logits_of = executable(predict_program(config), device)
    checkpoint = out / "checkpoint.npz"
    parameters = list(initial_parameters(config, np.random.default_rng(seed)).values())
    slots = len(parameters) * optimizer.slots
    if resume and checkpoint.exists():
        state = load_checkpoint(checkpoint, len(parameters), slots)
    else:
        state = TrainingState(0, parameters, optim.initial_state(optimizer, parameters), [])
    if not quiet:
        print(
            f"compiled the training step ({len(step_program.operations)} operations) and the "
            f"decoder on {device} in {time.perf_counter() - started:.1f} s"
        )
    tokens_per_step = config.batch * task.tokens
    progress = tqdm(total=steps, initial=state.step, disable=quiet, unit="step", mininterval=0.5)
    while state.step < steps:
        # Each step's batch depends only on (seed, step), so a resumed run sees the same data.
        batch = task.batch(np.random.default_rng([seed, state.step]), config.batch)
        tick = time.perf_counter()
        learning_rate = optim.warmup_cosine(state.step + 1, steps, PEAK_LEARNING_RATE, WARMUP)
        loss, *rest = run_step(
            *state.parameters,
            *batch,
            *state.optimizer_state,
            np.float32(state.step + 1),
            np.float32(learning_rate),
        )
        state.parameters = rest[: len(parameters)]
        state.optimizer_state = rest[len(parameters) :]
        state.step += 1
        state.losses.append(float(loss))
        progress.set_postfix(
            loss=f"{float(loss):.4f}",
            tokens_per_s=f"{tokens_per_step / (time.perf_counter() - tick):,.0f}",
        )
        progress.update(1)
        if state.step % 200 == 0 or state.step == steps:
            save_checkpoint(checkpoint, state)
    progress.close()
    token_accuracy, sequence_accuracy, examples = evaluate(
        logits_of, state.parameters, task, config, seed
    )
    return state, token_accuracy, sequence_accuracy, examples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accy demo",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train a small decoder-only transformer, written with named axes, to sort "
        "sequences of digits; report held-out accuracy and plot the loss curve.",
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps")
    parser.add_argument("--seed", type=int, default=0, help="seed of parameters and data")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda", "reference"),
        help="where to run: native CPU code, CUDA, or the NumPy reference evaluator",
    )
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for outputs")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    arguments = parser.parse_args(argv)
    for name in ("tqdm", "matplotlib"):  # checked now, not after training
        demo_dependency(name)
    state, token_accuracy, sequence_accuracy, examples = train(
        arguments.steps, arguments.seed, arguments.device, arguments.out, arguments.resume
    )
    print(f"final training loss {state.losses[-1]:.4f} after {state.step} steps")
    print(
        f"held-out accuracy: {token_accuracy:.1%} of sorted digits, "
        f"{sequence_accuracy:.1%} of whole sequences (greedy decoding)"
    )
    for digits, answer, truth in examples:
        mark = "ok" if (answer == truth).all() else "wrong"
        print(f"  sort {' '.join(map(str, digits))} -> {' '.join(map(str, answer))}  ({mark})")
    plot = arguments.out / "loss.png"
    plot_losses(state.losses, plot)
    print(f"loss curve: {plot}")
    print(f"checkpoint: {arguments.out / 'checkpoint.npz'}")
    return 0
