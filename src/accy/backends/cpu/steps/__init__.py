"""C for each kind of plan step, one module per kind, looked up in `STEP_EMITTERS`."""

from __future__ import annotations

from collections.abc import Callable

from .calls import emit_copy, emit_custom_call
from .context import StepContext
from .control import emit_cond, emit_while
from .conv import emit_conv
from .dot import emit_dot
from .group import emit_group
from .loop import emit_loop
from .pool import emit_pool
from .reduce import emit_chain, emit_reduce
from .scan import emit_scan
from .scatter import emit_scatter
from .sort import emit_sort

STEP_EMITTERS: dict[str, Callable[[StepContext], list[str]]] = {
    "loop": emit_loop,
    "reduce": emit_reduce,
    "reductions": emit_reduce,
    "chain": emit_chain,
    "group": emit_group,
    "scatter": emit_scatter,
    "dot": emit_dot,
    "conv": emit_conv,
    "pool": emit_pool,
    "custom_call": emit_custom_call,
    "copy": emit_copy,
    "scan": emit_scan,
    "sort": emit_sort,
    "cond": emit_cond,
    "while": emit_while,
}

__all__ = ["STEP_EMITTERS", "StepContext"]
