"""What the demos share: the optional dependencies, host copies of device arrays, checkpoints
(`accy.save`/`accy.load`) read back with a clear error when damaged, and the AdamW step of the
language-model presets."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, NoReturn

import numpy as np

from ..backends.devices import as_device
from ..checkpoints import load, save
from ..errors import AccyError, CheckpointError, RuntimeUnavailable
from ..frontend.tracing import flatten


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


def host(array) -> np.ndarray:
    """A NumPy array for `array`, copying it from the GPU when it lives there (CuPy)."""
    return array.get() if hasattr(array, "get") else np.asarray(array)


class Checkpoint(NamedTuple):
    """What a demo checkpoint holds: the steps taken, one loss per step, the parameters and
    the whole optimizer state (trees of named arrays; `accy.optim` states are named tuples)."""

    step: int
    losses: list[float]
    params: Any
    opt_state: Any


FIELDS = ("progress", "params", "opt_state")
CHECKPOINT = "checkpoint.safetensors"  # the file name in a demo's output folder


def _tree(checkpoint: Checkpoint) -> dict:
    """The tree `accy.save` writes: the optimizer state as its list of leaves, so that the file
    reads back without `like` (named tuples rebuild only with one) to learn the step count."""
    return {
        "progress": {
            "step": np.asarray(checkpoint.step, np.int64),
            "losses": np.asarray(checkpoint.losses, np.float64),
        },
        "params": checkpoint.params,
        "opt_state": flatten(checkpoint.opt_state)[0],
    }


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write `checkpoint` to `path` with `accy.save` (safetensors, atomically: a crash leaves
    the previous file whole).

    >>> import accy, numpy as np, tempfile
    >>> from pathlib import Path
    >>> params = {"w": accy.named(np.ones(2, np.float32), ("a",))}
    >>> opt = accy.optim.adam(0.1)
    >>> path = Path(tempfile.mkdtemp()) / "checkpoint.safetensors"
    >>> save_checkpoint(path, Checkpoint(1, [0.5], params, opt.init(params)))
    >>> load_checkpoint(path, Checkpoint(0, [], params, opt.init(params))).losses
    [0.5]
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    save(path, _tree(checkpoint))


def load_checkpoint(
    path: Path, like: Checkpoint, check_params: Callable[[dict], None] | None = None
) -> Checkpoint:
    """The checkpoint saved at `path`, as trees of `like`'s structure on its devices (`like`'s
    step and losses are ignored). A file that is not a whole checkpoint of this model (empty,
    truncated, corrupted, a malformed step or losses, other parameters) is an `AccyError` that
    names what is wrong and says how to start over; `check_params(saved parameters)` may
    refuse the saved parameters first, with an error of its own."""
    try:
        saved = load(path)
    except CheckpointError as error:
        raise AccyError(
            f"cannot resume: the checkpoint at {path} is damaged or incomplete ({error}); "
            f"delete it to start over, or run without --resume (which overwrites it)"
        ) from None
    if not isinstance(saved, dict) or set(saved) != set(FIELDS):
        found = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
        _not_written_here(path, f"it holds {found}, not the fields {list(FIELDS)}")
    progress = saved["progress"]
    if not isinstance(progress, dict) or set(progress) != {"step", "losses"}:
        _not_written_here(path, "its progress is not a step and a list of losses")
    step, losses = _checked_progress(path, progress["step"], progress["losses"])
    if not isinstance(saved["params"], dict):
        _not_written_here(path, "its parameters are not a dict of named arrays")
    if check_params is not None:
        check_params(saved["params"])
    try:
        tree = load(path, like=_tree(Checkpoint(step, losses, like.params, like.opt_state)))
    except CheckpointError as error:
        raise AccyError(
            f"cannot resume: the checkpoint at {path} does not fit this model ({error}); "
            f"delete it to start over, or run without --resume (which overwrites it)"
        ) from None
    opt_state = flatten(like.opt_state)[1].unflatten(tree["opt_state"])
    return Checkpoint(step, losses, tree["params"], opt_state)


def _not_written_here(path: Path, problem: str) -> NoReturn:
    raise AccyError(
        f"cannot resume: the checkpoint at {path} is not one this demo wrote ({problem}); "
        f"delete it to start over, or run without --resume (which overwrites it)"
    )


def _checked_progress(path: Path, step: np.ndarray, losses: np.ndarray) -> tuple[int, list[float]]:
    """The checkpoint's step (a whole number, at least 0) and its losses (one number per step
    taken), or an AccyError that names what is wrong and says how to start over."""
    step, losses = np.asarray(step), np.asarray(losses)
    problem = None
    if step.ndim != 0 or step.dtype.kind not in "iu":
        problem = f"its step is a {step.dtype} array of shape {step.shape}, not one whole number"
    elif int(step) < 0:
        problem = f"its step is {int(step)}, not a number of steps taken (0 or more)"
    elif losses.ndim != 1 or losses.dtype.kind not in "iuf":
        problem = (
            f"its losses are a {losses.dtype} array of shape {losses.shape}, not a list of numbers"
        )
    elif len(losses) != int(step):
        problem = f"it has {len(losses)} losses for {int(step)} steps (one per step)"
    if problem is not None:
        _not_written_here(path, problem)
    return int(step), [float(x) for x in losses]


def language_model_step(
    model, device: str, learning_rate: float, weight_decay: float = 0.1, policy=None
):
    """One jitted AdamW step of an `accy.models` language model: `step(params, states, ids,
    targets, rate) -> (loss, params, states)`, with the initial `params` (the model) and
    `states`. The optimizer is `accy.optim.adamw` (b1 0.9, b2 0.95, eps 1e-8) over the
    model's leaves, decaying those `nn.decay_mask` picks, under `inject_hyperparams`: `rate`, the
    learning rate, is an input put into the state, so a schedule does not recompile.
    `targets` are the next tokens of `ids`. Under a mixed-precision `policy` the model
    computes in its compute dtype from f32 masters. Parameters and states are donated on cpu
    and cuda."""
    from .. import nn, optim
    from ..frontend import jit, value_and_grad

    optimizer = optim.inject_hyperparams(optim.adamw)(
        learning_rate=learning_rate,
        b1=0.9,
        b2=0.95,
        eps=1e-8,
        weight_decay=weight_decay,
        mask=nn.decay_mask(model),
    )

    def step(params, states, ids, targets, rate):
        def loss(merged):
            if policy is None:
                return merged.loss(ids, targets)
            scores = policy.cast_to_output(policy.cast_to_compute(merged)(ids))
            return nn.cross_entropy(scores, targets, "vocab").mean()

        value, grads = value_and_grad(loss)(params)
        leaves, treedef = flatten(params)
        states = states._replace(hyperparams={**states.hyperparams, "learning_rate": rate})
        updates, states = optimizer.update(flatten(grads)[0], states, leaves)
        return value, treedef.unflatten(optim.apply_updates(leaves, updates)), states

    donate = (0, 1) if as_device(device).takes_donations else ()
    return jit(step, donate_argnums=donate), model, optimizer.init(flatten(model)[0])
