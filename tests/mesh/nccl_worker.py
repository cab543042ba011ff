"""Run by test_nccl.py in each process of `accy launch --gpus N` (one GPU each): nccl_checks'
every collective and the DP / FSDP gradient programs, through NCCL, against NumPy, as one CUDA
graph per program (with and without gradient buckets) and as segments between NCCL calls."""

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
    failures = []
    # One CUDA graph per program (NCCL steps inside; gradient psums in one 25 MiB bucket, then
    # in 4 KiB buckets, several, overlapping the backward pass), and the segmented fallback.
    for graph, bucket_bytes in ((None, None), (None, 4096), (None, 0), (False, None)):
        failures += [
            f"graph={graph} bucket_bytes={bucket_bytes}: {failure}"
            for failure in run_checks(distributed, graph=graph, bucket_bytes=bucket_bytes)
        ]
    distributed.close()
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"rank {env.rank}: every collective and sharded program matches through NCCL")


if __name__ == "__main__":
    main()
