"""Schedules: functions from a step count to a value (a learning rate, a weight decay), as
optax's. Given a Python or NumPy number they compute in NumPy float32 and return a NumPy
float32; given an accy i32 count (a NamedArray, or a traced value inside `accy.jit`) they
return an f32 scalar of the same kind, so a scheduled optimizer compiles once.

>>> s = warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps=2, decay_steps=10, end_value=0.1)
>>> [round(float(s(t)), 4) for t in (0, 1, 2, 6, 10, 20)]
[0.0, 0.5, 1.0, 0.55, 0.1, 0.1]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core.types import f32
from ..errors import AccyError
from .base import is_traced

Schedule = Callable[[Any], Any]


# -- the arithmetic schedules need, on NumPy numbers or on accy values ---------------------------


def _count(count: Any) -> Any:
    """The step count as f32: an accy value, or NumPy float32 (a scalar or an array of
    counts, computed elementwise)."""
    if is_traced(count):
        return count.convert(f32) if count.dtype != f32 else count
    counts = np.asarray(count, np.float32)
    return counts if counts.ndim else np.float32(counts)


def _where(condition: Any, on_true: Any, on_false: Any) -> Any:
    if is_traced(condition):
        if not is_traced(on_true) and not is_traced(on_false):
            on_true = condition.builder.scalar(f32, float(on_true))
        return condition.builder.select(condition, on_true, on_false)
    return _float(np.where(condition, on_true, on_false))


def _minimum(a: Any, b: Any) -> Any:
    if is_traced(a):
        return a.min(b)
    if is_traced(b):
        return b.min(a)
    return np.minimum(np.float32(a), np.float32(b))


def _maximum(a: Any, b: Any) -> Any:
    if is_traced(a):
        return a.max(b)
    if is_traced(b):
        return b.max(a)
    return np.maximum(np.float32(a), np.float32(b))


def _cos(x: Any) -> Any:
    return x.cos() if is_traced(x) else np.cos(np.float32(x))


def _floor(x: Any) -> Any:
    return x.floor() if is_traced(x) else np.floor(x)


def _pow(base: Any, exponent: Any) -> Any:
    if is_traced(exponent) and not is_traced(base):
        return exponent.builder.scalar(f32, float(base)) ** exponent
    if is_traced(base):
        return base**exponent
    return np.power(np.float32(base), np.float32(exponent))


def _float(value: Any) -> Any:
    """A schedule's result: NumPy float32 (a scalar, or an array for an array of counts)."""
    if is_traced(value):
        return value
    value = np.asarray(value, np.float32)
    return value if value.ndim else np.float32(value)


# -- schedules ---------------------------------------------------------------------------------


def constant_schedule(value: Any) -> Schedule:
    """Always `value`.

    >>> constant_schedule(0.5)(10)
    0.5
    """
    return lambda count: value


def polynomial_schedule(
    init_value: float,
    end_value: float,
    power: float,
    transition_steps: int,
    transition_begin: int = 0,
) -> Schedule:
    """From `init_value` to `end_value` over `transition_steps` steps (after
    `transition_begin`) as `(init - end) * (1 - t / steps) ** power + end`; constant at
    `init_value` when transition_steps <= 0.

    >>> [float(polynomial_schedule(10.0, 0.0, 2, 10)(t)) for t in (0, 5, 10, 15)]
    [10.0, 2.5, 0.0, 0.0]
    """
    if transition_steps <= 0:
        return lambda count: init_value
    begin = max(transition_begin, 0)

    def schedule(count):
        t = _minimum(_maximum(_count(count) - float(begin), 0.0), float(transition_steps))
        fraction = 1.0 - t / float(transition_steps)
        return _float((init_value - end_value) * _pow(fraction, power) + end_value)

    return schedule


def linear_schedule(
    init_value: float, end_value: float, transition_steps: int, transition_begin: int = 0
) -> Schedule:
    """Linear from `init_value` to `end_value` over `transition_steps` steps.

    >>> [float(linear_schedule(1.0, 0.0, 4)(t)) for t in (0, 1, 4, 9)]
    [1.0, 0.75, 0.0, 0.0]
    """
    return polynomial_schedule(init_value, end_value, 1, transition_steps, transition_begin)


def piecewise_constant_schedule(
    init_value: float, boundaries_and_scales: dict[int, float] | None = None
) -> Schedule:
    """`init_value`, multiplied by `scale` from each boundary step on.

    >>> s = piecewise_constant_schedule(1.0, {2: 0.5, 4: 0.1})
    >>> [round(float(s(t)), 3) for t in (0, 2, 3, 4, 5)]
    [1.0, 0.5, 0.5, 0.05, 0.05]
    """
    items = sorted((boundaries_and_scales or {}).items())
    if any(scale < 0.0 for _, scale in items):
        raise AccyError("piecewise_constant_schedule: the scale factors must be non-negative")

    def schedule(count):
        c = _count(count)
        value: Any = init_value
        for boundary, scale in items:
            # the scale applies from the boundary on (optax's max(0, sign(boundary - count)))
            value = _where(c < float(boundary), value, value * scale)
        return _float(value)

    return schedule


def exponential_decay(
    init_value: float,
    transition_steps: int,
    decay_rate: float,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: float | None = None,
) -> Schedule:
    """`init_value * decay_rate ** ((count - begin) / transition_steps)` (the exponent
    floored with `staircase`), `init_value` before `transition_begin`, bounded by
    `end_value`; constant when transition_steps <= 0 or decay_rate == 0.

    >>> [round(float(exponential_decay(1.0, 2, 0.5)(t)), 4) for t in (0, 1, 2, 4)]
    [1.0, 0.7071, 0.5, 0.25]
    """
    if transition_steps <= 0 or decay_rate == 0:
        return lambda count: init_value
    begin = max(transition_begin, 0)
    bound = None if end_value is None else (_maximum if decay_rate < 1.0 else _minimum)

    def schedule(count):
        decreased = _count(count) - float(begin)
        exponent = decreased / float(transition_steps)
        if staircase:
            exponent = _floor(exponent)
        decayed = init_value * _pow(decay_rate, exponent)
        value = _where(decreased <= 0.0, init_value, decayed)
        if bound is not None:
            value = bound(value, end_value)
        return _float(value)

    return schedule


def cosine_decay_schedule(
    init_value: float, decay_steps: int, alpha: float = 0.0, exponent: float = 1.0
) -> Schedule:
    """A cosine from `init_value` down to `alpha * init_value` over `decay_steps` steps,
    then constant: `init * ((1 - alpha) * (0.5 (1 + cos(pi t / steps))) ** exponent + alpha)`.

    >>> [round(float(cosine_decay_schedule(1.0, 10, alpha=0.1)(t)), 3) for t in (0, 5, 10, 11)]
    [1.0, 0.55, 0.1, 0.1]
    """
    if not decay_steps > 0:
        raise AccyError(f"cosine_decay_schedule: decay_steps={decay_steps}; it must be positive")

    def schedule(count):
        t = _minimum(_count(count), float(decay_steps))
        cosine = 0.5 * (1.0 + _cos(t * (math.pi / float(decay_steps))))
        return _float(init_value * ((1.0 - alpha) * _pow(cosine, exponent) + alpha))

    return schedule


def join_schedules(schedules: Sequence[Schedule], boundaries: Sequence[int]) -> Schedule:
    """`schedules[i]` from `boundaries[i - 1]` on, each counting from its own boundary.

    >>> s = join_schedules([constant_schedule(1.0), linear_schedule(1.0, 0.0, 2)], [3])
    >>> [float(s(t)) for t in (0, 2, 3, 4, 5)]
    [1.0, 1.0, 1.0, 0.5, 0.0]
    """
    if len(boundaries) != len(schedules) - 1:
        raise AccyError(
            f"join_schedules: {len(schedules)} schedules need {len(schedules) - 1} "
            f"boundaries, got {len(boundaries)}"
        )

    def schedule(count):
        value = schedules[0](count)
        for boundary, following in zip(boundaries, schedules[1:], strict=True):
            shifted = following(
                count - boundary if is_traced(count) else np.asarray(count) - boundary
            )
            value = _where(count < boundary, value, shifted)
        return _float(value)

    return schedule


def warmup_constant_schedule(init_value: float, peak_value: float, warmup_steps: int) -> Schedule:
    """Linear from `init_value` to `peak_value` over `warmup_steps`, then constant.

    >>> float(warmup_constant_schedule(0.0, 1.0, 4)(2))
    0.5
    """
    return linear_schedule(init_value, peak_value, warmup_steps)


def warmup_cosine_decay_schedule(
    init_value: float,
    peak_value: float,
    warmup_steps: int,
    decay_steps: int,
    end_value: float = 0.0,
    exponent: float = 1.0,
) -> Schedule:
    """Linear warmup from `init_value` to `peak_value` over `warmup_steps`, then a cosine
    decay to `end_value` at step `decay_steps` (counted from 0, warmup included).

    >>> s = warmup_cosine_decay_schedule(0.0, 1.0, 2, 6, end_value=0.5)
    >>> [round(float(s(t)), 3) for t in (0, 1, 2, 4, 6, 9)]
    [0.0, 0.5, 1.0, 0.75, 0.5, 0.5]
    """
    if decay_steps - warmup_steps <= 0:
        raise AccyError(
            f"warmup_cosine_decay_schedule: decay_steps={decay_steps} must exceed "
            f"warmup_steps={warmup_steps} (decay_steps counts the warmup too)"
        )
    alpha = 0.0 if peak_value == 0.0 else end_value / peak_value
    return join_schedules(
        [
            linear_schedule(init_value, peak_value, warmup_steps),
            cosine_decay_schedule(peak_value, decay_steps - warmup_steps, alpha, exponent),
        ],
        [warmup_steps],
    )


def warmup_exponential_decay_schedule(
    init_value: float,
    peak_value: float,
    warmup_steps: int,
    transition_steps: int,
    decay_rate: float,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: float | None = None,
) -> Schedule:
    """Linear warmup to `peak_value`, then `exponential_decay` from it.

    >>> float(warmup_exponential_decay_schedule(0.0, 1.0, 2, 1, 0.5)(3))
    0.5
    """
    return join_schedules(
        [
            linear_schedule(init_value, peak_value, warmup_steps),
            exponential_decay(
                peak_value, transition_steps, decay_rate, transition_begin, staircase, end_value
            ),
        ],
        [warmup_steps],
    )


def sgdr_schedule(cosine_kwargs: Sequence[dict[str, Any]]) -> Schedule:
    """Warm restarts: `warmup_cosine_decay_schedule(**kwargs)` for each entry, one after the
    other, each lasting its `decay_steps`.

    >>> s = sgdr_schedule([dict(init_value=0.0, peak_value=1.0, warmup_steps=1, decay_steps=3)] * 2)
    >>> [round(float(s(t)), 3) for t in (0, 1, 3, 4)]
    [0.0, 1.0, 0.0, 1.0]
    """
    boundaries, schedules, step = [], [], 0
    for kwargs in cosine_kwargs:
        schedules.append(warmup_cosine_decay_schedule(**kwargs))
        step += kwargs["decay_steps"]
        boundaries.append(step)
    return join_schedules(schedules, boundaries[:-1])


def piecewise_interpolate_schedule(
    interpolate_type: str,
    init_value: float,
    boundaries_and_scales: dict[int, float] | None = None,
) -> Schedule:
    """Values `init_value * prod(scales up to boundary i)` at the boundaries, interpolated
    linearly or by a cosine ("linear", "cosine") between them, constant after the last.

    >>> s = piecewise_interpolate_schedule("linear", 1.0, {4: 2.0})
    >>> [float(s(t)) for t in (0, 2, 4, 8)]
    [1.0, 1.5, 2.0, 2.0]
    """
    if interpolate_type not in ("linear", "cosine"):
        raise AccyError(
            f"piecewise_interpolate_schedule: interpolate_type={interpolate_type!r}; it must "
            "be 'linear' or 'cosine'"
        )
    items = sorted((boundaries_and_scales or {}).items())
    if any(scale < 0.0 for _, scale in items):
        raise AccyError("piecewise_interpolate_schedule: the scale factors must be non-negative")
    bounds = [0] + [b for b, _ in items]
    values = list(np.cumprod(np.array([init_value] + [s for _, s in items], np.float32)))

    def interpolate(start: float, end: float, fraction: Any) -> Any:
        if interpolate_type == "linear":
            return (end - start) * fraction + start
        return end + (start - end) / 2.0 * (_cos(fraction * math.pi) + 1.0)

    def schedule(count):
        c = _count(count)
        value: Any = 0.0
        for lo, hi, start, end in zip(bounds, bounds[1:], values, values[1:], strict=False):
            fraction = (c - float(lo)) / float(max(hi - lo, 1))
            inside = (c >= float(lo)) & (c < float(hi))
            value = value + _where(inside, interpolate(float(start), float(end), fraction), 0.0)
        value = value + _where(c >= float(bounds[-1]), float(values[-1]), 0.0)
        return _float(value)

    return schedule


def linear_onecycle_schedule(
    transition_steps: int,
    peak_value: float,
    pct_start: float = 0.3,
    pct_final: float = 0.85,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> Schedule:
    """The one-cycle schedule with linear pieces (optax.linear_onecycle_schedule).

    >>> round(float(linear_onecycle_schedule(100, 1.0)(30)), 3)
    1.0
    """
    if transition_steps <= 0:
        raise AccyError(
            f"linear_onecycle_schedule: transition_steps={transition_steps} must be positive"
        )
    return piecewise_interpolate_schedule(
        "linear",
        peak_value / div_factor,
        {
            int(pct_start * transition_steps): div_factor,
            int(pct_final * transition_steps): 1.0 / div_factor,
            transition_steps: 1.0 / final_div_factor,
        },
    )


def cosine_onecycle_schedule(
    transition_steps: int,
    peak_value: float,
    pct_start: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> Schedule:
    """The one-cycle schedule with cosine pieces (optax.cosine_onecycle_schedule).

    >>> round(float(cosine_onecycle_schedule(100, 1.0)(30)), 3)
    1.0
    """
    if transition_steps <= 0:
        raise AccyError(
            f"cosine_onecycle_schedule: transition_steps={transition_steps} must be positive"
        )
    return piecewise_interpolate_schedule(
        "cosine",
        peak_value / div_factor,
        {
            int(pct_start * transition_steps): div_factor,
            int(transition_steps): 1.0 / (div_factor * final_div_factor),
        },
    )
