"""Seeing what runs: `make_program` (the traced Program of a function, `jax.make_jaxpr`) and
`Lowered` (what `accy.jit(f).lower(*args)` returns: the Program, its fused plan and its
generated source).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core import Program
from .functions import _check_callable, jit


class Lowered:
    """A jitted function's Program for one signature, and what it compiles to on `device`."""

    def __init__(self, program: Program, device: str):
        self.program = program
        self.device = device

    def as_text(self) -> str:
        """The Program in accy's text form (what `print(lowered.program)` shows)."""
        return str(self.program)

    def plan(self) -> str:
        """The fused steps and buffers the program lowers to (`accy.lower.explain`)."""
        from ..lower.explain import explain

        return explain(self.program)

    def source(self) -> str:
        """The generated source: the C translation unit of the native CPU backend, the CUDA C
        of the GPU one (planned without a GPU), or on "reference", which generates none, the
        Program's text.

        >>> import accy, numpy as np
        >>> f = accy.jit(lambda x: x.exp(), device="reference")
        >>> f.lower(accy.named(np.ones(2), "n")).source().startswith("program")
        True
        """
        if self.device == "reference":
            return self.as_text()
        if self.device == "cuda":
            from ..backends.cuda.compile import compile_program

            return compile_program(self.program).source
        from ..backends.cpu.blas import find_blas
        from ..backends.cpu.blocking import block_scans
        from ..backends.cpu.source import translation
        from ..lower.plan import build_plan

        plan = build_plan(block_scans(self.program, outputs_as_blocks=True))
        return translation(plan, None, find_blas())[0]

    def compile(self) -> Any:
        """The compiled program (`accy.compile(lowered.program, device)`), run on raw arrays."""
        from ..api import compile as compile_program

        return compile_program(self.program, self.device)

    def __repr__(self) -> str:
        return f"<accy Lowered {self.program.name!r} for {self.device!r}>"


def make_program(fn: Callable, static_argnames: Sequence[str] | str = ()) -> Callable:
    """`make_program(fn)(*args)` is the Program that `accy.jit(fn)` traces for these arguments
    (`jax.make_jaxpr`): its parameters are the array leaves of the arguments (then any arrays
    it closed over), its outputs the leaves of the result.

    >>> import accy, numpy as np
    >>> x = accy.named(np.ones(3, np.float32), "n")
    >>> program = accy.make_program(lambda x, k: x * k, static_argnames="k")(x, k=2.0)
    >>> program.count("mul"), [str(t) for t in program.parameter_types]
    (1, ['f32[n=3]'])
    """
    _check_callable(fn, "make_program")
    jitted = jit(fn, static_argnames=static_argnames)

    def program_of(*args: Any, **kwargs: Any) -> Program:
        staged, args, kwargs = jitted._staged_for(args, kwargs)
        return staged.entry_for((args, kwargs)).program

    return program_of


__all__ = ["Lowered", "make_program"]
