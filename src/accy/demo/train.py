"""`accy demo`: train the named-axis transformer on the sorting task, end to end.

The training step is one jitted function, so one compiled program: the loss, its gradient
through `accy.value_and_grad`, and the Adam update over the tree of parameters
(`accy.optim.adam` under `inject_hyperparams`); the learning rate of the warmup + cosine
schedule is one of its inputs, put into the optimizer state's hyperparameters, so that no step
recompiles. Another jitted function gives the logits used to decode held-out samples greedily.
Checkpoints (`accy.save`) hold the step count, the losses, the parameters and the whole
optimizer state.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import nn, optim
from ..backends.devices import as_device
from ..config import config
from ..core.types import dtype_named, f32
from ..errors import AccyError
from ..frontend import NamedArray, jit, named, value_and_grad
from ..frontend.tracing import flatten
from ..mesh import Mesh, shard
from .common import (
    CHECKPOINT,
    Checkpoint,
    TrainingState,
    demo_dependency,
    host,
    load_checkpoint,
    save_checkpoint,
)
from .data import VOCAB, SortingTask
from .model import Config, initial_parameters, logits, loss, parameter_specs

DEFAULT_STEPS = 2000
PEAK_LEARNING_RATE = 3e-3
WARMUP = 100
HELD_OUT_SEED_OFFSET = 1_000_003


def make_optimizer(peak_learning_rate: float = PEAK_LEARNING_RATE):
    """The demo's Adam, its learning rate a hyperparameter of the state (`inject_hyperparams`)
    that each step sets from the schedule."""
    return optim.inject_hyperparams(optim.adam)(learning_rate=peak_learning_rate)


def check_layout(saved: dict, specs: dict, path: Path) -> None:
    """Refuse a checkpoint whose parameters do not have this model's names and shapes (say,
    written with --scan-layers, stacked along `layer`, and resumed without it)."""
    shapes = {n: tuple(getattr(a, "array", a).shape) for n, a in saved.items()}
    if set(shapes) != set(specs):
        differ = sorted(set(shapes) ^ set(specs))[0]
        where = "checkpoint" if differ in shapes else "model"
        problem = f"parameter {differ!r} is only in the {where}"
    else:
        differ = next((n for n, t in specs.items() if shapes[n] != t.extents), None)
        if differ is None:
            return
        problem = (
            f"parameter {differ!r} has shape {shapes[differ]}, this model's is "
            f"{specs[differ].extents}"
        )
    raise AccyError(
        f"cannot resume: in the checkpoint at {path}, {problem} (a checkpoint written with "
        "--scan-layers resumes only with it, and one written without it only without it); "
        "delete it to start over"
    )


def decode(logits_of, task: SortingTask, inputs: np.ndarray) -> np.ndarray:
    """Greedy decoding: fill in the sorted half one token at a time from the model's choices.
    `logits_of(ids)` gives the logits {batch, token, vocab} for ids {batch, token}."""
    ids = inputs.copy()
    ids[:, task.length + 1 :] = 0  # hide the answer
    for position in range(task.length, task.tokens):
        scores = logits_of(ids)
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
        answer = decode(lambda ids: logits_of(parameters, ids), task, inputs)
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


class Model:
    """The demo's jitted functions over named arrays on one device, and the conversions between
    the flat lists of a checkpoint and the trees the functions take."""

    def __init__(
        self,
        config: Config,
        optimizer: optim.GradientTransformation,
        device: str,
        dtype: str = "f32",
        gpus: int = 1,
        distributed=None,
    ):
        self.config = config
        self.optimizer = optimizer
        self.device = device
        self.specs = parameter_specs(config)
        # f32 master parameters and optimizer state; the model computes in `dtype`; the loss
        # and the logits come out in f32 (an f16 loss is scaled, its gradients unscaled).
        policy = nn.mixed_precision(f32, dtype_named(dtype), f32)

        def batch_loss(params, ids, targets, weights):
            value = loss(policy.cast_to_compute(params), ids, targets, weights, config, policy)
            return policy.scale(value)

        def train_step(params, state, ids, targets, weights, learning_rate):
            value, grads = value_and_grad(batch_loss)(params, ids, targets, weights)
            value, grads = value * (1.0 / policy.loss_scale), policy.unscale(grads)
            state = state._replace(
                hyperparams={**state.hyperparams, "learning_rate": learning_rate}
            )
            updates, state = optimizer.update(grads, state, params)
            return value, optim.apply_updates(params, updates), state

        def model_logits(params, ids):
            return policy.cast_to_output(logits(policy.cast_to_compute(params), ids, config))

        self.step = (
            jit(train_step) if gpus == 1 else data_parallel(train_step, gpus, device, distributed)
        )
        self.logits = jit(model_logits)

    def named(self, array: np.ndarray, axes) -> NamedArray:
        return named(array, axes, device=self.device)

    def initial(self, parameters: list[np.ndarray]) -> tuple[dict, Any]:
        """The parameters (host arrays in `parameter_specs` order) as a tree of named arrays,
        and the optimizer's initial state for them."""
        params = {
            n: self.named(p, self.specs[n].axes)
            for n, p in zip(self.specs, parameters, strict=True)
        }
        return params, self.optimizer.init(params)

    def flat(self, params: dict, opt_state: Any) -> tuple[list, list]:
        """Host copies: the parameters in `parameter_specs` order, the optimizer state's leaves."""
        parameters = [host(params[n].array) for n in self.specs]
        leaves = [host(getattr(leaf, "array", leaf)) for leaf in flatten(opt_state)[0]]
        return parameters, leaves


def data_parallel(train_step, gpus: int, device: str, distributed):
    """`train_step` data-parallel over `gpus` devices (the batch split, gradients summed): one
    process per GPU on "cuda" (`distributed`), else a mesh simulated in this process."""
    mesh = distributed.mesh if distributed is not None else Mesh(range(gpus), "data")
    return shard(train_step, mesh, {"batch": "data"}, device=device, distributed=distributed)


def train(
    steps: int,
    seed: int,
    device: str,
    out: Path,
    resume: bool,
    quiet: bool = False,
    dtype: str = "f32",
    gpus: int = 1,
    distributed=None,
    scan_layers: bool = False,
):
    """Train, checkpointing to `out`; returns (state, token accuracy, sequence accuracy).
    `dtype` is the compute dtype of the mixed-precision policy (f32, bf16 or f16). `gpus` > 1
    trains data-parallel (see `data_parallel`); on GPUs only rank 0 writes and evaluates (the
    others return accuracies None). `scan_layers` stacks the layers' parameters along a `layer`
    axis and runs them as one scan."""
    tqdm = demo_dependency("tqdm").tqdm

    task = SortingTask()
    config = Config(vocab=VOCAB, tokens=task.tokens, scan_layers=scan_layers)
    model = Model(config, make_optimizer(), device, dtype, gpus, distributed)
    writer = distributed is None or distributed.rank == 0
    quiet = quiet or not writer
    started = time.perf_counter()
    checkpoint = out / CHECKPOINT
    parameters = list(initial_parameters(config, np.random.default_rng(seed)).values())
    params, opt_state = model.initial(parameters)
    state = TrainingState(0, [], [], [])
    if resume and checkpoint.exists():
        saved = load_checkpoint(
            checkpoint,
            Checkpoint(0, [], params, opt_state),
            lambda saved: check_layout(saved, model.specs, checkpoint),
        )
        state.step, state.losses, params, opt_state = saved
    tokens_per_step = config.batch * task.tokens
    progress = tqdm(total=steps, initial=state.step, disable=quiet, unit="step", mininterval=0.5)
    while state.step < steps:
        # Each step's batch depends only on (seed, step), so a resumed run sees the same data.
        ids, targets, weights = task.batch(np.random.default_rng([seed, state.step]), config.batch)
        tick = time.perf_counter()
        learning_rate = optim.warmup_cosine(state.step + 1, steps, PEAK_LEARNING_RATE, WARMUP)
        value, params, opt_state = model.step(
            params,
            opt_state,
            model.named(ids, ("batch", "token")),
            model.named(targets, ("batch", "token")),
            model.named(weights, ("batch", "token")),
            model.named(np.float32(learning_rate), ()),
        )
        if state.step == 0 and not quiet:
            progress.write(
                f"traced and compiled the training step on {device} in "
                f"{time.perf_counter() - started:.1f} s"
            )
        state.step += 1
        state.losses.append(float(value))
        progress.set_postfix(
            loss=f"{float(value):.4f}",
            tokens_per_s=f"{tokens_per_step / (time.perf_counter() - tick):,.0f}",
        )
        progress.update(1)
        if writer and (state.step % 200 == 0 or state.step == steps):
            save_checkpoint(checkpoint, Checkpoint(state.step, state.losses, params, opt_state))
    progress.close()
    state.parameters, state.optimizer_state = model.flat(params, opt_state)
    if not writer:
        return state, None, None, []
    token_accuracy, sequence_accuracy, examples = evaluate(
        lambda params, ids: model.logits(params, model.named(ids, ("batch", "token"))).array,
        params,
        task,
        config,
        seed,
    )
    return state, token_accuracy, sequence_accuracy, examples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accy demo",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train a small decoder-only transformer, written with named axes, to sort "
        "sequences of digits; report held-out accuracy and plot the loss curve.",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps (default {DEFAULT_STEPS}, or the preset's)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of parameters and data")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda", "reference"),
        help="where to run: native CPU code, CUDA, or the NumPy reference evaluator",
    )
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for outputs")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    parser.add_argument(
        "--dtype",
        default="f32",
        choices=("f32", "bf16", "f16"),
        help="compute dtype (mixed precision: f32 master parameters and optimizer state, the "
        "loss in f32; f16 scales the loss)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="devices to train on, data-parallel (the batch split over them): one process per "
        "GPU with --device cuda, a mesh simulated in one process with cpu or reference",
    )
    parser.add_argument(
        "--scan-layers",
        action="store_true",
        help="stack the layers' parameters along a 'layer' axis and run the layers as one scan "
        "(the traced program does not grow with depth); checkpoints hold stacked parameters",
    )
    parser.add_argument(
        "--preset",
        default=None,
        help="instead of the sorting task: GPT-2 over the bytes of the Python standard "
        "library's source, 'gpt2-small' (the GPU job) or 'tiny' (a minute on the CPU); "
        "'finetune' fine-tunes the Hugging Face folder given by --from on that text",
    )
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=None,
        help="with --preset finetune: the Hugging Face model folder (GPT-2 or Llama) to tune",
    )
    parser.add_argument(
        "--minutes", type=float, default=None, help="with --preset: stop after this wall time"
    )
    arguments = parser.parse_args(argv)
    if arguments.steps is not None and arguments.steps < 1:
        parser.error(f"--steps must be at least 1, not {arguments.steps}")
    if arguments.source is not None and arguments.preset != "finetune":
        parser.error("--from needs --preset finetune")
    if arguments.preset == "finetune":
        return finetune_main(parser, arguments)
    if arguments.preset is not None:
        return preset_main(parser, arguments)
    if arguments.minutes is not None:
        parser.error("--minutes needs --preset")
    if arguments.steps is None:
        arguments.steps = DEFAULT_STEPS
    for name in ("tqdm", "matplotlib"):  # checked now, not after training
        demo_dependency(name)
    if arguments.gpus < 1:
        parser.error("--gpus must be at least 1")
    distributed = None
    if arguments.gpus > 1 and as_device(arguments.device).is_cuda:
        from ..mesh import Mesh

        # Not yet launched: start one process per GPU, each running this command.
        if config.environment("RANK") is None:
            from ..launch import launch

            argv = sys.argv[1:] if argv is None else list(argv)
            return launch(arguments.gpus, [sys.executable, "-m", "accy", "demo", *argv])
        from ..mesh.nccl import Distributed

        distributed = Distributed(Mesh(range(arguments.gpus), "data"))
    state, token_accuracy, sequence_accuracy, examples = train(
        arguments.steps,
        arguments.seed,
        arguments.device,
        arguments.out,
        arguments.resume,
        dtype=arguments.dtype,
        gpus=arguments.gpus,
        distributed=distributed,
        scan_layers=arguments.scan_layers,
    )
    if distributed is not None:
        distributed.close()
        if distributed.rank != 0:
            return 0
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
    print(f"checkpoint: {arguments.out / CHECKPOINT}")
    return 0


def finetune_main(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> int:
    """`accy demo --preset finetune --from FOLDER`: see `demo/finetune.py`."""
    from .finetune import finetune, report

    if arguments.source is None:
        parser.error("--preset finetune needs --from FOLDER (a Hugging Face model folder)")
    for flag, unsupported in (
        ("--resume", arguments.resume),
        ("--scan-layers", arguments.scan_layers),
        ("--gpus", arguments.gpus != 1),
        ("--dtype", arguments.dtype != "f32"),
        ("--minutes", arguments.minutes is not None),
    ):
        if unsupported:
            parser.error(f"{flag} is not supported with --preset finetune")
    demo_dependency("tqdm")
    steps = 200 if arguments.steps is None else arguments.steps
    run = finetune(arguments.source, arguments.device, arguments.out, steps, arguments.seed)
    report(run)
    return 0


def preset_main(parser: argparse.ArgumentParser, arguments: argparse.Namespace) -> int:
    """`accy demo --preset NAME`: see `demo/preset.py`."""
    from .preset import preset_named, report, train_preset

    preset_named(arguments.preset)  # a bad name is refused before anything else
    for flag, unsupported in (
        ("--resume", arguments.resume),
        ("--scan-layers", arguments.scan_layers),
        ("--gpus", arguments.gpus != 1),
        ("--dtype f16", arguments.dtype == "f16"),
    ):
        if unsupported:
            parser.error(f"{flag} is not supported with --preset")
    for name in ("tqdm", "matplotlib"):
        demo_dependency(name)
    run = train_preset(
        arguments.preset,
        arguments.device,
        arguments.out,
        arguments.dtype,
        arguments.steps,
        arguments.minutes,
        arguments.seed,
    )
    report(run, arguments.out)
    return 0
