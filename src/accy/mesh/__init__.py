"""Several devices: a named device mesh, the SPMD transform, and running on the mesh.

- `Mesh(devices, axis_names)`: devices on named mesh axes.
- `shard(fn_or_program, mesh, axis_mapping)`: the per-device (SPMD) program, each device
  holding its block of every mapped axis (`accy.mesh.spmd`), or a function run so.
- `run(program, mesh, inputs_by_rank)`: the mesh evaluator, the oracle (`accy.mesh.evaluate`).
- `compile(sharded, device)` / `MeshExecutable`: a simulated mesh in one process, on the
  reference evaluator or as native CPU segments between collectives.
- `accy.mesh.nccl` and `accy.launch`: one process per GPU, collectives through NCCL, inside
  each step's CUDA graph (`accy.mesh.graph`) or between segments.

See README.md in this folder for the design.
"""

from .evaluate import run
from .executable import MeshExecutable
from .function import ShardedFunction, compile, shard
from .mesh import Mesh, check_axis_mapping
from .segments import split_program
from .spmd import ShardedProgram, Sharding, shard_program

__all__ = [
    "Mesh",
    "MeshExecutable",
    "ShardedFunction",
    "ShardedProgram",
    "Sharding",
    "check_axis_mapping",
    "compile",
    "run",
    "shard",
    "shard_program",
    "split_program",
]
