"""Lowering: turn a Program into a plan of fused loops, library calls and buffers.

`build_plan(program)` is shared by every code generator; `explain(program)` prints it;
`compile_fragment(handle, program, options)` compiles a program into an artifact, through the
compiler a backend registered for the artifact format (`artifacts`).
"""

from .artifacts import FragmentCompilerOptions, compile_fragment
from .explain import explain
from .plan import Plan, Scratch, Slot, Step, build_plan

__all__ = [
    "FragmentCompilerOptions",
    "Plan",
    "Scratch",
    "Slot",
    "Step",
    "build_plan",
    "compile_fragment",
    "explain",
]
