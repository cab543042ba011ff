"""The mesh evaluator: the NumPy oracle of per-device (SPMD) programs on a simulated mesh.

Every device's program runs on the reference evaluator in a thread of its own, in one process;
at each collective the devices meet (a barrier), each puts down its operand, and each computes
its result from its group's operands in NumPy (the collective's rule in
`accy.core.kinds.collectives`). Nested programs (scan bodies, cond branches) keep their device,
so collectives inside them meet too. The devices must meet in the same order (they run the same
program, so they do unless a `cond` or `while_loop` takes different turns on different devices):
a device that reaches a different collective, or finishes while others wait, is a clear
`MeshError`, never a hang.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backends.arguments import host_array
from ..core import Program
from ..errors import AccyError, MeshError
from ..interpret import run as interpret
from ..reference import Evaluate
from .mesh import Mesh

_FINISHED = object()


class Rendezvous:
    """Where the devices of a simulated mesh meet: one slot per device and one barrier."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.slots: list[Any] = [None] * mesh.size
        self.barrier = threading.Barrier(mesh.size)

    def check(self, attrs) -> None:
        axis = attrs["mesh_axis"]
        self.mesh.check_axis(axis, "a collective over ")
        if self.mesh.shape[axis] != attrs["size"]:
            raise MeshError(
                f"a collective over mesh axis {axis!r} was made for {attrs['size']} devices, but "
                f"the mesh has {self.mesh.shape[axis]} along it; shard the program for this mesh"
            )

    def meet(self, rank: int, entry: Any) -> list[Any]:
        """Put down `entry`, wait for every device, and return every device's entry."""
        self.slots[rank] = entry
        self.barrier.wait()
        entries = list(self.slots)
        # A second wait, so that no device overwrites its slot before every device has read.
        self.barrier.wait()
        return entries

    def exchange(self, rank: int, attrs, x: np.ndarray) -> tuple[list[np.ndarray], int]:
        self.check(attrs)
        entries = self.meet(rank, (attrs, x))
        ranks = self.mesh.group(rank, attrs["mesh_axis"])
        for other in ranks:
            if entries[other] is _FINISHED or entries[other][0] != attrs:
                what = "had finished" if entries[other] is _FINISHED else "met elsewhere"
                raise MeshError(
                    f"device {rank} reached a collective {dict(attrs)} while device {other} "
                    f"{what}: the devices' programs diverged (a cond or while_loop that turns "
                    "differently on different devices cannot hold a collective)"
                )
        return [entries[r][1] for r in ranks], ranks.index(rank)

    def finish(self, rank: int) -> None:
        entries = self.meet(rank, _FINISHED)
        waiting = [r for r, e in enumerate(entries) if e is not _FINISHED]
        if waiting:
            raise MeshError(
                f"device {rank} finished its program while devices {waiting} wait in a "
                "collective: the devices' programs diverged"
            )


class MeshEvaluate(Evaluate):
    """The reference evaluator of one device of a simulated mesh."""

    def __init__(self, inputs, rendezvous: Rendezvous, rank: int, custom_calls=None):
        super().__init__(inputs, custom_calls)
        self.rendezvous = rendezvous
        self.rank = rank

    def exchange(self, attrs, x: np.ndarray) -> tuple[list[np.ndarray], int]:
        return self.rendezvous.exchange(self.rank, attrs, x)

    def position(self, attrs) -> int:
        self.rendezvous.check(attrs)
        return self.rendezvous.mesh.coordinates(self.rank)[attrs["mesh_axis"]]

    def run_program(self, program: Program, args: list[np.ndarray]) -> list[np.ndarray]:
        return interpret(program, MeshEvaluate(args, self.rendezvous, self.rank, self.custom_calls))


def run(
    program: Program,
    mesh: Mesh,
    inputs: Sequence[Sequence[Any]],
    custom_calls: Any = None,
) -> list[list[np.ndarray]]:
    """Evaluate the per-device `program` on every device of `mesh`: `inputs[rank]` are device
    `rank`'s arrays; returns each device's outputs, by rank.

    >>> import accy, numpy as np
    >>> from accy.mesh import Mesh
    >>> p = accy.trace.define("total", [accy.spec(accy.f32, n=2)],
    ...     lambda b, a: b.emit("psum", [a[0]], {"mesh_axis": "data", "size": 2}))
    >>> inputs = [[np.ones(2, np.float32)], [np.full(2, 2.0, np.float32)]]
    >>> out = run(p, Mesh(range(2), "data"), inputs)
    >>> [o[0].tolist() for o in out]
    [[3.0, 3.0], [3.0, 3.0]]
    """
    if len(inputs) != mesh.size:
        raise MeshError(
            f"mesh run of {program.name!r}: {len(inputs)} input lists for the {mesh.size} "
            "devices of the mesh (one list per device, by rank)"
        )
    types = program.parameter_types
    arrays = []
    for rank, device_inputs in enumerate(inputs):
        if len(device_inputs) != len(types):
            raise MeshError(
                f"mesh run of {program.name!r}: device {rank} got {len(device_inputs)} inputs; "
                f"the program takes {len(types)} ({', '.join(map(str, types))})"
            )
        arrays.append(
            [
                host_array(x, t, f"program {program.name!r}, device {rank}, argument {i}")
                for i, (x, t) in enumerate(zip(device_inputs, types, strict=True))
            ]
        )
    return run_devices(
        mesh,
        lambda rank, rendezvous: _evaluate(program, arrays[rank], rendezvous, rank, custom_calls),
    )


def _evaluate(program, arrays, rendezvous, rank, custom_calls):
    return interpret(program, MeshEvaluate(arrays, rendezvous, rank, custom_calls))


def run_devices(mesh: Mesh, body) -> list[Any]:
    """Run `body(rank, rendezvous)` for every device of `mesh`, each in a thread, and return the
    results by rank. The first error any device raises is raised here (the others are released
    from the barrier rather than left waiting)."""
    rendezvous = Rendezvous(mesh)
    results: list[Any] = [None] * mesh.size
    errors: list[BaseException | None] = [None] * mesh.size

    def device(rank: int) -> None:
        try:
            results[rank] = body(rank, rendezvous)
            rendezvous.finish(rank)
        except threading.BrokenBarrierError as error:
            errors[rank] = error
        except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
            errors[rank] = error
            rendezvous.barrier.abort()

    if mesh.size == 1:
        device(0)
    else:
        threads = [threading.Thread(target=device, args=(r,)) for r in range(mesh.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    first = next(
        (e for e in errors if not isinstance(e, threading.BrokenBarrierError | None)), None
    )
    if first is not None:
        raise first
    if any(errors):
        raise AccyError("internal: the simulated mesh's barrier broke without an error")
    return results


__all__ = ["MeshEvaluate", "Rendezvous", "run", "run_devices"]
