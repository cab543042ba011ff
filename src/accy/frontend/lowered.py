"""`Lowered`: what `accy.jit(f).lower(*args)` returns, a jitted function's Program for one
signature and what it compiles to (its fused plan, its generated source)."""

from __future__ import annotations

from typing import Any

import numpy as np
import optree

from ..backends.devices import REFERENCE, Device, as_device
from ..core import Program
from ..core.types import TensorType
from .named import NamedArray
from .tracing import NAMESPACE


def abstract_inputs(tree: Any) -> Any:
    """`tree` with each type leaf (`accy.spec(...)`, JAX's `ShapeDtypeStruct`) replaced by an
    array of that type which tracing never reads: a broadcast view of one zero, costing no
    memory. What `make_program` and `jit(f).lower` trace abstract inputs with.

    >>> import accy
    >>> abstract_inputs({"x": accy.spec(accy.f32, n=2), "k": 3})["x"].shape
    {'n': 2}
    """

    def placeholder(leaf: Any) -> Any:
        if not isinstance(leaf, TensorType):
            return leaf
        shape = tuple(extent for _, extent in leaf.named_extents)
        zeros = np.broadcast_to(np.zeros((), leaf.dtype.numpy), shape)
        return NamedArray(zeros, leaf, REFERENCE)

    return optree.tree_map(
        placeholder, tree, is_leaf=lambda leaf: isinstance(leaf, TensorType), namespace=NAMESPACE
    )


class Lowered:
    """A jitted function's Program for one signature, and what it compiles to on `device`."""

    def __init__(self, program: Program, device: str | Device):
        self.program = program
        self.device = as_device(device)

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
        if self.device is REFERENCE:
            return self.as_text()
        if self.device.is_cuda:
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
        return f"<accy Lowered {self.program.name!r} for {self.device}>"


__all__ = ["Lowered", "abstract_inputs"]
