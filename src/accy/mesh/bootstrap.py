"""Bootstrap of one process per device: who am I (rank), how many are we, and the NCCL ids.

`Environment.from_env()` reads the variables a launcher sets: `accy launch` / `python -m
accy.launch` and `torchrun` set `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`;
`mpirun` (Open MPI) sets `OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK` and `srun` sets
`SLURM_PROCID/NTASKS/LOCALID` (then give `MASTER_ADDR`/`MASTER_PORT` yourself, e.g.
`mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500`). Rank 0 serves a small key-value `Store`
over TCP at `MASTER_ADDR:MASTER_PORT`; every process connects to it. `share_ids` then gives
each device group of the mesh (the devices that meet over one mesh axis) one id, made by the
group's first rank and read by the others: the NCCL unique id its communicator is built from.
Nothing here needs a GPU, so the bootstrap is tested with processes on one CPU host.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MeshError
from .mesh import Mesh

REPLY_MARGIN = 60.0
"""Seconds a request's reply may take beyond the server's own wait."""

_RANK_VARIABLES = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


@dataclass(frozen=True)
class Environment:
    """This process's place among the processes of one run."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Environment:
        """Read the launcher's variables (see the module docstring).

        >>> Environment.from_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "1234"})
        Environment(rank=1, world_size=2, local_rank=1, master_addr='127.0.0.1', master_port=1234)
        """
        environ = os.environ if environ is None else environ
        for rank_name, size_name, local_name in _RANK_VARIABLES:
            if rank_name in environ and size_name in environ:
                rank, size = int(environ[rank_name]), int(environ[size_name])
                local = int(environ.get(local_name, rank))
                break
        else:
            raise MeshError(
                "no launcher variables found (RANK and WORLD_SIZE, as `accy launch --gpus N` and "
                "torchrun set; or mpirun's OMPI_COMM_WORLD_*, or srun's SLURM_*): start one "
                "process per GPU with `accy launch --gpus N script.py`"
            )
        if not 0 <= rank < size:
            raise MeshError(f"rank {rank} is not in 0..{size - 1} (world size {size})")
        return cls(
            rank,
            size,
            local,
            environ.get("MASTER_ADDR", "127.0.0.1"),
            int(environ.get("MASTER_PORT", "29500")),
        )


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        store: _Served = self.server.store  # type: ignore[attr-defined]
        for line in self.rfile:
            request = json.loads(line)
            if request["op"] == "set":
                store.set(request["key"], request["value"])
                reply: Any = {"ok": True}
            else:
                reply = {"value": store.wait(request["key"], request["timeout"])}
            self.wfile.write((json.dumps(reply) + "\n").encode())
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Served:
    """The table rank 0 serves: values by key, and a condition to wait for a key."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.changed = threading.Condition()

    def set(self, key: str, value: Any) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def wait(self, key: str, timeout: float) -> Any:
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.values, timeout):
                return None
            return self.values[key]


class Store:
    """A key-value store shared by the processes of one run (JSON values); rank 0 serves it.

    >>> store = Store.connect(Environment(0, 1, 0, "127.0.0.1", 0))
    >>> store.set("greeting", "hello"); store.get("greeting")
    'hello'
    >>> store.close()
    """

    def __init__(
        self, connection: socket.socket, server: _Server | None, timeout: float, env: Environment
    ):
        self.env = env
        self.connection = connection
        self.reader = connection.makefile("rb")
        self.server = server
        self.timeout = timeout
        self.lock = threading.Lock()

    @classmethod
    def connect(cls, env: Environment, timeout: float = 300.0) -> Store:
        """Serve (rank 0) and connect; other ranks retry until rank 0 listens or `timeout`."""
        server = None
        port = env.master_port
        if env.rank == 0:
            server = _Server(("0.0.0.0", env.master_port), _Handler)
            server.store = _Served()  # type: ignore[attr-defined]
            port = server.server_address[1]
            threading.Thread(target=server.serve_forever, daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                connection = socket.create_connection((env.master_addr, port), timeout=timeout)
                # A request waits up to `timeout` on the server (`get`): the reply must be given
                # longer than that to arrive, or a loaded machine turns a late reply into an error.
                connection.settimeout(timeout + REPLY_MARGIN)
                return cls(connection, server, timeout, env)
            except OSError as error:
                if time.monotonic() > deadline:
                    raise MeshError(
                        f"rank {env.rank}: no store at {env.master_addr}:{port} after {timeout} s "
                        f"({error}); is rank 0 running, and MASTER_ADDR/MASTER_PORT the same "
                        "in every process?"
                    ) from error
                time.sleep(0.05)

    def _request(self, request: dict[str, Any]) -> Any:
        with self.lock:
            self.connection.sendall((json.dumps(request) + "\n").encode())
            return json.loads(self.reader.readline())

    def set(self, key: str, value: Any) -> None:
        self._request({"op": "set", "key": key, "value": value})

    def get(self, key: str) -> Any:
        """The value of `key`, waiting until some process sets it."""
        reply = self._request({"op": "get", "key": key, "timeout": self.timeout})
        if reply["value"] is None:
            raise MeshError(f"no process set {key!r} within {self.timeout} s")
        return reply["value"]

    def barrier(self, name: str) -> None:
        """Wait until every process of the run reached `barrier(name)`."""
        self.set(f"barrier/{name}/{self.env.rank}", True)
        for rank in range(self.env.world_size):
            self.get(f"barrier/{name}/{rank}")

    def close(self) -> None:
        """Leave the store; rank 0 (which serves it) waits until every rank has left."""
        self.set(f"left/{self.env.rank}", True)
        if self.server is not None:
            for rank in range(self.env.world_size):
                self.get(f"left/{rank}")
        self.reader.close()
        self.connection.close()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def share_ids(
    store: Store, mesh: Mesh, rank: int, make_id: Callable[[], list[int]]
) -> dict[str, list[int]]:
    """For each mesh axis, the id of this rank's group along it: made by `make_id()` on the
    group's first rank, read by the others (so the members of a group agree, and different
    groups differ)."""
    ids = {}
    for mesh_axis in mesh.axis_names:
        group = mesh.group(rank, mesh_axis)
        key = f"nccl-id/{mesh_axis}/{'-'.join(map(str, group))}"
        if rank == group[0]:
            store.set(key, list(make_id()))
        ids[mesh_axis] = store.get(key)
    return ids


__all__ = ["Environment", "Store", "share_ids"]
