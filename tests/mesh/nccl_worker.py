"""Run by test_nccl.py in each process of `accy launch --gpus N` (one GPU each): nccl_checks'
every collective and the DP / FSDP gradient programs, through NCCL, against NumPy, as one CUDA
graph per program (with and without gradient buckets) and as segments between NCCL calls."""

from __future__ import annotations

import sys
import time
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
    # One CUDA graph per program with NCCL steps inside (no buckets; 4 KiB buckets, several per
    # step, overlapping the backward pass; 25 MiB buckets), then the segmented fallback. Each
    # configuration's verdict is printed as it ends (a hang shows where).
    for graph, bucket_bytes in ((None, 0), (None, 4096), (None, None), (False, None)):
        start = time.perf_counter()
        found = run_checks(distributed, graph=graph, bucket_bytes=bucket_bytes)
        failures += [f"graph={graph} bucket_bytes={bucket_bytes}: {f}" for f in found]
        verdict = f"{len(found)} failures, first: {found[:2]}" if found else "ok"
        took = time.perf_counter() - start
        print(
            f"rank {env.rank}: graph={graph} bucket_bytes={bucket_bytes}: {verdict} ({took:.1f} s)"
        )
        sys.stdout.flush()
    distributed.close()
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"rank {env.rank}: every collective and sharded program matches through NCCL")


if __name__ == "__main__":
    main()
