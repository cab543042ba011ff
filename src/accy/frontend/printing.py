"""`debug_print`: printing values from inside traced code (`jax.debug.print`)."""

from __future__ import annotations

from typing import Any

from ..core import Value
from ..errors import AccyError
from .tracing import flatten, innermost, record_print


def debug_print(text: str, *args: Any, **kwargs: Any) -> None:
    """Print `text.format(*args, **kwargs)` with the arrays' values (`jax.debug.print`): at
    once on concrete arrays, and each time the transformed function runs when they are traced
    (the values become extra outputs of its program). Under `grad`, `jvp`, `vjp` and
    `linearize` the primal values print once, in the forward pass; under `vmap` once per
    example; inside a `scan` (and `fori_loop` with int bounds) body at every step, as JAX's.
    A `while_loop` body or a `cond` branch refuses it. A format spec formats a scalar's value
    (`{x:.3f}`); without one an array prints as its repr.

    >>> import accy, numpy as np
    >>> @accy.jit
    ... def f(x):
    ...     accy.debug_print("x is {}", x)
    ...     return x * 2.0
    >>> y = f(accy.named(np.array([1.0, 2.0], np.float32), "n"))
    x is NamedArray(f32[n=2], array([1., 2.], dtype=float32), device='cpu')
    >>> def loss(x):
    ...     accy.debug_print("x={:.1f}", x)
    ...     return x * x
    >>> per_example = accy.vmap(accy.grad(loss), "n")(accy.named(np.array([1.0, 2.0]), "n"))
    x=1.0
    x=2.0
    """
    if not isinstance(text, str):
        raise AccyError(f"debug_print: the first argument is a format string, got {text!r}")
    leaves, structure_of = flatten((args, kwargs))
    traced = [leaf for leaf in leaves if isinstance(leaf, Value)]
    if not traced:
        print(text.format(*args, **kwargs))
        return
    record_print(innermost(traced), text, structure_of, leaves)


__all__ = ["debug_print"]
