"""`accy launch --gpus N script.py [args...]` / `python -m accy.launch`: one process per GPU.

Starts N copies of `python script.py args...` with the variables torchrun sets (`RANK`,
`WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), the job's secret
(`ACCY_LAUNCH_SECRET`, random for each launch: rank 0's store admits only processes that know
it) and `CUDA_VISIBLE_DEVICES` naming one GPU (the rank-th of those visible to the launcher), so
`accy.mesh.bootstrap` (and `accy.mesh.nccl.Distributed`) find their rank and rank 0's store,
through which the NCCL ids are shared. The store listens on loopback only.

The launch ends as a whole: when one process fails, the others get SIGTERM, then SIGKILL after
a grace period (a rank blocked in a collective with a dead peer would wait forever), and the
launch returns the failed process's exit status (128 + N for a process killed by signal N).
SIGTERM or SIGINT (Ctrl-C) to the launcher is forwarded to every process, with the same grace
period; a second one kills them at once. Several hosts: start the same script with
`torchrun --nnodes ... --nproc-per-node ...` or `mpirun`/`srun` instead (see
`accy.mesh.bootstrap`).
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

from .config import child_environment, config
from .errors import AccyError, MeshError
from .mesh.bootstrap import SECRET_VARIABLE

GRACE_SECONDS = 10.0
"""Seconds the processes of a launch being stopped get between SIGTERM and SIGKILL."""

_POLL_SECONDS = 0.05


def free_port() -> int:
    """A TCP port nothing listens on now (for rank 0's store).

    >>> 1024 <= free_port() <= 65535
    True
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def exit_status(code: int) -> int:
    """A process's exit status as a shell reports it: a death by signal N (Popen's -N) is
    128 + N.

    >>> exit_status(3), exit_status(-15)
    (3, 143)
    """
    return 128 - code if code < 0 else code


def _child_environment(rank: int, processes: int, port: int, secret: str) -> dict[str, str]:
    # The children inherit the launcher's whole environment, plus their place in the launch.
    visible = config.environment("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else None
    return child_environment(
        RANK=str(rank),
        WORLD_SIZE=str(processes),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(processes),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        **{SECRET_VARIABLE: secret},
        # One GPU per process, as its GPU 0 (accy's CUDA backend runs there).
        CUDA_VISIBLE_DEVICES=gpus[rank % len(gpus)] if gpus else str(rank),
    )


@contextlib.contextmanager
def _signals_recorded() -> Iterator[list[int]]:
    """While inside, SIGTERM and SIGINT to this process are appended to the list yielded
    instead of ending it (only the main thread can install handlers; elsewhere nothing is
    caught)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    caught = (signal.SIGTERM, signal.SIGINT)
    previous = {number: signal.getsignal(number) for number in caught}
    for number in caught:
        signal.signal(number, lambda number, frame: received.append(number))
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _outcome(children: list[subprocess.Popen], received: list[int]) -> int:
    """Wait until a process fails (its status), all succeed (0) or a signal arrives (128 + N)."""
    while True:
        if received:
            return 128 + received[0]
        codes = [child.poll() for child in children]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            return exit_status(failed)
        if all(c == 0 for c in codes):
            return 0
        time.sleep(_POLL_SECONDS)


def _stop(children: list[subprocess.Popen], number: int, grace: float, received: list[int]) -> None:
    """Send signal `number` to the processes still running, SIGKILL those left after `grace`
    seconds (at once on a further signal to the launcher), and reap them all."""
    running = [child for child in children if child.poll() is None]
    for child in running:  # only the processes started here
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(number)
    signals_before = len(received)
    deadline = time.monotonic() + grace
    while any(child.poll() is None for child in running):
        if time.monotonic() > deadline or len(received) > signals_before:
            break
        time.sleep(_POLL_SECONDS)
    for child in running:
        if child.poll() is None:
            child.kill()
    for child in children:
        child.wait()


def launch(
    processes: int, command: Sequence[str], port: int | None = None, grace: float = GRACE_SECONDS
) -> int:
    """Run `command` in `processes` processes, ranks 0..processes-1; returns 0 when all succeed,
    else the exit status of the first that failed (the others are then stopped), or 128 + N when
    the launcher got signal N (forwarded to every process). See the module docstring."""
    if port is not None and not 1 <= port <= 65535:
        raise MeshError(f"the store's port {port} is not a TCP port: it must be from 1 to 65535")
    if processes < 1:
        raise MeshError(f"a launch needs at least 1 process, not {processes}")
    port = port or free_port()
    secret = secrets.token_hex(32)
    children: list[subprocess.Popen] = []
    with _signals_recorded() as received:
        status = 128 + signal.SIGTERM
        try:
            for rank in range(processes):
                env = _child_environment(rank, processes, port, secret)
                children.append(subprocess.Popen(list(command), env=env))
            status = _outcome(children, received)
        finally:
            number = received[0] if received else signal.SIGTERM
            _stop(children, number, grace, received)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="accy launch", description="run a script in one process per GPU"
    )
    parser.add_argument("--gpus", type=int, required=True, help="processes (one per GPU)")
    parser.add_argument("--port", type=int, default=None, help="rank 0's store port")
    parser.add_argument(
        "--grace",
        type=float,
        default=GRACE_SECONDS,
        help="seconds between SIGTERM and SIGKILL when the processes are stopped",
    )
    parser.add_argument("script", help="the Python script each process runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    arguments = parser.parse_args(argv)
    if arguments.gpus < 1:
        parser.error("--gpus must be at least 1")
    command = [sys.executable, arguments.script, *arguments.args]
    try:
        return launch(arguments.gpus, command, arguments.port, arguments.grace)
    except AccyError as error:
        print(f"accy launch: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
