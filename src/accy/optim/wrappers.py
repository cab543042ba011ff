"""Transformations of transformations: `masked` (apply to some parameters only), `MultiSteps`
(gradient accumulation) and `inject_hyperparams` (hyperparameters as state, so that they can
be changed or scheduled without recompiling).

>>> import accy, numpy as np
>>> p = {"w": accy.named(np.array([1.0]), ("a",), device="reference"),
...      "b": accy.named(np.array([1.0]), ("a",), device="reference")}
>>> t = masked(accy.optim.scale(0.0), {"w": True, "b": False})
>>> out, _ = t.update(p, t.init(p))
>>> out["w"].array.tolist(), out["b"].array.tolist()
([0.0], [1.0])
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from ..core.types import DType, f32, i32
from ..errors import AccyError
from ..frontend.tracing import flatten, unflatten
from .base import (
    GradientTransformation,
    compute_in,
    first_leaf,
    full_like,
    is_traced,
    prefix_leaves,
    resolve_dtype,
    safe_increment,
    scalar_like,
    tree_leaves,
    tree_map,
    zeros_count,
)


class MaskedState(NamedTuple):
    inner_state: Any


def _mask_leaves(mask: Any, tree: Any, where: str) -> list[bool]:
    chosen = mask(tree) if callable(mask) else mask
    found = prefix_leaves(chosen, tree, where)
    for flag in found:
        if not isinstance(flag, bool | np.bool_):
            raise AccyError(
                f"{where}: the mask holds {flag!r}; its leaves must be Python bools (True: "
                "transform this parameter), fixed when the step is traced"
            )
    return [bool(f) for f in found]


def _keep(tree: Any, flags: list[bool]) -> Any:
    """`tree` with the leaves whose flag is False replaced by None (an empty node)."""
    if tree is None:
        return None
    leaves, treedef = flatten(tree)
    return unflatten(treedef, [x if f else None for x, f in zip(leaves, flags, strict=True)])


def masked(inner: GradientTransformation, mask: Any) -> GradientTransformation:
    """`inner` applied to the parameters whose `mask` leaf is True; the others' updates pass
    through unchanged. `mask` is a tree of bools (a prefix of the parameters') or a function
    of the parameters (or updates) that returns one, as optax.masked.

    >>> from accy.optim import identity
    >>> masked(identity(), True).init([])
    MaskedState(inner_state=EmptyState())
    """

    def init(params):
        return MaskedState(inner.init(_keep(params, _mask_leaves(mask, params, "masked"))))

    def update(updates, state, params=None, **extra):
        flags = _mask_leaves(mask, updates, "masked")
        inner_updates, inner_state = inner.update(
            _keep(updates, flags), state.inner_state, _keep(params, flags), **extra
        )
        leaves, treedef = flatten(updates)
        done = iter(tree_leaves(inner_updates))
        merged = [next(done) if f else x for x, f in zip(leaves, flags, strict=True)]
        return unflatten(treedef, merged), MaskedState(inner_state)

    return GradientTransformation(init, update)


# -- gradient accumulation ---------------------------------------------------------------------


class MultiStepsState(NamedTuple):
    mini_step: Any
    gradient_step: Any
    inner_opt_state: Any
    acc_grads: Any


class MultiSteps:
    """Gradient accumulation (optax.MultiSteps): the updates of `every_k_schedule` calls (an
    int, or a schedule of the number of inner steps taken) are averaged (summed with
    `use_grad_mean=False`) and handed to `opt` on the k-th call; the other calls return
    zero updates. Everything is selected, not branched, so it runs inside one jitted step.
    The accumulator is f32 for 16-bit parameters, the parameters' dtype otherwise (or
    `accumulator_dtype`).

    >>> import accy, numpy as np
    >>> p = [accy.named(np.array([1.0], np.float32), ("a",), device="reference")]
    >>> opt = MultiSteps(accy.optim.sgd(1.0), every_k_schedule=2)
    >>> s = opt.init(p)
    >>> u, s = opt.update([p[0] * 2.0], s, p)
    >>> u[0].array.tolist()
    [0.0]
    >>> u, s = opt.update([p[0] * 4.0], s, p)
    >>> u[0].array.tolist()
    [-3.0]
    """

    def __init__(
        self,
        opt: GradientTransformation,
        every_k_schedule: int | Callable[[Any], Any],
        use_grad_mean: bool = True,
        accumulator_dtype: Any = None,
    ):
        if isinstance(every_k_schedule, int) and every_k_schedule < 1:
            raise AccyError(f"MultiSteps: every_k_schedule={every_k_schedule} must be >= 1")
        self.inner_opt = opt
        self._every_k = every_k_schedule
        self._use_grad_mean = use_grad_mean
        self._dtype = resolve_dtype(accumulator_dtype, "MultiSteps")

    def _k(self, gradient_step: Any) -> Any:
        if callable(self._every_k):
            return self._every_k(gradient_step)
        return self._every_k

    def init(self, params: Any) -> MultiStepsState:
        """Zero counts, the inner optimizer's state and zero accumulators."""
        acc = tree_map(lambda p: full_like(p, 0.0, self._dtype or compute_in(p.dtype)), params)
        count = zeros_count(params)
        return MultiStepsState(count, zeros_count(params), self.inner_opt.init(params), acc)

    def update(self, updates: Any, state: MultiStepsState, params: Any = None, **extra):
        """Accumulate `updates`; on every k-th call, the inner optimizer's update."""
        k = self._k(state.gradient_step)
        mini = state.mini_step

        def accumulate(g, acc):
            wide = g.convert(acc.dtype)
            if self._use_grad_mean:
                return acc + (wide - acc) / (mini + 1).convert(acc.dtype)
            return acc + wide

        acc = tree_map(accumulate, updates, state.acc_grads, where="MultiSteps")
        inner_updates, inner_state = self.inner_opt.update(
            tree_map(lambda a, g: a.convert(g.dtype), acc, updates),
            state.inner_opt_state,
            params,
            **extra,
        )
        emit = mini.eq(_as_i32(k, mini) - 1)
        select = mini.builder.select

        def choose(old, new):
            return select(emit, new, old)

        new_state = MultiStepsState(
            select(emit, 0, mini + 1),
            select(emit, safe_increment(state.gradient_step), state.gradient_step),
            _select_trees(choose, state.inner_opt_state, inner_state),
            tree_map(lambda a: select(emit, 0.0, a), acc),
        )
        out = tree_map(lambda u: select(emit, u, 0.0), inner_updates)
        return out, new_state

    def has_updated(self, state: MultiStepsState) -> Any:
        """Whether the last call handed the accumulated updates to the inner optimizer."""
        return state.mini_step.eq(0) & (state.gradient_step > 0)

    def gradient_transformation(self) -> GradientTransformation:
        """This accumulation as a GradientTransformation record."""
        return GradientTransformation(self.init, self.update)


def _as_i32(k: Any, like: Any) -> Any:
    return k.convert(i32) if is_traced(k) else scalar_like(like, i32, int(k))


def _select_trees(choose: Callable, old: Any, new: Any) -> Any:
    old_leaves, treedef = flatten(old)
    new_leaves, new_def = flatten(new)
    if new_def != treedef:
        raise AccyError(
            f"MultiSteps: the inner optimizer's state changed structure ({treedef} -> "
            f"{new_def}); a state must keep its structure from step to step"
        )
    return unflatten(treedef, [choose(a, b) for a, b in zip(old_leaves, new_leaves, strict=True)])


# -- hyperparameters as state ------------------------------------------------------------------


class InjectHyperparamsState(NamedTuple):
    count: Any
    hyperparams: dict
    hyperparams_states: dict
    inner_state: Any


class WrappedScheduleState(NamedTuple):
    count: Any


class WrappedSchedule:
    """A schedule of the step count as a stateful schedule (optax.WrappedSchedule):
    `init()` is the count 0, `update(state, **extra)` counts one step, `self(state)` is the
    schedule's value at the count."""

    def __init__(self, schedule_fn: Callable[[Any], Any]):
        self.schedule_fn = schedule_fn

    def init(self, like: Any = None) -> WrappedScheduleState:
        """Step 0 (an i32 scalar where `like` lives)."""
        return WrappedScheduleState(scalar_like(like, i32, 0))

    def update(self, state: WrappedScheduleState, **extra: Any) -> WrappedScheduleState:
        """One step more."""
        return WrappedScheduleState(safe_increment(state.count))

    def __call__(self, state: WrappedScheduleState, **extra: Any) -> Any:
        return self.schedule_fn(state.count)


def is_stateful_schedule(value: Any) -> bool:
    """An object with `init()`, `update(state, **extra)` and `__call__(state, **extra)`, as
    optax's StatefulSchedule."""
    return (
        callable(value)
        and callable(getattr(value, "init", None))
        and callable(getattr(value, "update", None))
    )


def _highest_float(params: Any) -> DType:
    """The widest float dtype among the leaves (optax.tree.dtype(params, "highest"))."""
    order = ["bf16", "f16", "f32", "f64"]
    found = [leaf.dtype for leaf in tree_leaves(params) if leaf.dtype.is_float]
    return max(found, key=lambda d: order.index(d.name)) if found else f32


def _is_float_value(value: Any) -> bool:
    if is_traced(value):
        return value.dtype.is_float
    if isinstance(value, np.ndarray | np.generic):
        return value.dtype.kind == "f"
    return isinstance(value, float)


def inject_hyperparams(
    inner_factory: Callable[..., GradientTransformation],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: Any = None,
) -> Callable[..., GradientTransformation]:
    """`inner_factory` (an optimizer such as `accy.optim.adam`) whose float hyperparameters
    live in the state, as optax.inject_hyperparams: `state.hyperparams["learning_rate"]` can
    be read, or replaced between steps without recompiling; a schedule given for one is
    evaluated at the step count (a stateful schedule, with `init`/`update`, at its own
    state in `state.hyperparams_states`). Python ints and bools, None, strings, integer
    arrays (random keys), functions named in `static_args` and other objects stay fixed
    (ints size loops and pick axes in accy). Float hyperparameters are kept in
    `hyperparam_dtype`; without it, an accy array keeps its dtype and Python or NumPy numbers
    take the widest float dtype of the parameters.

    >>> import accy, numpy as np
    >>> p = [accy.named(np.array([1.0], np.float32), ("a",), device="reference")]
    >>> opt = inject_hyperparams(accy.optim.sgd)(learning_rate=0.5)
    >>> s = opt.init(p)
    >>> float(s.hyperparams["learning_rate"])
    0.5
    >>> opt.update(p, s, p)[0][0].array.tolist()
    [-0.5]
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    signature = inspect.signature(inner_factory)
    unknown = static - set(signature.parameters)
    if unknown:
        raise AccyError(
            f"inject_hyperparams: static_args {sorted(unknown)} are not parameters of "
            f"{getattr(inner_factory, '__name__', inner_factory)}; its parameters are "
            f"{', '.join(signature.parameters)}"
        )
    dtype_given = resolve_dtype(hyperparam_dtype, "inject_hyperparams")

    def wrapped(*args: Any, **kwargs: Any) -> GradientTransformation:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise AccyError(f"inject_hyperparams: {error}") from None
        bound.apply_defaults()
        schedules, numeric, other = {}, {}, {}
        for name, value in bound.arguments.items():
            if name in static or isinstance(value, bool | int) or value is None:
                other[name] = value
            elif is_stateful_schedule(value):
                schedules[name] = value
            elif callable(value):
                schedules[name] = WrappedSchedule(value)
            elif _is_float_value(value):
                numeric[name] = value
            else:
                other[name] = value

        def scheduled(states: dict, dtype: DType, like: Any, extra: dict) -> dict:
            return {
                k: _as_dtype(f(states[k], **extra), dtype, like, True) for k, f in schedules.items()
            }

        def init(params):
            dtype = dtype_given or _highest_float(params)
            like = first_leaf(params)
            force = dtype_given is not None
            values = {k: _as_dtype(v, dtype, like, force) for k, v in numeric.items()}
            states = {
                k: f.init(like) if isinstance(f, WrappedSchedule) else f.init()
                for k, f in schedules.items()
            }
            values.update(scheduled(states, dtype, like, {}))
            return InjectHyperparamsState(
                zeros_count(params), values, states, inner_factory(**other, **values).init(params)
            )

        def update(updates, state, params=None, **extra):
            dtype = dtype_given or _highest_float(params if params is not None else updates)
            like = state.count
            values = {
                k: _as_dtype(v, dtype, like, dtype_given is not None)
                for k, v in state.hyperparams.items()
                if k not in schedules
            }
            values.update(scheduled(state.hyperparams_states, dtype, like, extra))
            states = {
                k: f.update(state.hyperparams_states[k], **extra) for k, f in schedules.items()
            }
            updates, inner_state = inner_factory(**other, **values).update(
                updates, state.inner_state, params, **extra
            )
            return updates, InjectHyperparamsState(
                safe_increment(state.count), values, states, inner_state
            )

        return GradientTransformation(init, update)

    return wrapped


def _as_dtype(value: Any, dtype: DType, like: Any, force: bool) -> Any:
    """A hyperparameter as a scalar array where `like` lives: in `dtype`, or in its own
    float dtype when it is an accy float array and `force` is False."""
    if is_traced(value):
        if value.dtype.is_float and not force:
            return value
        return value.convert(dtype)
    return scalar_like(like, dtype, float(np.asarray(value)))
