"""Seeing what runs: `make_program` (the traced Program of a function, `jax.make_jaxpr`),
`eval_shape` (the types of its outputs, `jax.eval_shape`) and `Lowered` (what
`accy.jit(f).lower(*args)` returns: the Program, its fused plan and its generated source).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core import Program
from .functions import _check_callable, jit
from .lowered import Lowered, abstract_inputs
from .tracing import unflatten


def make_program(fn: Callable, static_argnames: Sequence[str] | str = ()) -> Callable:
    """`make_program(fn)(*args)` is the Program that `accy.jit(fn)` traces for these arguments
    (`jax.make_jaxpr`): its parameters are the array leaves of the arguments (then any arrays
    it closed over), its outputs the leaves of the result. A leaf may be a type alone
    (`accy.spec(accy.f32, n=3)`, as JAX's `ShapeDtypeStruct`): nothing is computed.

    >>> import accy, numpy as np
    >>> x = accy.named(np.ones(3, np.float32), "n")
    >>> program = accy.make_program(lambda x, k: x * k, static_argnames="k")(x, k=2.0)
    >>> program.count("mul"), [str(t) for t in program.parameter_types]
    (1, ['f32[n=3]'])
    >>> accy.make_program(lambda x: x.sum("n"))(accy.spec(accy.f32, n=4)).parameter_types
    (<f32[n=4]>,)
    """
    _check_callable(fn, "make_program")
    jitted = jit(fn, static_argnames=static_argnames)

    def program_of(*args: Any, **kwargs: Any) -> Program:
        args, kwargs = abstract_inputs((args, kwargs))
        staged, args, kwargs = jitted._staged_for(args, kwargs)
        return staged.entry_for((args, kwargs)).program

    program_of.__name__ = f"make_program({getattr(fn, '__name__', type(fn).__name__)})"
    program_of.__qualname__ = f"make_program({getattr(fn, '__qualname__', type(fn).__qualname__)})"
    return program_of


def eval_shape(
    fn: Callable, *args: Any, static_argnames: Sequence[str] | str = (), **kwargs: Any
) -> Any:
    """The types of `fn(*args, **kwargs)`'s outputs, traced as `accy.jit(fn)` traces it (and
    sharing its trace) but never run (`jax.eval_shape`): a tree of `TensorType`s with the
    output's structure. An argument leaf may be a `TensorType` (`accy.spec(...)`, JAX's
    `ShapeDtypeStruct`): an abstract array of that type, which needs no data.

    >>> import accy, numpy as np
    >>> w = accy.spec(accy.f32, feature=3, hidden=4)
    >>> x = accy.named(np.ones((2, 3), np.float32), ("batch", "feature"))
    >>> accy.eval_shape(lambda w, x: {"h": x.contract(w, "feature").tanh()}, w, x)
    {'h': <f32[batch=2, hidden=4]>}
    """
    _check_callable(fn, "eval_shape")
    args, kwargs = abstract_inputs((args, kwargs))
    staged, args, kwargs = jit(fn, static_argnames=static_argnames)._staged_for(args, kwargs)
    entry = staged.entry_for((args, kwargs))
    return unflatten(entry.out_treedef, list(entry.program.output_types))


__all__ = ["Lowered", "eval_shape", "make_program"]
