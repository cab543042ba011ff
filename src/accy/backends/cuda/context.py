"""What a step emitter works with: the plan, the step, pointers, and where things are.

A step emitter (`steps.STEP_EMITTERS`) writes its kernels once and returns a `StepCode`: a
function that, given the `Level` the plan runs at (which pool entries hold its buffers), adds
the step's actions to the schedule. A scan body's code is written once and scheduled once per
iteration, each time at another level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...codegen.c.dialect import CUDA
from ...codegen.c.expressions import Body
from ...lower.buffers import aligned
from ...lower.plan import Plan, Slot, Step
from ...lower.views import StridedView
from .kernels import (
    BLOCK,
    Kernel,
    LevelPointer,
    Module,
    Pointers,
    pointer_declaration,
    slot_expression,
)
from .schedule import WORKSPACE, Address, Launch, Level, Schedule

StepCode = Callable[[Level, Schedule], None]


@dataclass
class Region:
    """The pool region of a scan run as a graph WHILE node (`steps.scan`), which the scan's step
    kernel rewrites every iteration. Besides the body's table it holds the entries that steps of
    the body `derive` from it (a GEMM's pointer arrays: a table entry or workspace byte plus an
    offset), rewritten with them; they start at entry `start` of the region (set by the scan)."""

    derived: list[tuple[LevelPointer, int]] = field(default_factory=list)
    start: int = 0

    def derive(self, entries: list[tuple[LevelPointer, int]]) -> int:
        """Add (pointer, byte offset) entries; the index of the first among the derived ones."""
        first = len(self.derived)
        self.derived.extend(entries)
        return first


def nothing(level: Level, schedule: Schedule) -> None:
    """The code of a step with no work (an empty tensor)."""


def launches(*kernels: tuple[Kernel | str, int]) -> StepCode:
    """Code that launches each (kernel, grid) at the level: a relocated kernel with a table of
    its pointers there, any other with the level's table and workspace."""

    def schedule_launches(level: Level, schedule: Schedule) -> None:
        for kernel, grid in kernels:
            if isinstance(kernel, str) or kernel.pointers is None:
                name = kernel if isinstance(kernel, str) else kernel.name
                schedule.add(Launch(name, grid, BLOCK, level.io, level.ws))
                continue
            table = schedule.table([pointer_address(level, p) for p in kernel.pointers])
            schedule.add(Launch(kernel.name, grid, BLOCK, table, level.ws))

    return schedule_launches


def pointer_address(level: Level, pointer: LevelPointer | Address) -> Address:
    """Where a relocated kernel's `pointer` is when its plan runs at `level` (an `Address`
    is where it is at every level)."""
    if isinstance(pointer, Address):
        return pointer
    if pointer.table:
        return level.entries[pointer.index].plus(pointer.offset)
    return Address(WORKSPACE, level.ws + pointer.index)


def level_address(plan: Plan, level: Level, slot: Slot) -> Address:
    """Where `slot`'s buffer is when `plan` runs at `level`."""
    if slot.storage == "input":
        return level.entries[slot.index]
    if slot.storage == "output":
        return level.entries[len(plan.program.parameters) + slot.index]
    return Address(WORKSPACE, level.ws + slot.index)


@dataclass
class StepContext:
    module: Module
    plan: Plan
    index: int
    step: Step
    # Writes a nested plan: (module, plan, inside_conditional, in_loop=...).
    emit_plan: Callable[..., StepCode]
    scratch_used: int = 0
    # Whether the plan is the program's own (scheduled once, in order), not a body.
    own_plan: bool = False
    # Copies of moving inputs below the scratch region that the step reads or makes
    # (`stage_moving_buffers`): (SCRATCH, start, stop) byte ranges, for `step_access`.
    staged_ranges: list = field(default_factory=list)
    # In the body of a graph conditional node: "while" (a while_loop's body, or a scan run as a
    # WHILE node), "if" (a cond's branch, at any depth: it decides), "" (neither). cuBLAS GEMMs
    # are captured in WHILE bodies, but some of them fail to instantiate in IF bodies.
    inside_conditional: str = ""
    # Whether the plan is scheduled once (the program's own, not a scan's or a branch's body):
    # its kernels are then relocated (`Module.relocated`), so that steps that compute alike on
    # other buffers share one kernel. A body scheduled once per iteration keeps the level's
    # table, which each iteration has anyway.
    relocate: bool = False
    # In a loop body (scan, while_loop): what the step schedules runs once per iteration, so
    # copying a loop-invariant operand (a weight) through scratch would repeat every time.
    in_loop: bool = False
    # In the body of a scan run as a WHILE node: its region, where pool tables that follow the
    # iteration live (the body's level has no entries to build tables from).
    region: Region | None = None
    # A chain's phase run as a step of its own (`steps.reduce.emit_chain`): ".k", in the
    # comments of its kernels.
    phase: str = ""

    def pointers(self) -> Pointers:
        """Fresh names for the step's stored values (one `Pointers` per kernel)."""
        return Pointers({v: f"v{v}" for v in (*self.step.writes, *self.step.reads)})

    def body(self, pointers: Pointers) -> Body:
        return Body(self.module, self.plan, pointers)

    def kernel(self, pointers: Pointers, lines: list[str], what: str = "") -> Kernel:
        """Declare a kernel of `lines`, preceded by the pointers they used."""
        written = set(self.step.writes)
        declarations = [
            pointer_declaration(self.plan, v, pointers.get(v), v in written) for v in pointers.used
        ] + [
            pointer_declaration(self.plan, v, name, v in written, offset)
            for (v, offset), name in pointers.elements.items()
        ]
        comment = f"step {self.index}{self.phase}: {self.step.kind} {what}".strip()
        return self.declare_kernel(declarations + lines, comment)

    def declare_kernel(self, lines: list[str], comment: str) -> Kernel:
        """Declare a kernel of `lines` written for the plan's level (relocated where the plan
        is scheduled once); launch it with `launches`."""
        if self.relocate:
            return self.module.relocated(lines, comment)
        return Kernel(self.module.kernel(lines, comment))

    def workspace_scratch(self, name: str) -> int:
        """Byte offset (in the plan's workspace) of the step's planned scratch `name`."""
        return self.plan.scratch_offset(self.index, name)

    def scratch(self, nbytes: int) -> int:
        """Reserve `nbytes` of the shared scratch region for this step; its byte offset."""
        offset = self.scratch_used
        self.scratch_used += aligned(nbytes)
        self.module.reserve_scratch(self.scratch_used)
        return offset

    def storage(self, value: int) -> str:
        return CUDA.c_type(self.plan.program.type_of(value).dtype).storage

    def itemsize(self, value: int) -> int:
        return self.plan.program.type_of(value).dtype.itemsize

    def view(self, value: int) -> StridedView:
        return self.plan.view(value)

    def view_expression(self, value: int) -> str:
        """The address of `value`'s first element (a view of a stored buffer), as C."""
        view = self.view(value)
        base = slot_expression(self.plan, self.plan.slots[view.base])
        offset = view.offset * self.itemsize(view.base)
        return f"({base} + {offset})" if offset else base

    def slot_expression(self, value: int) -> str:
        """The address of stored `value`'s buffer, as C."""
        return slot_expression(self.plan, self.plan.slots[value])

    def view_address(self, level: Level, value: int) -> Address:
        """The address of `value`'s first element when the plan runs at `level`."""
        view = self.view(value)
        base = level_address(self.plan, level, self.plan.slots[view.base])
        return base.plus(view.offset * self.itemsize(view.base))

    def slot_address(self, level: Level, value: int) -> Address:
        return level_address(self.plan, level, self.plan.slots[value])

    def view_pointer(self, value: int) -> tuple[LevelPointer, int]:
        """`value`'s first element as (the level pointer of its buffer, a byte offset)."""
        view = self.view(value)
        slot = self.plan.slots[view.base]
        offset = view.offset * self.itemsize(view.base)
        if slot.storage == "input":
            return LevelPointer(True, slot.index), offset
        if slot.storage == "output":
            return LevelPointer(True, len(self.plan.program.parameters) + slot.index), offset
        return LevelPointer(False, slot.index), offset
