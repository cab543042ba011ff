"""Running a per-device program on every device of a simulated mesh, in one process.

`MeshExecutable(program, mesh, device)`:

- `device="reference"`: the mesh evaluator (`accy.mesh.evaluate`), one thread per device, any
  program (collectives inside scan bodies included). The oracle.
- `device="cpu"`: the program is cut at its collectives (`accy.mesh.segments`); each segment
  is compiled once by the CPU backend (native code, shared by every device) and run for each
  device in turn; at a collective, every device's operand is in hand and each device's result is
  computed by the collective's NumPy rule. So the steps run in lockstep in one thread: the
  devices are simulated, the arithmetic between collectives is the real compiled code.

Multi-GPU runs use `accy.mesh.nccl` instead (one process per GPU, NCCL collectives).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..api import compile as compile_program
from ..backends.devices import CPU, REFERENCE, Device, as_device
from ..core import Program
from ..errors import MeshError
from ..reference import Evaluate
from .evaluate import run as evaluate_on_mesh
from .mesh import Mesh
from .segments import MeshStep, Segment, split_program
from .spmd import ShardedProgram

SIMULATED_DEVICES = (REFERENCE, CPU)
"""The devices a whole mesh is simulated on in one process."""


class _Lockstep(Evaluate):
    """Evaluates one mesh step for one device, every device's operand already in hand."""

    def __init__(self, mesh: Mesh, rank: int, operands: list[np.ndarray]):
        super().__init__([])
        self.mesh, self.rank, self.operands = mesh, rank, operands

    def exchange(self, attrs, x: np.ndarray) -> tuple[list[np.ndarray], int]:
        ranks = self.mesh.group(self.rank, attrs["mesh_axis"])
        return [self.operands[r] for r in ranks], ranks.index(self.rank)

    def position(self, attrs) -> int:
        return self.mesh.coordinates(self.rank)[attrs["mesh_axis"]]


def check_mesh_attrs(mesh: Mesh, op) -> None:
    """A clear MeshError when a collective's mesh axis is not on `mesh`, or has another size."""
    axis, size = op.attrs["mesh_axis"], op.attrs["size"]
    mesh.check_axis(axis, f"{op.kind} over ")
    if mesh.shape[axis] != size:
        raise MeshError(
            f"{op.kind} over mesh axis {axis!r} was made for {size} devices, but the mesh has "
            f"{mesh.shape[axis]} along it; shard the program for this mesh"
        )


class MeshExecutable:
    """A per-device program compiled for every device of a simulated `mesh` (see the module
    docstring). Call `run_devices(inputs_by_rank)`; a `ShardedProgram`'s executable is also
    called with whole arrays, which it splits and puts back together.

    >>> import accy, numpy as np
    >>> from accy.mesh import Mesh, shard_program
    >>> p = accy.trace.define("total", [accy.spec(accy.f32, batch=4)], lambda b, a: a[0].sum())
    >>> sharded = shard_program(p, Mesh(range(2), "data"), {"batch": "data"})
    >>> MeshExecutable(sharded, device="cpu")(np.arange(4, dtype=np.float32))[0].item()
    6.0
    """

    def __init__(
        self,
        program: Program | ShardedProgram,
        mesh: Mesh | None = None,
        device: str | Device = CPU,
    ):
        self.sharded = program if isinstance(program, ShardedProgram) else None
        self.program = program.program if self.sharded else program
        self.mesh = self.sharded.mesh if self.sharded else mesh
        if self.mesh is None:
            raise MeshError("MeshExecutable: a per-device program needs its mesh")
        device = as_device(device)
        if device not in SIMULATED_DEVICES:
            raise MeshError(
                f"MeshExecutable: device '{device}' is not simulated in one process; use one of "
                f"{', '.join(map(str, SIMULATED_DEVICES))} (GPUs: one process per GPU, see "
                "accy.mesh.nccl)"
            )
        self.device = device
        for op in self.program.operations:
            if "mesh_axis" in op.attrs:
                check_mesh_attrs(self.mesh, op)
        self.steps = split_program(self.program) if device is CPU else None
        self.compiled = {
            id(step): compile_program(step.program, CPU)
            for step in self.steps or ()
            if isinstance(step, Segment)
        }

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        if self.sharded is None:
            raise MeshError(
                "this executable runs a per-device program: call run_devices(inputs_by_rank)"
            )
        return self.sharded.assemble(self.run_devices(self.sharded.split(arrays)))

    def run_devices(self, inputs: Sequence[Sequence[Any]]) -> list[list[np.ndarray]]:
        """Every device's outputs (by rank) from every device's inputs (by rank)."""
        if self.steps is None:
            return evaluate_on_mesh(self.program, self.mesh, inputs)
        if len(inputs) != self.mesh.size:
            raise MeshError(
                f"{len(inputs)} input lists for the {self.mesh.size} devices of the mesh"
            )
        parameters = self.program.parameters
        envs = [dict(zip(parameters, map(np.asarray, xs), strict=True)) for xs in inputs]
        for step in self.steps:
            if isinstance(step, MeshStep):
                self._mesh_step(step, envs)
                continue
            run = self.compiled[id(step)]
            for env in envs:
                env.update(zip(step.outputs, run(*[env[v] for v in step.inputs]), strict=True))
        return [[env[v] for v in self.program.outputs] for env in envs]

    def _mesh_step(self, step: MeshStep, envs: list[dict[int, Any]]) -> None:
        op = step.op
        operands = [env[op.operands[0]] if op.operands else None for env in envs]
        results = [
            _Lockstep(self.mesh, rank, operands).bind(op, [operands[rank]] if op.operands else [])
            for rank in range(self.mesh.size)
        ]
        for env, result in zip(envs, results, strict=True):
            env[op.results[0]] = result


__all__ = ["MeshExecutable"]
