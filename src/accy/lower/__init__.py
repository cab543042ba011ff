"""Lowering: turn a Program into a plan of fused loops, library calls and buffers.

`build_plan(program)` is shared by every code generator; `explain(program)` prints it.
"""

from .explain import explain
from .plan import Plan, Scratch, Slot, Step, build_plan

__all__ = ["Plan", "Scratch", "Slot", "Step", "build_plan", "explain"]
