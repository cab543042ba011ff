"""The gradient transformations optimizers are chained from (optax's `scale_by_*`, clipping,
weight decay, momentum), each a `GradientTransformation` over trees of accy arrays.

Hyperparameters are Python numbers or scalar arrays (as `inject_hyperparams` passes them);
a learning rate or weight decay may also be a schedule (a function of the i32 step count).
Updates of 16-bit floats (f16, bf16) are computed in f32 and rounded once to the gradient's
dtype; their moments are kept in the parameters' dtype unless `mu_dtype` says otherwise.

>>> import accy, numpy as np
>>> g = {"w": accy.named(np.array([3.0, 4.0], np.float32), ("a",), device="reference")}
>>> clipped, _ = clip_by_global_norm(1.0).update(g, clip_by_global_norm(1.0).init(g))
>>> [round(v, 3) for v in clipped["w"].array.tolist()]
[0.6, 0.8]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..core.types import bool_, f32, i32
from ..errors import AccyError
from ..frontend.tracing import flatten, unflatten
from .base import (
    EmptyState,
    GradientTransformation,
    as_float,
    bias_correction,
    cast,
    compute_in,
    first_leaf,
    full_like,
    global_norm,
    identity,
    init_empty_state,
    leafwise,
    needs_params,
    power,
    resolve_dtype,
    safe_increment,
    scalar_like,
    tree_full_like,
    tree_leaves,
    tree_map,
    tree_zeros_like,
    zeros_count,
    zeros_shaped,
)


def _wide(x: Any) -> Any:
    """`x` in the dtype its update is computed in (f32 for the 16-bit floats)."""
    return x.convert(compute_in(x.dtype))


def _hyper(h: Any, like: Any) -> Any:
    """A hyperparameter ready to combine with `like` (its dtype)."""
    return as_float(h, like.dtype)


def _moment(g: Any, t: Any, decay: Any, order: int) -> Any:
    """optax's update_moment: `(1 - decay) * g**order + decay * t` (in t's compute dtype)."""
    t = _wide(t)
    g = _wide(g).convert(t.dtype)
    d = _hyper(decay, t)
    return (1.0 - d) * (g if order == 1 else g * g) + d * t


def _squares(params: Any, value: Any = 0.0) -> Any:
    """A second moment (a running mean or sum of squared gradients) per parameter, filled with
    `value`: in the parameter's dtype, except f32 for f16 parameters, whose squares of small
    gradients would underflow to 0 (a gradient of 1e-4 has a square below f16's smallest
    number) and whose range ends at 65504."""
    return tree_map(lambda p: full_like(p, value, f32 if p.dtype.name == "f16" else None), params)


_debias = bias_correction  # for the transformations whose argument `bias_correction` hides it


def _keep(new: Any, old: Any) -> Any:
    """New state leaves in the dtypes of the old ones: a state keeps its types from step to
    step (gradients of another dtype than the parameters' included)."""
    return tree_map(lambda n, o: n.convert(o.dtype), new, old)


# -- scaling -----------------------------------------------------------------------------------


def scale(step_size: Any) -> GradientTransformation:
    """Multiply every update by `step_size` (optax.scale).

    >>> import accy, numpy as np
    >>> u = [accy.named(np.array([2.0]), ("a",), device="reference")]
    >>> scale(-0.5).update(u, EmptyState())[0][0].array.tolist()
    [-1.0]
    """

    def update(updates, state, params=None, **extra):
        return tree_map(lambda g: g * _hyper(step_size, g), updates), state

    return GradientTransformation(init_empty_state, update)


class ScaleByScheduleState(NamedTuple):
    count: Any


def scale_by_schedule(step_size_fn: Callable[[Any], Any]) -> GradientTransformation:
    """Multiply the updates by `step_size_fn(count)`, the count of steps taken before this one
    (optax.scale_by_schedule).

    >>> import accy, numpy as np
    >>> u = [accy.named(np.array([2.0], np.float32), ("a",), device="reference")]
    >>> t = scale_by_schedule(lambda count: 1.0 + count.convert(accy.f32))
    >>> out, s = t.update(u, t.init(u))
    >>> out[0].array.tolist(), int(s.count)
    ([2.0], 1)
    """

    def init(params):
        return ScaleByScheduleState(zeros_count(params))

    def update(updates, state, params=None, **extra):
        step = step_size_fn(state.count)
        updates = tree_map(lambda g: g * _hyper(step, g), updates)
        return updates, ScaleByScheduleState(safe_increment(state.count))

    return GradientTransformation(init, update)


def scale_by_learning_rate(learning_rate: Any, *, flip_sign: bool = True) -> GradientTransformation:
    """Multiply by `-learning_rate` (or `learning_rate`, flip_sign=False); a schedule too.

    >>> scale_by_learning_rate(0.1).init([])
    EmptyState()
    """
    if learning_rate is None:
        return identity()
    sign = -1.0 if flip_sign else 1.0
    if callable(learning_rate):
        return scale_by_schedule(lambda count: learning_rate(count) * sign)
    if hasattr(learning_rate, "ty"):
        return scale(learning_rate * sign)
    return scale(sign * learning_rate)


# -- momentum ----------------------------------------------------------------------------------


class TraceState(NamedTuple):
    trace: Any


def trace(
    decay: Any, nesterov: bool = False, accumulator_dtype: Any = None
) -> GradientTransformation:
    """Momentum: `t = g + decay * t`; the update is t (or `g + decay * t` with nesterov).

    >>> import accy, numpy as np
    >>> u = [accy.named(np.array([1.0]), ("a",), device="reference")]
    >>> t = trace(0.5)
    >>> out, s = t.update(u, t.init(u))
    >>> out, s = t.update(u, s)
    >>> out[0].array.tolist()
    [1.5]
    """
    dtype = resolve_dtype(accumulator_dtype, "trace")

    def init(params):
        return TraceState(tree_zeros_like(params, dtype))

    def update(updates, state, params=None, **extra):
        def one(g, t):
            wide = _wide(g).convert(compute_in(t.dtype))
            new = wide + _hyper(decay, wide) * _wide(t)
            out = wide + _hyper(decay, wide) * new if nesterov else new
            return out.convert(g.dtype), new.convert(t.dtype)

        out, new = leafwise(one, 2, updates, state.trace, where="trace")
        return out, TraceState(new)

    return GradientTransformation(init, update)


class EmaState(NamedTuple):
    count: Any
    ema: Any


def ema(decay: Any, debias: bool = True, accumulator_dtype: Any = None) -> GradientTransformation:
    """An exponential moving average of the updates, optionally debiased (optax.ema).

    >>> import accy, numpy as np
    >>> u = [accy.named(np.array([2.0], np.float32), ("a",), device="reference")]
    >>> t = ema(0.5)
    >>> t.update(u, t.init(u))[0][0].array.tolist()  # debiased: 1.0 / (1 - 0.5)
    [2.0]
    """
    dtype = resolve_dtype(accumulator_dtype, "ema")

    def init(params):
        return EmaState(zeros_count(params), tree_zeros_like(params, dtype))

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count)

        def one(g, t):
            new = _moment(g, t, decay, 1)
            out = bias_correction(new, decay, count) if debias else new
            return out.convert(g.dtype), new.convert(t.dtype)

        out, new = leafwise(one, 2, updates, state.ema, where="ema")
        return out, EmaState(count, new)

    return GradientTransformation(init, update)


# -- adaptive scalings -------------------------------------------------------------------------


class ScaleByAdamState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


def _nesterov_mu(m: Any, g: Any, b1: Any, count: Any) -> Any:
    """Nesterov's first moment: `b1 m / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t)`."""
    b = _hyper(b1, m)
    return b * bias_correction(m, b1, safe_increment(count)) + (1.0 - b) * bias_correction(
        _wide(g).convert(m.dtype), b1, count
    )


def scale_by_adam(
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    mu_dtype: Any = None,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """Adam's rescaling: `m_hat / (sqrt(v_hat + eps_root) + eps)` (optax.scale_by_adam).

    The update is computed in f32 for f16 and bf16 gradients (in f16, eps = 1e-8 is 0, and a
    zero gradient would give 0 / 0 = NaN), then rounded to the gradient's dtype.

    >>> import accy, numpy as np
    >>> g = [accy.named(np.array([0.0, 1e-3], np.float16), ("a",), device="reference")]
    >>> t = scale_by_adam()
    >>> t.update(g, t.init(g))[0][0].array.tolist()
    [0.0, 1.0]
    """
    mu_dtype = resolve_dtype(mu_dtype, "scale_by_adam")

    def init(params):
        return ScaleByAdamState(
            zeros_count(params), tree_zeros_like(params, mu_dtype), _squares(params)
        )

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count)

        def one(g, m, v):
            m, v = _moment(g, m, b1, 1), _moment(g, v, b2, 2)
            m_hat = _nesterov_mu(m, g, b1, count) if nesterov else bias_correction(m, b1, count)
            v_hat = bias_correction(v, b2, count).convert(m_hat.dtype)
            out = m_hat / ((v_hat + _hyper(eps_root, v_hat)).sqrt() + _hyper(eps, v_hat))
            return out.convert(g.dtype), cast(m, mu_dtype or g.dtype), v.convert(g.dtype)

        out, mu, nu = leafwise(one, 3, updates, state.mu, state.nu, where="scale_by_adam")
        return out, ScaleByAdamState(count, _keep(mu, state.mu), _keep(nu, state.nu))

    return GradientTransformation(init, update)


class ScaleByAmsgradState(NamedTuple):
    count: Any
    mu: Any
    nu: Any
    nu_max: Any


def scale_by_amsgrad(
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    mu_dtype: Any = None,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> GradientTransformation:
    """AMSGrad: Adam with the running maximum of the second moment (optax.scale_by_amsgrad).

    >>> scale_by_amsgrad().init([])[1:]
    ([], [], [])
    """
    mu_dtype = resolve_dtype(mu_dtype, "scale_by_amsgrad")

    def init(params):
        return ScaleByAmsgradState(
            zeros_count(params),
            tree_zeros_like(params, mu_dtype),
            _squares(params),
            _squares(params),
        )

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count)

        def one(g, m, v, v_max):
            m, v = _moment(g, m, b1, 1), _moment(g, v, b2, 2)
            m_hat = bias_correction(m, b1, count) if bias_correction_mu else m
            v_eff = bias_correction(v, b2, count) if bias_correction_nu else v
            v_max = _wide(v_max).max(v_eff.convert(compute_in(v_max.dtype)))
            v_max_c = v_max.convert(m_hat.dtype)
            out = m_hat / ((v_max_c + _hyper(eps_root, v_max_c)).sqrt() + _hyper(eps, v_max_c))
            return (
                out.convert(g.dtype),
                cast(m, mu_dtype or g.dtype),
                v.convert(g.dtype),
                v_max.convert(g.dtype),
            )

        out, mu, nu, nu_max = leafwise(
            one, 4, updates, state.mu, state.nu, state.nu_max, where="scale_by_amsgrad"
        )
        return out, ScaleByAmsgradState(
            count, _keep(mu, state.mu), _keep(nu, state.nu), _keep(nu_max, state.nu_max)
        )

    return GradientTransformation(init, update)


def scale_by_adamax(b1: Any = 0.9, b2: Any = 0.999, eps: Any = 1e-8) -> GradientTransformation:
    """AdaMax: the first moment over the infinity norm's running maximum.

    >>> scale_by_adamax().init([])[1:]
    ([], [])
    """

    def init(params):
        return ScaleByAdamState(
            zeros_count(params), tree_zeros_like(params), tree_zeros_like(params)
        )

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count)

        def one(g, m, v):
            m = _moment(g, m, b1, 1)
            wide_v = _wide(v)
            v = (_wide(g).abs() + _hyper(eps, wide_v)).max(_hyper(b2, wide_v) * wide_v)
            out = bias_correction(m, b1, count) / v
            return out.convert(g.dtype), m.convert(g.dtype), v.convert(g.dtype)

        out, mu, nu = leafwise(one, 3, updates, state.mu, state.nu, where="scale_by_adamax")
        return out, ScaleByAdamState(count, _keep(mu, state.mu), _keep(nu, state.nu))

    return GradientTransformation(init, update)


class ScaleByLionState(NamedTuple):
    count: Any
    mu: Any


def scale_by_lion(b1: Any = 0.9, b2: Any = 0.99, mu_dtype: Any = None) -> GradientTransformation:
    """Lion: `sign((1 - b1) g + b1 m)`, then `m = (1 - b2) g + b2 m` (optax.scale_by_lion).

    >>> import accy, numpy as np
    >>> g = [accy.named(np.array([-2.0, 3.0], np.float32), ("a",), device="reference")]
    >>> t = scale_by_lion()
    >>> t.update(g, t.init(g))[0][0].array.tolist()
    [-1.0, 1.0]
    """
    mu_dtype = resolve_dtype(mu_dtype, "scale_by_lion")

    def init(params):
        return ScaleByLionState(zeros_count(params), tree_zeros_like(params, mu_dtype))

    def update(updates, state, params=None, **extra):
        def one(g, m):
            wide_m = _wide(m)
            b = _hyper(b1, wide_m)
            out = ((1.0 - b) * _wide(g).convert(wide_m.dtype) + b * wide_m).sign()
            return out.convert(g.dtype), _moment(g, m, b2, 1).convert(m.dtype)

        out, mu = leafwise(one, 2, updates, state.mu, where="scale_by_lion")
        return out, ScaleByLionState(safe_increment(state.count), mu)

    return GradientTransformation(init, update)


class ScaleByRmsState(NamedTuple):
    nu: Any


class ScaleByRmsWithCountState(NamedTuple):
    count: Any
    nu: Any


def scale_by_rms(
    decay: Any = 0.9,
    eps: Any = 1e-8,
    initial_scale: Any = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
) -> GradientTransformation:
    """RMSProp's rescaling by the root of a moving average of squared updates.

    >>> scale_by_rms().init([])
    ScaleByRmsState(nu=[])
    """

    def init(params):
        nu = _squares(params, initial_scale)
        if bias_correction:
            return ScaleByRmsWithCountState(zeros_count(params), nu)
        return ScaleByRmsState(nu)

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count) if bias_correction else None

        def one(g, v):
            v = _moment(g, v, decay, 2)
            v_hat = _debias(v, decay, count) if bias_correction else v
            e = _hyper(eps, v_hat)
            scaling = (v_hat + e).rsqrt() if eps_in_sqrt else 1.0 / (v_hat.sqrt() + e)
            return (scaling * _wide(g)).convert(g.dtype), v.convert(g.dtype)

        out, nu = leafwise(one, 2, updates, state.nu, where="scale_by_rms")
        if bias_correction:
            return out, ScaleByRmsWithCountState(count, _keep(nu, state.nu))
        return out, ScaleByRmsState(_keep(nu, state.nu))

    return GradientTransformation(init, update)


class ScaleByRStdDevState(NamedTuple):
    mu: Any
    nu: Any


class ScaleByRStdDevWithCountState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


def scale_by_stddev(
    decay: Any = 0.9,
    eps: Any = 1e-8,
    initial_scale: Any = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
) -> GradientTransformation:
    """Centred RMSProp's rescaling by the updates' running standard deviation.

    >>> scale_by_stddev().init([])
    ScaleByRStdDevState(mu=[], nu=[])
    """

    def init(params):
        mu, nu = tree_zeros_like(params), _squares(params, initial_scale)
        if bias_correction:
            return ScaleByRStdDevWithCountState(zeros_count(params), mu, nu)
        return ScaleByRStdDevState(mu, nu)

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count) if bias_correction else None

        def one(g, m, v):
            m, v = _moment(g, m, decay, 1), _moment(g, v, decay, 2)
            m_hat = _debias(m, decay, count) if bias_correction else m
            v_hat = _debias(v, decay, count) if bias_correction else v
            e = _hyper(eps, v_hat)
            spread = v_hat - m_hat * m_hat
            scaling = (spread + e).rsqrt() if eps_in_sqrt else 1.0 / (spread.sqrt() + e)
            return (scaling * _wide(g)).convert(g.dtype), m.convert(g.dtype), v.convert(g.dtype)

        out, mu, nu = leafwise(one, 3, updates, state.mu, state.nu, where="scale_by_stddev")
        if bias_correction:
            return out, ScaleByRStdDevWithCountState(
                count, _keep(mu, state.mu), _keep(nu, state.nu)
            )
        return out, ScaleByRStdDevState(_keep(mu, state.mu), _keep(nu, state.nu))

    return GradientTransformation(init, update)


class ScaleByRssState(NamedTuple):
    sum_of_squares: Any


def scale_by_rss(initial_accumulator_value: Any = 0.1, eps: Any = 1e-7) -> GradientTransformation:
    """Adagrad's rescaling by the root of the sum of all squared updates so far.

    >>> scale_by_rss().init([])
    ScaleByRssState(sum_of_squares=[])
    """

    def init(params):
        return ScaleByRssState(_squares(params, initial_accumulator_value))

    def update(updates, state, params=None, **extra):
        def one(g, s):
            wide = _wide(g)
            s = wide * wide + _wide(s)
            inverse = g.builder.select(s > 0.0, (s + _hyper(eps, s)).rsqrt(), 0.0)
            return (inverse * wide).convert(g.dtype), s.convert(g.dtype)

        out, s = leafwise(one, 2, updates, state.sum_of_squares, where="scale_by_rss")
        return out, ScaleByRssState(_keep(s, state.sum_of_squares))

    return GradientTransformation(init, update)


class ScaleByBeliefState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


def scale_by_belief(
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-16,
    eps_root: Any = 1e-16,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """AdaBelief: Adam whose second moment is that of the prediction error `g - m`.

    >>> scale_by_belief().init([])[1:]
    ([], [])
    """

    def init(params):
        return ScaleByBeliefState(zeros_count(params), tree_zeros_like(params), _squares(params))

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count)

        def one(g, m, s):
            m = _moment(g, m, b1, 1)
            error = _wide(g) - m
            s = _moment(error, s, b2, 2)
            s = s + _hyper(eps_root, s)
            m_hat = _nesterov_mu(m, g, b1, count) if nesterov else bias_correction(m, b1, count)
            s_hat = bias_correction(s, b2, count)
            out = m_hat / (s_hat.sqrt() + _hyper(eps, s_hat))
            return out.convert(g.dtype), m.convert(g.dtype), s.convert(g.dtype)

        out, mu, nu = leafwise(one, 3, updates, state.mu, state.nu, where="scale_by_belief")
        return out, ScaleByBeliefState(count, _keep(mu, state.mu), _keep(nu, state.nu))

    return GradientTransformation(init, update)


def scale_by_yogi(
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-3,
    eps_root: Any = 0.0,
    initial_accumulator_value: Any = 1e-6,
) -> GradientTransformation:
    """Yogi: Adam whose second moment moves additively, `v -= (1 - b2) sign(v - g^2) g^2`.

    >>> scale_by_yogi().init([])[1:]
    ([], [])
    """

    def init(params):
        full = tree_full_like
        return ScaleByAdamState(
            zeros_count(params),
            full(params, initial_accumulator_value),
            _squares(params, initial_accumulator_value),
        )

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count)

        def one(g, m, v):
            m = _moment(g, m, b1, 1)
            wide_v = _wide(v)
            square = _wide(g) * _wide(g)
            v = wide_v - (1.0 - _hyper(b2, wide_v)) * (wide_v - square).sign() * square
            m_hat, v_hat = bias_correction(m, b1, count), bias_correction(v, b2, count)
            out = m_hat / ((v_hat + _hyper(eps_root, v_hat)).sqrt() + _hyper(eps, v_hat))
            return out.convert(g.dtype), m.convert(g.dtype), v.convert(g.dtype)

        out, mu, nu = leafwise(one, 3, updates, state.mu, state.nu, where="scale_by_yogi")
        return out, ScaleByAdamState(count, _keep(mu, state.mu), _keep(nu, state.nu))

    return GradientTransformation(init, update)


def scale_by_radam(
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    threshold: Any = 5.0,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """Rectified Adam: Adam's step scaled by the variance rectification term once the
    approximated SMA length exceeds `threshold`, the bias-corrected momentum before.

    >>> scale_by_radam().init([])[1:]
    ([], [])
    """
    ro_inf = 2.0 / (1.0 - b2) - 1.0

    def init(params):
        return ScaleByAdamState(zeros_count(params), tree_zeros_like(params), _squares(params))

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count)
        t = count.convert(f32)
        b2t = power(b2, t)
        ro = ro_inf - 2.0 * t * b2t / (1.0 - b2t)
        r = ((ro - 4.0) * (ro - 2.0) * ro_inf / ((ro_inf - 4.0) * (ro_inf - 2.0) * ro)).sqrt()

        def one(g, m, v):
            m, v = _moment(g, m, b1, 1), _moment(g, v, b2, 2)
            m_hat = _nesterov_mu(m, g, b1, count) if nesterov else bias_correction(m, b1, count)
            v_hat = bias_correction(v, b2, count)
            step = (
                r.convert(m_hat.dtype)
                * m_hat
                / ((v_hat + _hyper(eps_root, v_hat)).sqrt() + _hyper(eps, v_hat))
            )
            out = g.builder.select(ro >= threshold, step, m_hat)
            return out.convert(g.dtype), m.convert(g.dtype), v.convert(g.dtype)

        out, mu, nu = leafwise(one, 3, updates, state.mu, state.nu, where="scale_by_radam")
        return out, ScaleByAdamState(count, _keep(mu, state.mu), _keep(nu, state.nu))

    return GradientTransformation(init, update)


def scale_by_sign() -> GradientTransformation:
    """The sign of every update (optax.scale_by_sign).

    >>> import accy, numpy as np
    >>> u = [accy.named(np.array([-2.0, 0.0, 3.0]), ("a",), device="reference")]
    >>> scale_by_sign().update(u, EmptyState())[0][0].array.tolist()
    [-1.0, 0.0, 1.0]
    """

    def update(updates, state, params=None, **extra):
        return tree_map(lambda g: g.sign(), updates), state

    return GradientTransformation(init_empty_state, update)


def _norm(x: Any) -> Any:
    wide = _wide(x)
    return (wide * wide).sum().sqrt()


def _safe_norm(x: Any, min_norm: Any) -> Any:
    """optax's safe_norm: the L2 norm, or `min_norm` where the norm is at most `min_norm`
    (so that the gradient of the norm at zero is finite)."""
    norm = _norm(x)
    small = norm <= _hyper(min_norm, norm)
    safe = _norm(x.builder.select(small, 1.0, x))
    return x.builder.select(small, _hyper(min_norm, norm), safe)


def scale_by_trust_ratio(
    min_norm: Any = 0.0, trust_coefficient: Any = 1.0, eps: Any = 0.0
) -> GradientTransformation:
    """LAMB's and LARS's layer-wise trust ratio: `trust_coefficient * |p| / (|u| + eps)`
    per leaf, 1 where either norm is zero.

    >>> scale_by_trust_ratio().init([])
    EmptyState()
    """

    def update(updates, state, params=None, **extra):
        needs_params(params, "scale_by_trust_ratio")

        def one(u, p):
            p_norm, u_norm = _safe_norm(p, min_norm), _safe_norm(u, min_norm)
            ratio = _hyper(trust_coefficient, p_norm) * p_norm / (u_norm + _hyper(eps, u_norm))
            zero = (p_norm.eq(0.0)) | (u_norm.eq(0.0))
            safe = u.builder.select(zero, 1.0, ratio)
            return (_wide(u) * safe.convert(compute_in(u.dtype))).convert(u.dtype)

        return tree_map(one, updates, params, where="scale_by_trust_ratio"), state

    return GradientTransformation(init_empty_state, update)


def _safe_rms(x: Any, min_rms: Any) -> Any:
    wide = _wide(x)
    rms = (wide * wide).mean().sqrt()
    small = rms <= _hyper(min_rms, rms)
    safe = x.builder.select(small, 1.0, wide)
    return x.builder.select(small, _hyper(min_rms, rms), (safe * safe).mean().sqrt())


def scale_by_param_block_rms(min_scale: Any = 1e-3) -> GradientTransformation:
    """Multiply each update by its parameter's root mean square (at least `min_scale`).

    >>> scale_by_param_block_rms().init([])
    EmptyState()
    """

    def update(updates, state, params=None, **extra):
        needs_params(params, "scale_by_param_block_rms")
        return (
            tree_map(
                lambda u, p: (
                    _wide(u) * _safe_rms(p, min_scale).convert(compute_in(u.dtype))
                ).convert(u.dtype),
                updates,
                params,
                where="scale_by_param_block_rms",
            ),
            state,
        )

    return GradientTransformation(init_empty_state, update)


# -- adafactor ---------------------------------------------------------------------------------


class FactoredState(NamedTuple):
    count: Any
    v_row: Any
    v_col: Any
    v: Any


def factored_axes(leaf: Any, factored: bool, min_dim_size_to_factor: int):
    """The two axes a second moment is factored over: the two largest (ties to the later
    axis in layout order, as optax's argsort over positions), or None if the second largest
    is below `min_dim_size_to_factor` or the array has fewer than two axes.

    >>> import accy, numpy as np
    >>> x = accy.named(np.zeros((2, 256, 128)), ("a", "b", "c"), device="reference")
    >>> factored_axes(x, True, 128)
    ('c', 'b')
    """
    import numpy as np

    extents = leaf.ty.extents
    if not factored or len(extents) < 2:
        return None
    order = np.argsort(extents)
    if extents[order[-2]] < min_dim_size_to_factor:
        return None
    return leaf.axes[int(order[-2])], leaf.axes[int(order[-1])]


def _decay_rate_pow(count: Any, exponent: Any = 0.8) -> Any:
    t = (count + 1).convert(f32)
    return 1.0 - t ** (-_hyper(exponent, t))


def scale_by_factored_rms(
    factored: bool = True,
    decay_rate: Any = 0.8,
    step_offset: Any = 0,
    min_dim_size_to_factor: int = 128,
    epsilon: Any = 1e-30,
    decay_rate_fn: Callable[[Any, Any], Any] = _decay_rate_pow,
) -> GradientTransformation:
    """Adafactor's rescaling by a factored estimate of the second moment.

    Where optax picks the two largest dimensions by position, accy picks the two largest
    named axes (`factored_axes`): a row moment without the largest axis and a column moment
    without the second largest. Other arrays keep a full second moment `v`.

    >>> scale_by_factored_rms().init([])[1:]
    ([], [], [])
    """

    def init(params):
        def one(p):
            axes = factored_axes(p, factored, min_dim_size_to_factor)
            small = _tiny(p)
            if axes is None:
                return small, small, full_zeros(p)
            second, largest = axes
            return _zeros_without(p, largest), _zeros_without(p, second), small

        rows, cols, v = leafwise(one, 3, params, where="scale_by_factored_rms")
        return FactoredState(zeros_count(params), rows, cols, v)

    def update(updates, state, params=None, **extra):
        needs_params(params, "scale_by_factored_rms")
        decay = decay_rate_fn(state.count - step_offset, decay_rate)

        def one(g, row, col, v, p):
            axes = factored_axes(p, factored, min_dim_size_to_factor)
            wide = _wide(g)
            d = decay.convert(wide.dtype)
            square = wide * wide + _hyper(epsilon, wide)
            if axes is None:
                v = d * _wide(v) + (1.0 - d) * square
                v = v.convert(p.dtype)
                out = wide * _wide(v) ** -0.5
                return out.convert(g.dtype), row, col, v
            second, largest = axes
            row = (d * _wide(row) + (1.0 - d) * square.mean(largest)).convert(p.dtype)
            col = (d * _wide(col) + (1.0 - d) * square.mean(second)).convert(p.dtype)
            row_factor = (_wide(row) / _wide(row).mean(second)) ** -0.5
            col_factor = _wide(col) ** -0.5
            out = wide * row_factor * col_factor
            return out.convert(g.dtype), row, col, v

        out, rows, cols, v = leafwise(
            one,
            4,
            updates,
            state.v_row,
            state.v_col,
            state.v,
            params,
            where="scale_by_factored_rms",
        )
        return out, FactoredState(safe_increment(state.count), rows, cols, v)

    return GradientTransformation(init, update)


def _tiny(p: Any) -> Any:
    """A placeholder moment for an unused slot: one element (optax's zeros((1,)))."""
    return zeros_shaped(p, {"factor_": 1})


def _zeros_without(p: Any, axis: str) -> Any:
    return zeros_shaped(p, {a: n for a, n in p.ty.named_extents if a != axis})


def full_zeros(p: Any) -> Any:
    return full_like(p, 0.0)


# -- weight decay and clipping -----------------------------------------------------------------


class WeightDecayScheduleState(NamedTuple):
    count: Any


def add_decayed_weights(weight_decay: Any = 0.0, mask: Any = None) -> GradientTransformation:
    """Add `weight_decay * param` to each update (decoupled weight decay); `mask` (a tree
    of bools, a prefix of the parameters', or a function of the parameters returning one)
    says which parameters decay. `weight_decay` may be a schedule.

    >>> import accy, numpy as np
    >>> p = {"w": accy.named(np.array([2.0]), ("a",), device="reference")}
    >>> t = add_decayed_weights(0.5)
    >>> t.update({"w": p["w"] * 0.0}, t.init(p), p)[0]["w"].array.tolist()
    [1.0]
    """

    def init(params):
        if callable(weight_decay):
            return WeightDecayScheduleState(zeros_count(params))
        return EmptyState()

    def update(updates, state, params=None, **extra):
        needs_params(params, "add_decayed_weights")
        if callable(weight_decay):
            rate, state = (
                weight_decay(state.count),
                WeightDecayScheduleState(safe_increment(state.count)),
            )
        else:
            rate = weight_decay
        if isinstance(rate, int | float) and rate == 0.0:
            return updates, state

        def one(g, p):
            wide = _wide(g)
            return (wide + _hyper(rate, wide) * _wide(p).convert(wide.dtype)).convert(g.dtype)

        return tree_map(one, updates, params, where="add_decayed_weights"), state

    transformation = GradientTransformation(init, update)
    if mask is not None:
        from .wrappers import masked

        return masked(transformation, mask)
    return transformation


def clip(max_delta: Any) -> GradientTransformation:
    """Clip every element of the updates to [-max_delta, max_delta] (optax.clip).

    >>> import accy, numpy as np
    >>> u = [accy.named(np.array([-3.0, 0.5, 2.0]), ("a",), device="reference")]
    >>> clip(1.0).update(u, EmptyState())[0][0].array.tolist()
    [-1.0, 0.5, 1.0]
    """

    def update(updates, state, params=None, **extra):
        def one(g):
            bound = _hyper(max_delta, g)
            return g.max(-bound).min(bound)

        return tree_map(one, updates), state

    return GradientTransformation(init_empty_state, update)


def clip_by_block_rms(threshold: Any) -> GradientTransformation:
    """Scale each update down to a root mean square of at most `threshold`.

    >>> import accy, numpy as np
    >>> u = [accy.named(np.array([3.0, 3.0]), ("a",), device="reference")]
    >>> clip_by_block_rms(1.0).update(u, EmptyState())[0][0].array.tolist()
    [1.0, 1.0]
    """

    def update(updates, state, params=None, **extra):
        def one(g):
            wide = _wide(g)
            rms = (wide * wide).mean().sqrt()
            denominator = (rms / _hyper(threshold, rms)).max(1.0)
            return (wide / denominator).convert(g.dtype)

        return tree_map(one, updates), state

    return GradientTransformation(init_empty_state, update)


def clip_by_global_norm(max_norm: Any) -> GradientTransformation:
    """Scale all updates by `max_norm / global_norm` when their global norm exceeds
    `max_norm` (optax.clip_by_global_norm; the norm is computed in f32 at least).

    >>> clip_by_global_norm(1.0).init([])
    EmptyState()
    """

    def update(updates, state, params=None, **extra):
        if not tree_leaves(updates):
            return updates, state
        norm = global_norm(updates)
        bound = _hyper(max_norm, norm)
        keep = norm < bound

        def one(g):
            wide = _wide(g)
            clipped = wide / norm.convert(wide.dtype) * _hyper(bound, wide)
            return g.builder.select(keep, wide, clipped).convert(g.dtype)

        return tree_map(one, updates), state

    return GradientTransformation(init_empty_state, update)


def unitwise_norm(x: Any, axes: Any = None) -> Any:
    """The L2 norm of `x` over `axes` (names), broadcast back to `x`'s axes: adaptive
    clipping's per-unit norm. Without `axes` the choice follows optax's by rank: everything
    for scalars and vectors (arrays with at most one axis longer than 1), else the first
    axis for two or three axes (the input axis of a linear layer), the first three for four
    (a convolution kernel's spatial and input axes), the first four for five.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([[3.0, 0.0], [4.0, 1.0]]), ("i", "o"), device="reference")
    >>> unitwise_norm(x).array.tolist()
    [[5.0, 1.0], [5.0, 1.0]]
    """
    if axes is None:
        long_axes = [a for a, n in x.ty.named_extents if n != 1]
        rank = len(x.axes)
        if len(long_axes) <= 1:
            axes = tuple(x.axes)
        elif rank in (2, 3):
            axes = x.axes[:1]
        elif rank in (4, 5):
            axes = x.axes[: rank - 1]
        else:
            raise AccyError(
                f"unitwise_norm: no default norm axes for an array of axes {x.axes} (1 to 5 "
                "axes have one); name the axes to reduce: unitwise_norm(x, axes=(...))"
            )
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    missing = [a for a in axes if not x.ty.has(a)]
    if missing:
        raise AccyError(f"unitwise_norm: axes {missing} are not among {x.axes}")
    wide = _wide(x)
    return (wide * wide).sum(axes).sqrt().broadcast_to(wide.ty)


def unitwise_clip(g_norm: Any, max_norm: Any, grad: Any, div_eps: float = 1e-6) -> Any:
    """`grad` scaled down to `max_norm` where its unit norm `g_norm` exceeds it.

    >>> import accy, numpy as np
    >>> g = accy.named(np.array([3.0, 4.0], np.float32), "n")
    >>> norm = accy.named(np.array([5.0, 5.0], np.float32), "n")
    >>> unitwise_clip(norm, 1.0, g).array.tolist()
    [0.6000000238418579, 0.800000011920929]
    """
    wide = _wide(grad)
    clipped = wide * (max_norm / g_norm.max(div_eps))
    return grad.builder.select(g_norm < max_norm, wide, clipped).convert(grad.dtype)


def adaptive_grad_clip(clipping: Any, eps: Any = 1e-3, axes: Any = None) -> GradientTransformation:
    """Adaptive gradient clipping (optax.adaptive_grad_clip): each unit of an update is
    clipped to `clipping * max(unit norm of its parameter, eps)`; units by `unitwise_norm`
    (`axes`: the names of the axes a norm reduces).

    >>> adaptive_grad_clip(0.1).init([])
    EmptyState()
    """

    def update(updates, state, params=None, **extra):
        needs_params(params, "adaptive_grad_clip")

        def one(g, p):
            g_norm, p_norm = (
                unitwise_norm(g, axes),
                unitwise_norm(p, axes).convert(compute_in(g.dtype)),
            )
            return unitwise_clip(g_norm, p_norm.max(_hyper(eps, p_norm)) * clipping, g)

        return tree_map(one, updates, params, where="adaptive_grad_clip"), state

    return GradientTransformation(init_empty_state, update)


def _per_example_norms(grads: Any, batch_axis: str, where: str) -> Any:
    total = None
    for leaf in tree_leaves(grads):
        if not leaf.ty.has(batch_axis):
            raise AccyError(
                f"{where}: a gradient of axes {leaf.axes} has no batch axis {batch_axis!r}; "
                "per-example clipping needs every gradient to have it"
            )
        wide = _wide(leaf)
        others = [a for a in leaf.axes if a != batch_axis]
        part = (wide * wide).sum(others).convert(f32)
        total = part if total is None else total + part
    if total is None:
        raise AccyError(f"{where}: the gradients' tree has no arrays")
    return total.sqrt()


def per_example_global_norm_clip(
    grads: Any, l2_norm_clip: Any, batch_axis: str = "batch"
) -> tuple[Any, Any]:
    """Clip each example's gradient (over `batch_axis`) to a global norm of at most
    `l2_norm_clip`, and sum over the examples: `(summed gradients, number clipped)`
    (optax.per_example_global_norm_clip, with the batch axis named).

    >>> import accy, numpy as np
    >>> g = [accy.named(np.array([[3.0, 4.0], [0.3, 0.4]]), ("batch", "x"), device="reference")]
    >>> total, clipped = per_example_global_norm_clip(g, 1.0)
    >>> [round(v, 3) for v in total[0].array.tolist()], int(clipped)
    ([0.9, 1.2], 1)
    """
    norms = _per_example_norms(grads, batch_axis, "per_example_global_norm_clip")
    ratio = (l2_norm_clip / norms).min(1.0)
    multipliers = norms.builder.select(ratio.ne(ratio), 1.0, ratio)  # 0 / 0: no clipping
    clipped = (multipliers < 1.0).convert(f32).sum().convert(i32)
    summed = tree_map(
        lambda g: (
            multipliers.convert(compute_in(g.dtype)).contract(_wide(g), batch_axis).convert(g.dtype)
        ),
        grads,
    )
    return summed, clipped


def per_example_layer_norm_clip(
    grads: Any, global_l2_norm_clip: Any, uniform: bool = True, batch_axis: str = "batch"
) -> tuple[Any, Any]:
    """Per-example clipping layer by layer (optax.per_example_layer_norm_clip): each leaf is
    clipped with `per_example_global_norm_clip` to `global_clip * sqrt(1 / leaves)`
    (uniform) or `global_clip * sqrt(leaf size / total size)` (per example); returns the
    trees of summed gradients and of counts clipped.

    >>> import accy, numpy as np
    >>> g = [accy.named(np.array([[2.0], [0.5]]), ("batch", "x"), device="reference")]
    >>> total, clipped = per_example_layer_norm_clip(g, 1.0)
    >>> total[0].array.tolist(), int(clipped[0])
    ([1.5], 1)
    """
    leaves = tree_leaves(grads)
    for leaf in leaves:
        if not leaf.ty.has(batch_axis):
            raise AccyError(
                f"per_example_layer_norm_clip: a gradient of axes {leaf.axes} has no batch "
                f"axis {batch_axis!r}"
            )
    sizes = [leaf.ty.size // leaf.shape[batch_axis] for leaf in leaves]

    def one(g, size):
        share = 1.0 / len(leaves) if uniform else size / sum(sizes)
        total, count = per_example_global_norm_clip(
            [g], global_l2_norm_clip * share**0.5, batch_axis
        )
        return total[0], count

    results = [one(g, n) for g, n in zip(leaves, sizes, strict=True)]
    treedef = flatten(grads)[1]
    return unflatten(treedef, [r[0] for r in results]), unflatten(treedef, [r[1] for r in results])


# -- the rest of optax's scalings --------------------------------------------------------------


class ScaleByAdaDeltaState(NamedTuple):
    e_g: Any
    e_x: Any


def scale_by_adadelta(rho: Any = 0.9, eps: Any = 1e-6) -> GradientTransformation:
    """AdaDelta: `sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps) * g` (optax.scale_by_adadelta).

    >>> scale_by_adadelta().init([])
    ScaleByAdaDeltaState(e_g=[], e_x=[])
    """

    def init(params):
        return ScaleByAdaDeltaState(_squares(params), _squares(params))

    def update(updates, state, params=None, **extra):
        def one(g, e_g, e_x):
            e_g = _moment(g, e_g, rho, 2)
            e = _hyper(eps, e_g)
            out = ((_wide(e_x) + e).sqrt() / (e_g + e).sqrt()) * _wide(g)
            return out.convert(g.dtype), e_g, _moment(out, e_x, rho, 2)

        out, e_g, e_x = leafwise(one, 3, updates, state.e_g, state.e_x, where="scale_by_adadelta")
        return out, ScaleByAdaDeltaState(_keep(e_g, state.e_g), _keep(e_x, state.e_x))

    return GradientTransformation(init, update)


class ScaleByAdanState(NamedTuple):
    m: Any
    v: Any
    n: Any
    g: Any
    t: Any


def scale_by_adan(
    b1: Any = 0.98, b2: Any = 0.92, b3: Any = 0.99, eps: Any = 1e-8, eps_root: Any = 0.0
) -> GradientTransformation:
    """Adan: Nesterov-style moments of the gradient and of its difference between steps
    (optax.scale_by_adan).

    >>> scale_by_adan().init([])[:4]
    ([], [], [], [])
    """

    def init(params):
        z = tree_zeros_like
        return ScaleByAdanState(
            z(params), z(params), _squares(params), z(params), zeros_count(params)
        )

    def update(updates, state, params=None, **extra):
        t = safe_increment(state.t)
        first = state.t.eq(0)

        def one(g, m, v, n, previous):
            wide = _wide(g)
            diff = g.builder.select(first, 0.0, wide - _wide(previous))
            m, v = _moment(wide, m, b1, 1), _moment(diff, v, b2, 1)
            square = wide + (1.0 - _hyper(b2, wide)) * diff
            n = _moment(square, n, b3, 2)
            m_hat, v_hat = bias_correction(m, b1, t), bias_correction(v, b2, t)
            n_hat = bias_correction(n, b3, t).convert(m_hat.dtype)
            u = m_hat + (1.0 - _hyper(b2, m_hat)) * v_hat
            out = u / ((n_hat + _hyper(eps_root, n_hat)).sqrt() + _hyper(eps, n_hat))
            return out.convert(g.dtype), m, v, n, g

        out, m, v, n, g = leafwise(
            one, 5, updates, state.m, state.v, state.n, state.g, where="scale_by_adan"
        )
        keep = _keep
        return out, ScaleByAdanState(
            keep(m, state.m), keep(v, state.v), keep(n, state.n), keep(g, state.g), t
        )

    return GradientTransformation(init, update)


class ScaleByNovogradState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


def scale_by_novograd(
    b1: Any = 0.9,
    b2: Any = 0.25,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    weight_decay: Any = 0.0,
    mu_dtype: Any = None,
) -> GradientTransformation:
    """NovoGrad: a second moment per layer (the squared norm of each leaf's gradient), the
    first step initialising the moments (optax.scale_by_novograd; selected, not branched).

    >>> scale_by_novograd().init([])[1:]
    ([], [])
    """
    mu_dtype = resolve_dtype(mu_dtype, "scale_by_novograd")

    def init(params):
        nu = tree_map(lambda p: zeros_shaped(p, {}, f32 if p.dtype.name == "f16" else None), params)
        return ScaleByNovogradState(zeros_count(params), tree_zeros_like(params, mu_dtype), nu)

    def update(updates, state, params=None, **extra):
        needs_params(params, "scale_by_novograd")
        count = safe_increment(state.count)
        first = count.eq(1)

        def one(g, m, v, p):
            wide = _wide(g)
            norm2 = (wide * wide).sum().convert(compute_in(v.dtype))
            v = g.builder.select(first, norm2, _moment(norm2, v, b2, 1))
            root = (v.convert(wide.dtype) + _hyper(eps_root, wide)).sqrt()
            step = wide / (root + _hyper(eps, wide))
            step = step + _hyper(weight_decay, wide) * _wide(p).convert(wide.dtype)
            m = g.builder.select(
                first, step, _hyper(b1, step) * _wide(m).convert(step.dtype) + step
            )
            return m.convert(g.dtype), m, v

        out, mu, nu = leafwise(
            one, 3, updates, state.mu, state.nu, params, where="scale_by_novograd"
        )
        return out, ScaleByNovogradState(count, _keep(mu, state.mu), _keep(nu, state.nu))

    return GradientTransformation(init, update)


class ScaleByOptimisticGradientState(NamedTuple):
    is_initial_step: Any
    previous_gradient: Any


def scale_by_optimistic_gradient(alpha: Any = 1.0, beta: Any = 1.0) -> GradientTransformation:
    """Optimistic gradient: `(alpha + beta) g - beta g_previous` (the first step uses g for
    g_previous), as optax.scale_by_optimistic_gradient.

    >>> scale_by_optimistic_gradient().init([]).previous_gradient
    []
    """

    def init(params):
        flag = scalar_like(first_leaf(params), bool_, True)
        return ScaleByOptimisticGradientState(flag, tree_zeros_like(params))

    def update(updates, state, params=None, **extra):
        def one(g, previous):
            wide = _wide(g)
            prev = g.builder.select(
                state.is_initial_step, wide, _wide(previous).convert(wide.dtype)
            )
            a, b = _hyper(alpha, wide), _hyper(beta, wide)
            return ((a + b) * wide - b * prev).convert(g.dtype)

        out = tree_map(one, updates, state.previous_gradient, where="scale_by_optimistic_gradient")
        flag = state.is_initial_step.builder.select(
            state.is_initial_step, False, state.is_initial_step
        )
        kept = _keep(updates, state.previous_gradient)
        return out, ScaleByOptimisticGradientState(flag, kept)

    return GradientTransformation(init, update)


def _squared_global_norm(tree: Any) -> Any:
    total = None
    for leaf in tree_leaves(tree):
        wide = _wide(leaf)
        part = (wide * wide).sum().convert(f32 if leaf.dtype.name != "f64" else leaf.dtype)
        total = part if total is None else total + part.convert(total.dtype)
    if total is None:
        raise AccyError("scale_by_polyak: the updates' tree has no arrays")
    return total


def scale_by_polyak(
    f_min: Any = 0.0, max_learning_rate: Any = 1.0, eps: Any = 0.0, variant: str = "sps"
) -> GradientTransformation:
    """The Polyak step size `min((value - f_min) / (|g|^2 + eps), max_learning_rate)` times
    the updates; `update` needs the loss as the keyword `value` (optax.scale_by_polyak;
    variant "sps+" clips the gap at 0).

    >>> scale_by_polyak().init([])
    EmptyState()
    """
    if variant not in ("sps", "sps+"):
        raise AccyError(f"scale_by_polyak: variant={variant!r}; it must be 'sps' or 'sps+'")

    def update(updates, state, params=None, *, value=None, **extra):
        if value is None:
            raise AccyError(
                "scale_by_polyak: update needs the loss: update(grads, state, params, value=loss)"
            )
        norm2 = _squared_global_norm(updates)
        if hasattr(value, "ty"):
            gap = value.convert(norm2.dtype) - f_min
        else:
            gap = norm2.builder.scalar(norm2.dtype, float(value) - f_min)
        if variant == "sps+":
            gap = gap.max(0.0)
        step = norm2.builder.select(
            norm2 + _hyper(eps, norm2) <= 2.220446049250313e-16,
            0.0,
            (gap / (norm2 + _hyper(eps, norm2))).min(_hyper(max_learning_rate, norm2)),
        )
        return tree_map(
            lambda g: (_wide(g) * step.convert(compute_in(g.dtype))).convert(g.dtype), updates
        ), state

    return GradientTransformation(init_empty_state, update)


class ScaleByRpropState(NamedTuple):
    step_sizes: Any
    prev_updates: Any


def scale_by_rprop(
    learning_rate: Any,
    eta_minus: Any = 0.5,
    eta_plus: Any = 1.2,
    min_step_size: Any = 1e-6,
    max_step_size: Any = 50.0,
) -> GradientTransformation:
    """Rprop: per-element step sizes grown by `eta_plus` while the gradient keeps its sign,
    shrunk by `eta_minus` when it flips (optax.scale_by_rprop).

    >>> scale_by_rprop(0.1).init([])
    ScaleByRpropState(step_sizes=[], prev_updates=[])
    """

    def init(params):
        return ScaleByRpropState(tree_full_like(params, learning_rate), tree_zeros_like(params))

    def update(updates, state, params=None, **extra):
        def one(g, size, prev):
            select = g.builder.select
            wide, size_w, prev_w = _wide(g), _wide(size), _wide(prev)
            sign = wide * prev_w.convert(wide.dtype)
            plus, minus = _hyper(eta_plus, size_w), _hyper(eta_minus, size_w)
            if not hasattr(plus, "ty"):
                plus = g.builder.scalar(size_w.dtype, plus)
            grown = size_w * select(sign > 0.0, plus, minus)
            grown = grown.max(_hyper(min_step_size, size_w)).min(_hyper(max_step_size, size_w))
            size_w = select(sign.eq(0.0), size_w, grown)
            new_prev = select(sign < 0.0, 0.0, size_w * wide.sign())
            # as optax: the update is the previous step's, zero where the sign flipped
            out = select(sign < 0.0, 0.0, prev_w)
            return out.convert(g.dtype), size_w, new_prev

        out, sizes, prev = leafwise(
            one, 3, updates, state.step_sizes, state.prev_updates, where="scale_by_rprop"
        )
        return out, ScaleByRpropState(
            _keep(sizes, state.step_sizes), _keep(prev, state.prev_updates)
        )

    return GradientTransformation(init, update)


class ScaleBySM3State(NamedTuple):
    mu: Any
    nu: Any


def scale_by_sm3(b1: Any = 0.9, b2: Any = 1.0, eps: Any = 1e-8) -> GradientTransformation:
    """SM3: a second-moment cover of one accumulator per axis (each over that axis alone; the
    estimate at an element is the minimum over its axes), then momentum (optax.scale_by_sm3).

    >>> scale_by_sm3().init([])
    ScaleBySM3State(mu=[], nu=[])
    """

    def accumulators(p):
        if len(p.axes) == 0:
            return [zeros_shaped(p, {})]
        return [zeros_shaped(p, {a: p.shape[a]}) for a in p.axes]

    def init(params):
        leaves, treedef = flatten(params)
        return ScaleBySM3State(
            unflatten(treedef, [accumulators(p) for p in leaves]), tree_zeros_like(params)
        )

    def update(updates, state, params=None, **extra):
        leaves, treedef = flatten(updates)
        covers = treedef.flatten_up_to(state.mu)
        nus = tree_leaves(state.nu)
        outs, new_covers, new_nus = [], [], []
        for g, cover, nu in zip(leaves, covers, nus, strict=True):
            wide = _wide(g)
            estimate = cover[0].convert(wide.dtype)
            for c in cover[1:]:
                estimate = estimate.min(c.convert(wide.dtype))
            first = 1.0 - b2 if b2 != 1.0 else 1.0
            accum = first * (wide * wide) + b2 * estimate
            inverse = g.builder.select(accum > 0.0, (accum + _hyper(eps, accum)).rsqrt(), 0.0)
            nu_new = _moment(inverse * wide, nu, b1, 1)
            outs.append(nu_new.convert(g.dtype))
            new_nus.append(nu_new.convert(nu.dtype))
            if len(g.axes) < 2:
                new_covers.append([accum.convert(c.dtype) for c in cover])
            else:
                new_covers.append(
                    [
                        accum.max([b for b in g.axes if b != a]).convert(c.dtype)
                        for a, c in zip(g.axes, cover, strict=True)
                    ]
                )
        return unflatten(treedef, outs), ScaleBySM3State(
            unflatten(treedef, new_covers), unflatten(treedef, new_nus)
        )

    return GradientTransformation(init, update)


# -- muon --------------------------------------------------------------------------------------

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""The quintic Newton–Schulz coefficients of the modded-nanogpt speedrun (and optax)."""


class MuonState(NamedTuple):
    count: Any
    mu: Any


def default_matrix_axes(leaf: Any) -> tuple[str, str] | None:
    """A leaf's matrix axes for Muon: its two axes (rows, columns) in layout order when it has
    exactly two, else None (Adam's).

    >>> import accy, numpy as np
    >>> default_matrix_axes(accy.named(np.zeros((2, 3)), ("embed", "mlp"), device="reference"))
    ('embed', 'mlp')
    """
    return tuple(leaf.axes) if len(leaf.axes) == 2 else None


def _matrix_axes_of(matrix_axes: Any, leaf: Any) -> tuple[str, str] | None:
    found = (matrix_axes or default_matrix_axes)(leaf)
    if found is None:
        return None
    if len(found) != 2 or not all(leaf.ty.has(a) for a in found) or found[0] == found[1]:
        raise AccyError(
            f"muon: matrix_axes gave {found!r} for an array of axes {leaf.axes}; it must give "
            "two distinct axes of the array (rows, columns) or None"
        )
    return tuple(found)


def orthogonalize_via_newton_schulz(
    x: Any,
    rows: str,
    cols: str,
    ns_coeffs: tuple[float, float, float] = NS_COEFFICIENTS,
    ns_steps: int = 5,
    eps: float = 1e-8,
) -> Any:
    """An approximately orthogonal matrix with `x`'s singular vectors (the matrix over axes
    `rows` x `cols`; any other axes are batch axes), by `ns_steps` quintic Newton–Schulz
    iterations on `x / (|x|_F + eps)`, on the shorter side (as optax transposes a tall one).

    >>> import accy, numpy as np
    >>> x = accy.named(np.diag([3.0, 0.5]).astype(np.float32), ("r", "c"), device="reference")
    >>> o = orthogonalize_via_newton_schulz(x, "r", "c")
    >>> bool(np.all(np.abs(np.diag(o.array)) > 0.6))
    True
    """
    if x.shape[rows] > x.shape[cols]:
        rows, cols = cols, rows
    a, b, c = ns_coeffs
    x = x / ((x * x).sum((rows, cols)).sqrt() + eps)
    other = rows + "_ns"
    for _ in range(ns_steps):
        gram = x.contract(x.rename(rows, other), cols)  # (rows, other)
        gram2 = gram.contract(gram.rename(other, "ns_k").rename(rows, other), other)
        gram2 = gram2.rename("ns_k", other)
        poly = gram * b + gram2 * c
        x = x * a + poly.contract(x.rename(rows, other), other)
    return x


def scale_by_muon(
    ns_coeffs: tuple[float, float, float] = NS_COEFFICIENTS,
    ns_steps: int = 5,
    beta: Any = 0.95,
    eps: float = 1e-8,
    mu_dtype: Any = None,
    *,
    nesterov: bool = True,
    matrix_axes: Callable[[Any], tuple[str, str] | None] | None = None,
) -> GradientTransformation:
    """Muon's rescaling of matrices: momentum (Nesterov's by default), orthogonalised by
    Newton–Schulz, times sqrt(max(1, columns / rows)) (optax's width-transfer scale, with
    rows = the reduction axis, columns = the output axis). `matrix_axes(leaf)` names each
    matrix's (rows, columns); every leaf it is given must be a matrix.

    >>> scale_by_muon().init([])[1]
    []
    """
    mu_dtype = resolve_dtype(mu_dtype, "scale_by_muon")

    def init(params):
        return MuonState(zeros_count(params), tree_zeros_like(params, mu_dtype))

    def update(updates, state, params=None, **extra):
        count = safe_increment(state.count)

        def one(g, m):
            axes = _matrix_axes_of(matrix_axes, g)
            if axes is None:
                raise AccyError(
                    f"scale_by_muon: an update of axes {g.axes} is no matrix; mask it out "
                    "(accy.optim.muon sends such arrays to Adam)"
                )
            rows, cols = axes
            m = _moment(g, m, beta, 1)
            m_hat = _nesterov_mu(m, g, beta, count) if nesterov else bias_correction(m, beta, count)
            out = orthogonalize_via_newton_schulz(m_hat, rows, cols, ns_coeffs, ns_steps, eps)
            out = out.transpose(*g.axes) * max(1.0, g.shape[cols] / g.shape[rows]) ** 0.5
            return out.convert(g.dtype), cast(m, mu_dtype or g.dtype)

        out, mu = leafwise(one, 2, updates, state.mu, where="scale_by_muon")
        return out, MuonState(count, _keep(mu, state.mu))

    return GradientTransformation(init, update)
