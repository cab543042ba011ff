"""Optimizers as chains of transformations, named and parametrised as optax's aliases.

Each returns a `GradientTransformation`; the learning rate (and the weight decay where there
is one) may be a number, a scalar array or a schedule.

>>> import accy, numpy as np
>>> params = {"w": accy.named(np.array([1.0, -2.0], np.float32), ("lane",), device="reference")}
>>> opt = adamw(0.1, weight_decay=0.0)
>>> state = opt.init(params)
>>> updates, state = opt.update({"w": params["w"]}, state, params)
>>> [round(v, 4) for v in accy.optim.apply_updates(params, updates)["w"].array.tolist()]
[0.9, -1.9]
"""

from __future__ import annotations

from typing import Any

from .base import GradientTransformation, chain, identity, tree_map
from .transforms import (
    NS_COEFFICIENTS,
    _matrix_axes_of,
    add_decayed_weights,
    clip_by_block_rms,
    ema,
    scale,
    scale_by_adadelta,
    scale_by_adam,
    scale_by_adamax,
    scale_by_adan,
    scale_by_amsgrad,
    scale_by_belief,
    scale_by_factored_rms,
    scale_by_learning_rate,
    scale_by_lion,
    scale_by_muon,
    scale_by_novograd,
    scale_by_optimistic_gradient,
    scale_by_param_block_rms,
    scale_by_polyak,
    scale_by_radam,
    scale_by_rms,
    scale_by_rprop,
    scale_by_rss,
    scale_by_sign,
    scale_by_sm3,
    scale_by_stddev,
    scale_by_trust_ratio,
    scale_by_yogi,
    trace,
)
from .wrappers import masked


def sgd(
    learning_rate: Any,
    momentum: Any = None,
    nesterov: bool = False,
    accumulator_dtype: Any = None,
) -> GradientTransformation:
    """Stochastic gradient descent, with momentum (heavy ball or Nesterov's) if given.

    >>> sgd(0.1, momentum=0.9).init([])
    (TraceState(trace=[]), EmptyState())
    """
    first = identity() if momentum is None else trace(momentum, nesterov, accumulator_dtype)
    return chain(first, scale_by_learning_rate(learning_rate))


def adam(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    mu_dtype: Any = None,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """Adam (optax.adam); for f16 and bf16 parameters the update is computed in f32.

    >>> len(adam(1e-3).init([]))
    2
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov),
        scale_by_learning_rate(learning_rate),
    )


def nadam(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    mu_dtype: Any = None,
) -> GradientTransformation:
    """Adam with Nesterov's momentum (optax.nadam).

    >>> len(nadam(1e-3).init([]))
    2
    """
    return adam(learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov=True)


def adamw(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    mu_dtype: Any = None,
    weight_decay: Any = 1e-4,
    mask: Any = None,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """Adam with decoupled weight decay (optax.adamw): the update is
    `-lr * (adam_direction + weight_decay * param)`; `mask` (a tree of bools or a function
    of the parameters returning one) picks the parameters that decay.

    >>> len(adamw(1e-3, mask=lambda p: [True for _ in p]).init([]))
    3
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def nadamw(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    mu_dtype: Any = None,
    weight_decay: Any = 1e-4,
    mask: Any = None,
) -> GradientTransformation:
    """AdamW with Nesterov's momentum (optax.nadamw).

    >>> len(nadamw(1e-3).init([]))
    3
    """
    return adamw(learning_rate, b1, b2, eps, eps_root, mu_dtype, weight_decay, mask, nesterov=True)


def lion(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.99,
    mu_dtype: Any = None,
    weight_decay: Any = 1e-3,
    mask: Any = None,
) -> GradientTransformation:
    """Lion (optax.lion): the sign of an interpolated momentum, with decoupled weight decay.

    >>> len(lion(1e-4).init([]))
    3
    """
    return chain(
        scale_by_lion(b1, b2, mu_dtype),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def adafactor(
    learning_rate: Any = None,
    min_dim_size_to_factor: int = 128,
    decay_rate: Any = 0.8,
    decay_offset: Any = 0,
    multiply_by_parameter_scale: bool = True,
    clipping_threshold: Any = 1.0,
    momentum: Any = None,
    dtype_momentum: Any = "f32",
    weight_decay_rate: Any = None,
    eps: Any = 1e-30,
    factored: bool = True,
    weight_decay_mask: Any = None,
) -> GradientTransformation:
    """Adafactor (optax.adafactor). The second moment of an array is factored over its two
    largest named axes (`accy.optim.transforms.factored_axes`; optax takes the two largest
    dimensions by position, the same choice) when both are at least
    `min_dim_size_to_factor` long.

    >>> len(adafactor(1e-2).init([]))
    5
    """
    steps = [scale_by_factored_rms(factored, decay_rate, decay_offset, min_dim_size_to_factor, eps)]
    if clipping_threshold is not None:
        steps.append(clip_by_block_rms(clipping_threshold))
    if learning_rate is not None:
        steps.append(scale_by_learning_rate(learning_rate, flip_sign=False))
    if multiply_by_parameter_scale:
        steps.append(scale_by_param_block_rms())
    if momentum is not None:
        steps.append(ema(momentum, debias=False, accumulator_dtype=dtype_momentum))
    if weight_decay_rate is not None:
        steps.append(add_decayed_weights(weight_decay_rate, mask=weight_decay_mask))
    steps.append(scale(-1.0))
    return chain(*steps)


def adagrad(
    learning_rate: Any, initial_accumulator_value: Any = 0.1, eps: Any = 1e-7
) -> GradientTransformation:
    """Adagrad (optax.adagrad).

    >>> len(adagrad(0.1).init([]))
    2
    """
    return chain(
        scale_by_rss(initial_accumulator_value, eps), scale_by_learning_rate(learning_rate)
    )


def rmsprop(
    learning_rate: Any,
    decay: Any = 0.9,
    eps: Any = 1e-8,
    initial_scale: Any = 0.0,
    eps_in_sqrt: bool = True,
    centered: bool = False,
    momentum: Any = None,
    nesterov: bool = False,
    bias_correction: bool = False,
) -> GradientTransformation:
    """RMSProp (optax.rmsprop), centred or not, with optional momentum.

    >>> len(rmsprop(0.1).init([]))
    3
    """
    scaling = scale_by_stddev if centered else scale_by_rms
    return chain(
        scaling(decay, eps, initial_scale, eps_in_sqrt, bias_correction),
        scale_by_learning_rate(learning_rate),
        identity() if momentum is None else trace(momentum, nesterov),
    )


def adamax(learning_rate: Any, b1: Any = 0.9, b2: Any = 0.999, eps: Any = 1e-8):
    """AdaMax (optax.adamax).

    >>> len(adamax(0.1).init([]))
    2
    """
    return chain(scale_by_adamax(b1, b2, eps), scale_by_learning_rate(learning_rate))


def adamaxw(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    weight_decay: Any = 1e-4,
    mask: Any = None,
) -> GradientTransformation:
    """AdaMax with decoupled weight decay (optax.adamaxw).

    >>> len(adamaxw(0.1).init([]))
    3
    """
    return chain(
        scale_by_adamax(b1, b2, eps),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def amsgrad(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    mu_dtype: Any = None,
) -> GradientTransformation:
    """AMSGrad (optax.amsgrad).

    >>> len(amsgrad(0.1).init([]))
    2
    """
    return chain(
        scale_by_amsgrad(b1, b2, eps, eps_root, mu_dtype), scale_by_learning_rate(learning_rate)
    )


def adabelief(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-16,
    eps_root: Any = 1e-16,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """AdaBelief (optax.adabelief).

    >>> len(adabelief(0.1).init([]))
    2
    """
    return chain(
        scale_by_belief(b1, b2, eps, eps_root, nesterov=nesterov),
        scale_by_learning_rate(learning_rate),
    )


def yogi(learning_rate: Any, b1: Any = 0.9, b2: Any = 0.999, eps: Any = 1e-3):
    """Yogi (optax.yogi).

    >>> len(yogi(0.1).init([]))
    2
    """
    return chain(scale_by_yogi(b1, b2, eps), scale_by_learning_rate(learning_rate))


def radam(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    eps_root: Any = 0.0,
    threshold: Any = 5.0,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """Rectified Adam (optax.radam).

    >>> len(radam(0.1).init([]))
    2
    """
    return chain(
        scale_by_radam(b1, b2, eps, eps_root, threshold, nesterov=nesterov),
        scale_by_learning_rate(learning_rate),
    )


def sign_sgd(learning_rate: Any) -> GradientTransformation:
    """SGD on the signs of the gradients (optax.sign_sgd).

    >>> len(sign_sgd(0.1).init([]))
    2
    """
    return chain(scale_by_sign(), scale_by_learning_rate(learning_rate))


def signum(learning_rate: Any, beta: Any = 0.9, accumulator_dtype: Any = None):
    """Signum: the sign of an exponential moving average of the gradients (optax.signum).

    >>> len(signum(0.1).init([]))
    3
    """
    return chain(
        ema(beta, debias=False, accumulator_dtype=accumulator_dtype),
        scale_by_sign(),
        scale_by_learning_rate(learning_rate),
    )


def lamb(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-6,
    eps_root: Any = 0.0,
    weight_decay: Any = 0.0,
    mask: Any = None,
) -> GradientTransformation:
    """LAMB (optax.lamb): Adam's direction with weight decay, scaled by the trust ratio.

    >>> len(lamb(0.1).init([]))
    4
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root),
        add_decayed_weights(weight_decay, mask),
        scale_by_trust_ratio(),
        scale_by_learning_rate(learning_rate),
    )


def lars(
    learning_rate: Any,
    weight_decay: Any = 0.0,
    weight_decay_mask: Any = True,
    trust_coefficient: Any = 0.001,
    eps: Any = 0.0,
    trust_ratio_mask: Any = True,
    momentum: Any = 0.9,
    nesterov: bool = False,
) -> GradientTransformation:
    """LARS (optax.lars).

    >>> len(lars(0.1).init([]))
    4
    """
    return chain(
        add_decayed_weights(weight_decay, mask=weight_decay_mask),
        masked(
            scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps), trust_ratio_mask
        ),
        scale_by_learning_rate(learning_rate),
        trace(momentum, nesterov),
    )


def muon(
    learning_rate: Any,
    ns_coeffs: tuple[float, float, float] = NS_COEFFICIENTS,
    ns_steps: int = 5,
    beta: Any = 0.95,
    eps: float = 1e-8,
    weight_decay: Any = 0.0,
    weight_decay_mask: Any = None,
    mu_dtype: Any = None,
    *,
    nesterov: bool = True,
    adam_b1: Any = 0.9,
    adam_b2: Any = 0.999,
    adam_eps_root: Any = 0.0,
    adam_weight_decay: Any = 0.0,
    adam_learning_rate: Any = None,
    matrix_axes: Any = None,
) -> GradientTransformation:
    """Muon (optax.contrib.muon, as the modded-nanogpt speedrun): matrices get momentum
    orthogonalised by Newton–Schulz (`scale_by_muon`), the other parameters AdamW.

    A matrix is what `matrix_axes(leaf)` says, a pair of axis names (rows, columns; other
    axes are batch axes) or None for Adam's; by default every array with exactly two axes,
    rows and columns in layout order (optax's default: reduction axis 0, output axis 1).

    >>> len(muon(0.02).init([]))
    2
    """

    def is_matrix(tree: Any) -> Any:
        return tree_map(lambda leaf: _matrix_axes_of(matrix_axes, leaf) is not None, tree)

    def is_other(tree: Any) -> Any:
        return tree_map(lambda leaf: _matrix_axes_of(matrix_axes, leaf) is None, tree)

    matrices = chain(
        scale_by_muon(
            ns_coeffs, ns_steps, beta, eps, mu_dtype, nesterov=nesterov, matrix_axes=matrix_axes
        ),
        add_decayed_weights(weight_decay, weight_decay_mask),
        scale_by_learning_rate(learning_rate),
    )
    others = adamw(
        learning_rate if adam_learning_rate is None else adam_learning_rate,
        adam_b1,
        adam_b2,
        eps,
        adam_eps_root,
        mu_dtype,
        adam_weight_decay,
        nesterov=nesterov,
    )
    return chain(masked(matrices, is_matrix), masked(others, is_other))


def adadelta(
    learning_rate: Any = None,
    rho: Any = 0.9,
    eps: Any = 1e-6,
    weight_decay: Any = 0.0,
    weight_decay_mask: Any = None,
) -> GradientTransformation:
    """AdaDelta (optax.adadelta).

    >>> len(adadelta(0.1).init([]))
    3
    """
    return chain(
        add_decayed_weights(weight_decay, mask=weight_decay_mask),
        scale_by_adadelta(rho, eps),
        scale_by_learning_rate(learning_rate),
    )


def adan(
    learning_rate: Any,
    b1: Any = 0.98,
    b2: Any = 0.92,
    b3: Any = 0.99,
    eps: Any = 1e-8,
    eps_root: Any = 1e-8,
    weight_decay: Any = 0.0,
    mask: Any = None,
) -> GradientTransformation:
    """Adan (optax.adan).

    >>> len(adan(0.1).init([]))
    3
    """
    return chain(
        scale_by_adan(b1, b2, b3, eps, eps_root),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def fromage(learning_rate: Any, min_norm: Any = 1e-6) -> GradientTransformation:
    """Fromage (optax.fromage): trust-ratio steps with a shrinking of the weights.

    >>> len(fromage(0.1).init([]))
    3
    """
    if callable(learning_rate):

        def shrink(count):
            return 1.0 / (1.0 + learning_rate(count) ** 2.0) ** 0.5

        return chain(
            scale_by_trust_ratio(min_norm),
            scale_by_learning_rate(lambda c: shrink(c) * learning_rate(c)),
            add_decayed_weights(lambda c: shrink(c) - 1.0),
        )
    shrink = 1.0 / (1.0 + learning_rate**2) ** 0.5
    return chain(
        scale_by_trust_ratio(min_norm),
        scale_by_learning_rate(learning_rate * shrink),
        add_decayed_weights(shrink - 1.0),
    )


def novograd(
    learning_rate: Any,
    b1: Any = 0.9,
    b2: Any = 0.25,
    eps: Any = 1e-6,
    eps_root: Any = 0.0,
    weight_decay: Any = 0.0,
) -> GradientTransformation:
    """NovoGrad (optax.novograd).

    >>> len(novograd(0.1).init([]))
    2
    """
    return chain(
        scale_by_novograd(b1, b2, eps, eps_root, weight_decay),
        scale_by_learning_rate(learning_rate),
    )


def optimistic_gradient_descent(
    learning_rate: Any, alpha: Any = 1.0, beta: Any = 1.0
) -> GradientTransformation:
    """Optimistic gradient descent (optax.optimistic_gradient_descent).

    >>> len(optimistic_gradient_descent(0.1).init([]))
    2
    """
    return chain(scale_by_optimistic_gradient(alpha, beta), scale_by_learning_rate(learning_rate))


def optimistic_adam_v2(
    learning_rate: Any,
    *,
    alpha: Any = 1.0,
    beta: Any = 1.0,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-08,
    eps_root: Any = 0.0,
    mu_dtype: Any = None,
    nesterov: bool = True,
) -> GradientTransformation:
    """Optimistic Adam (optax.optimistic_adam_v2).

    >>> len(optimistic_adam_v2(0.1).init([]))
    3
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov),
        scale_by_optimistic_gradient(alpha, beta),
        scale_by_learning_rate(learning_rate),
    )


def polyak_sgd(
    max_learning_rate: Any = 1.0,
    scaling: Any = 1.0,
    f_min: Any = 0.0,
    eps: Any = 0.0,
    variant: str = "sps",
) -> GradientTransformation:
    """SGD with Polyak step sizes (optax.polyak_sgd); `update` needs `value=loss`.

    >>> len(polyak_sgd().init([]))
    2
    """
    return chain(
        sgd(learning_rate=scaling),
        scale_by_polyak(f_min=f_min, max_learning_rate=max_learning_rate, eps=eps, variant=variant),
    )


def rprop(
    learning_rate: Any,
    eta_minus: Any = 0.5,
    eta_plus: Any = 1.2,
    min_step_size: Any = 1e-6,
    max_step_size: Any = 50.0,
) -> GradientTransformation:
    """Rprop (optax.rprop).

    >>> len(rprop(0.1).init([]))
    2
    """
    return chain(
        scale_by_rprop(learning_rate, eta_minus, eta_plus, min_step_size, max_step_size),
        scale(-1.0),
    )


def sm3(learning_rate: Any, momentum: Any = 0.9) -> GradientTransformation:
    """SM3 (optax.sm3).

    >>> len(sm3(0.1).init([]))
    2
    """
    return chain(scale_by_sm3(momentum), scale(-learning_rate))
