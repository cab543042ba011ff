"""A per-device program cut at its collectives: native segments between mesh operations.

`split_program(program)` gives the steps a device runs: `Segment`s (programs of ordinary
kinds, compiled by a backend as any program is) and `MeshStep`s (a collective or an
`axis_index`, done by the runtime of the mesh: NumPy on a simulated mesh, NCCL on GPUs). Each
step names the values it reads and writes, so the runner keeps one table of values per device.
Collectives nested in a scan or cond body cannot be cut out: such a program is refused (the mesh
evaluator, `device="reference"`, runs it).

The operations are first put in an order with as few cuts as the data allows (`fewest_cuts`):
every ordinary operation runs as soon as its operands are there, and a collective only when no
ordinary operation can run. So a data-parallel step is a few segments (the forward and backward
pass, then the updates) with the gradients' psums side by side between them, which the NCCL
runtime issues as one group, instead of one segment and one launch per parameter.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..core import Operation, Program
from ..core.builder import Builder
from ..core.kinds.collectives import COLLECTIVES
from ..errors import MeshError

MESH_KINDS = frozenset((*COLLECTIVES, "axis_index"))
"""The kinds a mesh runtime performs itself, between native segments."""


@dataclass(frozen=True)
class Segment:
    """Ordinary operations as a program: its parameters are the values `inputs`, its outputs
    the values `outputs` (value numbers of the per-device program)."""

    program: Program
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True)
class MeshStep:
    """One collective (or axis_index) of the per-device program."""

    op: Operation


def _nested_mesh_kinds(program: Program) -> bool:
    for op in program.operations:
        for value in op.attrs.values():
            if isinstance(value, Program) and (
                any(o.kind in MESH_KINDS for o in value.operations) or _nested_mesh_kinds(value)
            ):
                return True
    return False


def split_program(program: Program) -> list[Segment | MeshStep]:
    """The steps of `program`, in order (see the module docstring).

    >>> import accy
    >>> def body(b, a):
    ...     total = b.emit("psum", [a[0] * 2.0], {"mesh_axis": "data", "size": 2})
    ...     return total + 1.0
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, n=3)], body)
    >>> [type(s).__name__ for s in split_program(p)]
    ['Segment', 'MeshStep', 'Segment']
    """
    if _nested_mesh_kinds(program):
        raise MeshError(
            f"program {program.name!r} has a collective inside a scan, cond or while_loop body; "
            "only the mesh evaluator (device='reference') runs those"
        )
    groups: list[list[Operation] | Operation] = []
    for op in fewest_cuts([op for op in program.operations if op.kind != "parameter"]):
        if op.kind in MESH_KINDS:
            groups.append(op)
        elif groups and isinstance(groups[-1], list):
            groups[-1].append(op)
        else:
            groups.append([op])
    # The values each step's successors (and the program's outputs) still read.
    later_reads: list[set[int]] = []
    reads = set(program.outputs)
    for group in reversed(groups):
        later_reads.append(set(reads))
        for op in group if isinstance(group, list) else [group]:
            reads.update(op.operands)
    later_reads.reverse()
    steps: list[Segment | MeshStep] = []
    for position, group in enumerate(groups):
        if isinstance(group, Operation):
            steps.append(MeshStep(group))
        else:
            steps.append(_segment(program, group, later_reads[position], position))
    return steps


def fewest_cuts(ops: list[Operation]) -> list[Operation]:
    """`ops` (a program's, in a valid order) reordered so that collectives come as late and as
    close together as their data allows: the ready ordinary operations first, in their order;
    then every collective that is ready, in their order; and again. Operands produced outside
    `ops` (parameters) are ready from the start."""
    producer = {r: i for i, op in enumerate(ops) for r in op.results}
    waiting = [0] * len(ops)
    users: list[list[int]] = [[] for _ in ops]
    for i, op in enumerate(ops):
        for source in {producer[v] for v in op.operands if v in producer}:
            waiting[i] += 1
            users[source].append(i)
    ordinary: list[int] = []
    collective: list[int] = []

    def ready(i: int) -> None:
        heapq.heappush(collective if ops[i].kind in MESH_KINDS else ordinary, i)

    for i in range(len(ops)):
        if not waiting[i]:
            ready(i)
    order: list[Operation] = []

    def emit(i: int) -> None:
        order.append(ops[i])
        for user in users[i]:
            waiting[user] -= 1
            if not waiting[user]:
                ready(user)

    while ordinary or collective:
        while ordinary:
            emit(heapq.heappop(ordinary))
        batch, collective[:] = sorted(collective), []
        for i in batch:
            emit(i)
    return order


def _segment(program: Program, ops: list[Operation], needed: set[int], position: int) -> Segment:
    defined = {r for op in ops for r in op.results}
    inputs: list[int] = []
    for op in ops:
        for v in op.operands:
            if v not in defined and v not in inputs:
                inputs.append(v)
    builder = Builder(f"{program.name}_segment{position}")
    env = {v: builder.parameter(program.type_of(v)) for v in inputs}
    for op in ops:
        result = builder.emit(op.kind, [env[v] for v in op.operands], op.attrs)
        env.update(zip(op.results, result if isinstance(result, tuple) else (result,), strict=True))
    outputs = tuple(r for op in ops for r in op.results if r in needed)
    return Segment(builder.build([env[v] for v in outputs]), tuple(inputs), outputs)


__all__ = ["MESH_KINDS", "MeshStep", "Segment", "fewest_cuts", "split_program"]
