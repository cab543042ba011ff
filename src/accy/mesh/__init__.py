"""Several devices: a named device mesh, the SPMD transform, and running on the mesh."""

from .evaluate import run
from .mesh import Mesh, check_axis_mapping
from .spmd import ShardedProgram, Sharding, shard_program

__all__ = ["Mesh", "Sharding", "ShardedProgram", "check_axis_mapping", "run", "shard_program"]
