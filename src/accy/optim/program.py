"""Optimizers whose update step is one accy program over all parameters.

An optimizer describes its state (one list of arrays per parameter) and builds the update as a
Program, so the step compiles once and runs on any backend. `training_step` fuses the loss,
its gradient and the update into a single program: one call per step.

    step program:  (params..., batch..., state..., step_number, learning_rate) ->
                   (loss, new params..., new state...)

The step number and the learning rate are scalar inputs, so a schedule needs no recompiling;
an optimizer's own `learning_rate` is the value to pass when there is no schedule.

Over trees (the front end's way): `state = optimizer.init(params)` and
`params, state = optimizer.apply(params, grads, state)`, where params and grads are trees
(dicts, lists, dataclasses, ...) of `accy.NamedArray`s, or of traced values inside `accy.jit`;
parameters may be of any float dtype.

    >>> import accy, numpy as np
    >>> params = {"w": accy.named(np.array([1.0, 2.0]), ("lane",), device="reference")}
    >>> sgd = accy.optim.SGD(learning_rate=0.25, momentum=0.0)
    >>> state = sgd.init(params)
    >>> grads = accy.grad(lambda p: (p["w"] * p["w"]).sum())(params)
    >>> params, state = sgd.apply(params, grads, state)
    >>> params["w"].array.tolist(), params["w"].dtype
    ([0.5, 1.0], accy.f64)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import optree

from ..core import Program
from ..core.builder import Builder, Value
from ..core.types import TensorType, compute_dtype, f32
from ..errors import AccyError
from ..frontend.named import named
from ..frontend.tracing import flatten, unflatten
from ..gradient import value_and_grad
from ..trace import define


class OptState(NamedTuple):
    """An optimizer's state over a tree of parameters: the number of steps taken (a float32
    scalar) and, per state slot (velocity; first and second moments), a tree like the
    parameters."""

    step: Any
    slots: tuple


_NAMESPACE = "accy"  # the front end's tree namespace (dataclasses are registered there)


class TreeOptimizer:
    """`init` and `apply` over trees, shared by the optimizers (which define `slots` and the
    per-parameter `update`)."""

    slots: int
    learning_rate: float

    def init(self, params: Any) -> OptState:
        """The initial state for `params`: step 0 and zeros like every parameter per slot."""
        leaves, _ = flatten(params)
        # One tree of fresh zeros per slot (not one shared): a step may then donate the state
        # (`accy.jit(donate_argnums=...)`), which overwrites each array in place.
        slots = tuple(
            optree.tree_map(_zeros_like, params, namespace=_NAMESPACE) for _ in range(self.slots)
        )
        return OptState(_scalar_like(leaves[0] if leaves else None, 0.0), slots)

    def apply(
        self, params: Any, grads: Any, state: OptState, learning_rate: Any = None
    ) -> tuple[Any, OptState]:
        """One update: `(new params, new state)`, trees like `params` and `state`.
        `learning_rate` (a Python float or a scalar array, e.g. from a schedule) defaults to
        the optimizer's own; it and the step count are converted to each parameter's dtype."""
        param_leaves, treedef = flatten(params)
        grad_leaves, grad_def = flatten(grads)
        if grad_def != treedef:
            raise AccyError(
                f"{type(self).__name__}.apply: the gradients' tree {grad_def} does not have the "
                f"parameters' structure {treedef}"
            )
        slot_leaves = [flatten(slot)[0] for slot in state.slots]
        step = state.step + 1.0
        rate = self.learning_rate if learning_rate is None else learning_rate
        new_params, new_slots = [], [[] for _ in state.slots]
        for i, (param, grad) in enumerate(zip(param_leaves, grad_leaves, strict=True)):
            if not param.dtype.is_float:
                raise AccyError(
                    f"{type(self).__name__}.apply: parameter {i} is {param.ty}; only "
                    "floating-point parameters can be trained"
                )
            b = param.builder
            lr = rate.convert(param.dtype) if hasattr(rate, "ty") else b.scalar(param.dtype, rate)
            updated, slots = self.update(
                b, param, grad, [s[i] for s in slot_leaves], step.convert(param.dtype), lr
            )
            new_params.append(updated)
            for collected, slot in zip(new_slots, slots, strict=True):
                collected.append(slot)
        state = OptState(step, tuple(unflatten(treedef, slot) for slot in new_slots))
        return unflatten(treedef, new_params), state


def _zeros_like(leaf: Any) -> Any:
    if hasattr(leaf, "device"):  # a NamedArray
        return named(np.zeros(leaf.ty.extents, leaf.dtype.numpy), leaf.axes, device=leaf.device)
    return leaf.builder.zeros(leaf.ty)


def _scalar_like(leaf: Any, value: float) -> Any:
    """A float32 scalar where `leaf` lives (its device, or its trace)."""
    if leaf is not None and not hasattr(leaf, "device"):
        return leaf.builder.scalar(f32, value)
    device = "cpu" if leaf is None else leaf.device
    return named(np.asarray(value, np.float32), (), device=device)


@dataclass(frozen=True)
class SGD(TreeOptimizer):
    """Stochastic gradient descent with momentum and (coupled, L2) weight decay.

    velocity = momentum * velocity + grad + weight_decay * param; param -= lr * velocity.
    """

    learning_rate: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0

    slots = 1  # velocity, shaped like its parameter

    def update(
        self,
        b: Builder,
        param: Value,
        grad: Value,
        state: list[Value],
        step: Value,
        learning_rate: Value,
    ):
        (velocity,) = state
        if self.weight_decay:
            grad = grad + param * self.weight_decay
        velocity = velocity * self.momentum + grad
        return param - velocity * learning_rate, [velocity]


@dataclass(frozen=True)
class Adam(TreeOptimizer):
    """Adam with decoupled weight decay (AdamW when weight_decay > 0); f16 and bf16
    parameters are updated in f32 and rounded once (in f16, eps = 1e-8 would be 0).

    m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    param -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + lr * weight_decay * param.
    """

    learning_rate: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    slots = 2  # first and second moments, shaped like their parameter

    def update(
        self,
        b: Builder,
        param: Value,
        grad: Value,
        state: list[Value],
        step: Value,
        learning_rate: Value,
    ):
        # 16-bit parameters are updated in f32: in f16, eps = 1e-8 is 0 and a small or zero
        # gradient's update would be 0 / 0 (NaN) or x / 0 (inf). Results are rounded once.
        dtype = param.dtype
        wide = compute_dtype(dtype)
        param, grad, step, learning_rate = (
            x.convert(wide) for x in (param, grad, step, learning_rate)
        )
        m, v = (x.convert(wide) for x in state)
        m = m * self.beta1 + grad * (1.0 - self.beta1)
        v = v * self.beta2 + grad * grad * (1.0 - self.beta2)
        # Bias corrections from the step number t (a scalar parameter, so nothing recompiles).
        correction1 = 1.0 - b.pow(b.scalar(step.dtype, self.beta1), step)
        correction2 = 1.0 - b.pow(b.scalar(step.dtype, self.beta2), step)
        direction = (m / correction1) / ((v / correction2).sqrt() + self.eps)
        if self.weight_decay:
            direction = direction + param * self.weight_decay
        updated = param - direction * learning_rate
        return updated.convert(dtype), [m.convert(state[0].dtype), v.convert(state[1].dtype)]


def initial_state(optimizer, parameters: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Zeros for every state slot of every parameter, flattened in parameter order.

    >>> import accy, numpy as np
    >>> [s.shape for s in initial_state(accy.optim.Adam(), [np.ones((2, 3), np.float32)])]
    [(2, 3), (2, 3)]
    """
    return [
        np.zeros(np.shape(p), _state_dtype(p)) for p in parameters for _ in range(optimizer.slots)
    ]


def _state_dtype(parameter: Any) -> np.dtype:
    """The dtype of a parameter's state: its own, when it is a floating-point array."""
    dtype = getattr(parameter, "dtype", None)
    return dtype if isinstance(dtype, np.dtype) and dtype.kind == "f" else np.dtype(np.float32)


def training_step(loss: Program, parameter_count: int, optimizer) -> Program:
    """One program for a whole training step of `loss`.

    `loss` takes `parameter_count` trainable parameters first, then the batch inputs, and
    returns a scalar. The step program takes (params..., batch..., state..., step number t,
    learning rate) and returns (loss, new params..., new state...); t counts from 1.

    >>> import accy, numpy as np
    >>> p = accy.trace.define("l", [accy.spec(accy.f32, n=2)], lambda b, a: (a[0] * a[0]).sum())
    >>> step = accy.optim.training_step(p, 1, accy.optim.SGD(learning_rate=0.25, momentum=0.0))
    >>> loss, new_param, velocity = accy.reference.run(step, [[1.0, 2.0], [0.0, 0.0], 1.0, 0.25])
    >>> new_param.tolist()
    [0.5, 1.0]
    """
    types = loss.parameter_types
    if not 0 < parameter_count <= len(types):
        raise AccyError(
            f"training_step: {loss.name!r} has {len(types)} parameters, "
            f"so parameter_count={parameter_count} is out of range"
        )
    if any(not t.dtype.is_float for t in types[:parameter_count]):
        raise AccyError("training_step: trainable parameters must be floating-point")
    combined = value_and_grad(loss, wrt=tuple(range(parameter_count)))
    state_types = [t for t in types[:parameter_count] for _ in range(optimizer.slots)]
    slots = optimizer.slots

    def body(b: Builder, args: list[Value]):
        params = args[:parameter_count]
        inputs = args[: len(types)]
        state = args[len(types) : len(types) + len(state_types)]
        step, learning_rate = args[-2:]
        loss_value, *grads = b.call(combined, inputs)
        new_params, new_state = [], []
        for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
            # The step number and learning rate are float32 inputs: each parameter's update
            # uses them in its own dtype (float64 parameters train too).
            updated, slots_out = optimizer.update(
                b,
                param,
                grad,
                state[i * slots : (i + 1) * slots],
                step.convert(param.dtype),
                learning_rate.convert(param.dtype),
            )
            new_params.append(updated)
            new_state.extend(slots_out)
        return (loss_value, *new_params, *new_state)

    scalar = TensorType(f32, ())
    return define(f"{loss.name}_step", [*types, *state_types, scalar, scalar], body)


def warmup_cosine(step: int, total: int, peak: float, warmup: int) -> float:
    """A learning rate that rises linearly for `warmup` steps, then decays to 0 by a cosine.

    >>> [round(warmup_cosine(t, 10, 1.0, 2), 3) for t in (1, 2, 6, 10)]
    [0.5, 1.0, 0.5, 0.0]
    """
    if step <= warmup:
        return peak * step / max(warmup, 1)
    progress = (step - warmup) / max(total - warmup, 1)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
