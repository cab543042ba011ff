"""What both demos share: the optional dependencies, host copies of device arrays, and
checkpoints written atomically and read back with a clear error when damaged."""

from __future__ import annotations

import importlib
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from ..backends.devices import as_device
from ..errors import AccyError, RuntimeUnavailable


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
            step, losses = _checked_progress(path, data["step"], data["losses"])
            return TrainingState(
                step=step,
                parameters=[data[f"param_{i}"] for i in range(parameters)],
                optimizer_state=[data[f"opt_{i}"] for i in range(slots)],
                losses=losses,
            )
    # np.load reads the archive lazily: a damaged one fails in any of these, as any member is read.
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as error:
        reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise AccyError(
            f"cannot resume: the checkpoint at {path} is damaged or incomplete ({reason}); "
            f"delete it to start over, or run without --resume (which overwrites it)"
        ) from None


def _checked_progress(path: Path, step: np.ndarray, losses: np.ndarray) -> tuple[int, list[float]]:
    """The checkpoint's step (a whole number, at least 0) and its losses (one number per step
    taken), or an AccyError that names what is wrong and says how to start over."""
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
        raise AccyError(
            f"cannot resume: the checkpoint at {path} is not one this demo wrote ({problem}); "
            f"delete it to start over, or run without --resume (which overwrites it)"
        )
    return int(step), [float(x) for x in losses]


def language_model_step(
    model, device: str, learning_rate: float, weight_decay: float = 0.1, policy=None
):
    """One jitted AdamW step of an `accy.models` language model: `step(params, states, ids,
    targets, rate) -> (loss, params, states)`, with the initial `params` (the model split by
    `nn.partition` into "decay", the matrices that `nn.decayed` names, and "plain") and
    `states`. `targets` are the next tokens of `ids`; `rate` the learning rate (an input, so
    a schedule does not recompile). Under a mixed-precision `policy` the model computes in its
    compute dtype from f32 masters. Parameters and states are donated on cpu and cuda."""
    from .. import nn, optim
    from ..frontend import jit, value_and_grad

    decay = optim.Adam(learning_rate, 0.9, 0.95, 1e-8, weight_decay)
    plain = optim.Adam(learning_rate, 0.9, 0.95, 1e-8, 0.0)

    def step(params, states, ids, targets, rate):
        def loss(p):
            merged = nn.combine(p["decay"], p["plain"])
            if policy is None:
                return merged.loss(ids, targets)
            scores = policy.cast_to_output(policy.cast_to_compute(merged)(ids))
            return nn.cross_entropy(scores, targets, "vocab").mean()

        value, grads = value_and_grad(loss)(params)
        new, new_states = {}, {}
        for group, optimizer in (("decay", decay), ("plain", plain)):
            new[group], new_states[group] = optimizer.apply(
                params[group], grads[group], states[group], rate
            )
        return value, new, new_states

    matrices, rest = nn.partition(model, nn.decayed, paths=True)
    params = {"decay": matrices, "plain": rest}
    states = {"decay": decay.init(matrices), "plain": plain.init(rest)}
    donate = (0, 1) if as_device(device).takes_donations else ()
    return jit(step, donate_argnums=donate), params, states
