"""Gradient checking against central finite differences, in float64 (like `jax.test_util`).

`check_grads` promotes the program to float64, then compares
- forward mode (`"fwd"`): the JVP along a random tangent with (f(x + eps t) - f(x - eps t)) / 2eps;
- reverse mode (`"rev"`): <t, vjp(c)> with <jvp_fd(t), c> for a random cotangent c;
and, for `order` > 1, checks the JVP / VJP programs themselves in the same way (so second
derivatives are checked through forward-over-forward and reverse-over-reverse).

Tolerances: elementwise |analytic - numeric| <= atol + rtol * |numeric|, with atol = rtol = 1e-5
by default at eps = 1e-4 (central differences have error O(eps^2) in float64). Linear programs
can use eps = 1 exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .core import Program
from .core.types import f64
from .errors import AccyError
from .gradient import jvp, vjp
from .reference import run
from .transforms.linearize import check_wrt
from .transforms.retype import promote_floats


def _evaluate(program: Program, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(x, np.float64) for x in run(program, args)]


def _numeric_jvp(program, args, wrt, tangents, eps):
    plus, minus = list(args), list(args)
    for index, tangent in zip(wrt, tangents, strict=True):
        plus[index] = args[index] + eps * tangent
        minus[index] = args[index] - eps * tangent
    with np.errstate(invalid="ignore", over="ignore"):
        return [
            (a - b) / (2 * eps)
            for a, b in zip(_evaluate(program, plus), _evaluate(program, minus), strict=True)
        ]


def _assert_close(analytic, numeric, atol, rtol, what):
    for i, (a, n) in enumerate(zip(analytic, numeric, strict=True)):
        a, n = np.asarray(a, np.float64), np.asarray(n, np.float64)
        if not np.allclose(a, n, atol=atol, rtol=rtol, equal_nan=True):
            error = np.max(np.abs(a - n)) if a.size else 0.0
            raise AssertionError(
                f"{what}, output {i}: analytic and numeric derivatives differ by up to {error:.3g}"
                f"\nanalytic:\n{a}\nnumeric:\n{n}"
            )


def check_grads(
    program: Program,
    args: Sequence[Any],
    wrt=(0,),
    order: int = 2,
    modes: Sequence[str] = ("fwd", "rev"),
    eps: float = 1e-4,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    seed: int = 0,
) -> None:
    """Raise AssertionError unless forward and reverse derivatives match finite differences.

    >>> import accy
    >>> p = accy.trace.define("cube", [accy.spec(accy.f32, lane=3)],
    ...                       lambda b, a: (a[0] ** 3.0).sum("lane"))
    >>> accy.testing.check_grads(p, [[0.5, -1.0, 2.0]], wrt=(0,), order=2)
    """
    wrt = check_wrt(program, wrt)
    for mode in modes:
        if mode not in ("fwd", "rev"):
            raise AccyError(f"check_grads: unknown mode {mode!r}; use 'fwd' and/or 'rev'")
    wide = promote_floats(program, f64)
    arrays = [
        np.asarray(a, np.float64 if t.dtype.is_float else t.dtype.numpy).reshape(t.extents)
        for a, t in zip(args, wide.parameter_types, strict=True)
    ]
    rng = np.random.default_rng(seed)
    tangents = [rng.standard_normal(arrays[i].shape) for i in wrt]
    numeric = _numeric_jvp(wide, arrays, wrt, tangents, eps)
    outputs = len(wide.outputs)
    if "fwd" in modes:
        forward = jvp(wide, wrt)
        analytic = _evaluate(forward, arrays + tangents)[outputs:]
        _assert_close(analytic, numeric, atol, rtol, f"{program.name}: forward mode")
        if order > 1:
            extended = list(range(len(arrays), len(arrays) + len(wrt)))
            check_grads(
                forward,
                arrays + tangents,
                wrt + tuple(extended),
                order - 1,
                ("fwd",),
                eps,
                atol,
                rtol,
                seed + 1,
            )
    if "rev" in modes:
        reverse = vjp(wide, wrt)
        cotangents = [rng.standard_normal(t.extents) for t in wide.output_types]
        gradients = _evaluate(reverse, arrays + cotangents)[outputs:]
        analytic_product = sum(
            float(np.sum(t * g)) for t, g in zip(tangents, gradients, strict=True)
        )
        numeric_product = sum(
            float(np.sum(n * c)) for n, c in zip(numeric, cotangents, strict=True)
        )
        _assert_close(
            [analytic_product], [numeric_product], atol, rtol, f"{program.name}: reverse mode"
        )
        if order > 1:
            check_grads(
                reverse, arrays + cotangents, wrt, order - 1, ("rev",), eps, atol, rtol, seed + 1
            )
