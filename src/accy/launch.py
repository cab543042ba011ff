"""`accy launch --gpus N script.py [args...]` / `python -m accy.launch`: one process per GPU.

Starts N copies of `python script.py args...` with the variables torchrun sets (`RANK`,
`WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) and `CUDA_VISIBLE_DEVICES` naming one
GPU (the rank-th of those visible to the launcher), so `accy.mesh.bootstrap` (and
`accy.mesh.nccl.Distributed`) find their rank and rank 0's store, through which the NCCL ids
are shared. When one process fails, the others are stopped and its exit code is returned.
Several hosts: start the same script with `torchrun --nnodes ... --nproc-per-node ...` or
`mpirun`/`srun` instead (see `accy.mesh.bootstrap`).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence


def free_port() -> int:
    """A TCP port nothing listens on now (for rank 0's store)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(processes: int, command: Sequence[str], port: int | None = None) -> int:
    """Run `command` in `processes` processes, ranks 0..processes-1; returns the first nonzero
    exit code (the others are then stopped), or 0."""
    port = port or free_port()
    children = []
    for rank in range(processes):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(processes),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(processes),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else None
        # One GPU per process, as its GPU 0 (accy's CUDA backend runs there).
        env["CUDA_VISIBLE_DEVICES"] = gpus[rank % len(gpus)] if gpus else str(rank)
        children.append(subprocess.Popen(list(command), env=env))
    try:
        while True:
            codes = [child.poll() for child in children]
            failed = next((c for c in codes if c not in (None, 0)), None)
            if failed is not None:
                return failed
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
    finally:
        for child in children:  # only the processes started here
            if child.poll() is None:
                child.terminate()
        for child in children:
            child.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accy launch", description="run a script in one process per GPU"
    )
    parser.add_argument("--gpus", type=int, required=True, help="processes (one per GPU)")
    parser.add_argument("--port", type=int, default=None, help="rank 0's store port")
    parser.add_argument("script", help="the Python script each process runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    arguments = parser.parse_args(argv)
    if arguments.gpus < 1:
        parser.error("--gpus must be at least 1")
    command = [sys.executable, arguments.script, *arguments.args]
    return launch(arguments.gpus, command, arguments.port)


if __name__ == "__main__":
    sys.exit(main())
