"""What every step emitter works with: the step, its plan, and the step function's pointers.

A step function takes one `restrict` pointer per buffer it touches (the plan never lets a step
write a buffer it reads, except a result written in place of an input read element for element,
`Plan.in_place`, whose pointers are plain; the boundary refuses overlapping user buffers), which
lets the compiler vectorize without alias checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ....codegen.c.dialect import GCC
from ....codegen.c.expressions import Body, Unit
from ....lower.plan import Plan, Step

CHUNKS = 8  # fixed, so that a parallel reduction adds in the same order on any thread count


@dataclass
class StepContext:
    """What a step emitter works with; `parameter` declares the step function's pointers."""

    unit: Unit
    plan: Plan
    index: int
    step: Step
    slot_pointer: Callable[[int], str]
    scratch_pointer: Callable[[str], str]
    output_pointer: Callable[[int], str]
    params: list[tuple[str, str]] = field(default_factory=list)
    pointers: dict[int, str] = field(default_factory=dict)
    prologue: list[str] = field(default_factory=list)

    def parameter(
        self, ctype: str, name: str, argument: str, writable: bool, restrict: bool = True
    ) -> str:
        const = "" if writable else "const "
        qualifier = "restrict " if restrict else ""
        self.params.append((f"{const}{ctype} *{qualifier}{name}", argument))
        return name

    def value_pointers(self) -> None:
        for writable, values in ((True, self.step.writes), (False, self.step.reads)):
            for value in values:
                storage = GCC.c_type(self.plan.program.type_of(value).dtype).storage
                restrict = value not in self.plan.in_place
                pointer = self.slot_pointer(value)
                self.pointers[value] = self.parameter(
                    storage, f"v{value}", pointer, writable, restrict
                )

    def scratch(self, ctype: str, name: str) -> str:
        return self.parameter(ctype, f"s_{name}", self.scratch_pointer(name), True)

    def body(self) -> Body:
        return Body(self.unit, self.plan, self.pointers)

    def declare_once(self, text: str) -> None:
        """Declare `text` (a function shared by steps) in the unit, unless it is there."""
        if text not in self.unit.declarations:
            self.unit.declare(text)


def store_element(dtype, pointer: str, position: str, x: str) -> str:
    """The C statement storing compute value `x` at `pointer[position]`, in `dtype`'s layout."""
    return f"{pointer}[{position}] = {GCC.c_type(dtype).store.format(x=x)};"
