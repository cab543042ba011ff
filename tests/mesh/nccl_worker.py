"""Run by test_nccl.py in each process of `accy launch --gpus N` (one GPU each): nccl_checks'
every collective and the DP / FSDP gradient programs, through NCCL, against NumPy."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # nccl_checks, next to this file

from nccl_checks import run_checks  # noqa: E402

from accy.mesh import Mesh  # noqa: E402
from accy.mesh.bootstrap import Environment  # noqa: E402
from accy.mesh.nccl import Distributed  # noqa: E402


def main() -> None:
    env = Environment.from_env()
    distributed = Distributed(Mesh(range(env.world_size), "data"), env)
    failures = run_checks(distributed)
    distributed.close()
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"rank {env.rank}: every collective and sharded program matches through NCCL")


if __name__ == "__main__":
    main()
