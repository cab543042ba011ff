"""Bootstrap of one process per device: who am I (rank), how many are we, and the NCCL ids.

`Environment.from_env()` reads the variables a launcher sets: `accy launch` / `python -m
accy.launch` and `torchrun` set `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`;
`mpirun` (Open MPI) sets `OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK` and `srun` sets
`SLURM_PROCID/NTASKS/LOCALID` (then give `MASTER_ADDR`/`MASTER_PORT` yourself, e.g.
`mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500`). Rank 0 serves a small key-value `Store`
over TCP at `MASTER_ADDR:MASTER_PORT`, bound to that address only (loopback for one host);
every process connects to it. `share_ids` then gives each device group of the mesh (the devices
that meet over one mesh axis) one id, made by the group's first rank and read by the others:
the NCCL unique id its communicator is built from. Nothing here needs a GPU, so the bootstrap is
tested with processes on one CPU host.

The store decides which communicator each rank joins, so it admits only the processes of its
job: every connection starts with an HMAC challenge each way (as `multiprocessing.connection`
does) over the job's secret, `ACCY_LAUNCH_SECRET`, which `accy launch` makes and hands its
ranks; other launchers' users set it to the same random value in every process.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import config
from ..errors import MeshError
from .mesh import Mesh

SECRET_VARIABLE = "ACCY_LAUNCH_SECRET"
"""The variable that carries the job's secret to every process (`accy launch` sets it)."""

REPLY_MARGIN = 60.0
"""Seconds a request's reply may take beyond the server's own wait."""

HANDSHAKE_TIMEOUT = 30.0
"""Seconds a connecting process has to answer the store's challenge before it is dropped."""

DEFAULT_PORT = 29500

_NONCE_BYTES = 32
_HANDSHAKE_LINE = 256  # longest handshake line read: a hex nonce or digest is 64 characters

_RANK_VARIABLES = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)

_MAKE_SECRET = (
    "export ACCY_LAUNCH_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')"
)


def _whole_variable(
    read: Callable[[str], str | None], name: str, least: int, most: int | None, meaning: str
) -> int:
    """The launcher variable `name` as a whole number in least..most, or a MeshError that names
    the variable, its value and what it must be."""
    text = read(name) or ""
    try:
        value: int | None = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < least or (most is not None and value > most):
        bound = f"from {least} to {most}" if most is not None else f"of at least {least}"
        raise MeshError(
            f"{name}={text!r} is not valid: it must be a whole number {bound} ({meaning})"
        )
    return value


@dataclass(frozen=True)
class Environment:
    """This process's place among the processes of one run, and the job's secret (not shown)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    secret: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Environment:
        """Read the launcher's variables (see the module docstring); `environ` replaces the
        process environment. A malformed variable is a MeshError naming it.

        >>> Environment.from_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "1234"})
        Environment(rank=1, world_size=2, local_rank=1, master_addr='127.0.0.1', master_port=1234)
        """
        read = config.environment if environ is None else environ.get
        for rank_name, size_name, local_name in _RANK_VARIABLES:
            if read(rank_name) is not None and read(size_name) is not None:
                size = _whole_variable(read, size_name, 1, None, "the number of processes")
                rank = _whole_variable(
                    read, rank_name, 0, size - 1, f"this process's rank; {size_name}={size}"
                )
                local = rank
                if read(local_name) is not None:
                    local = _whole_variable(
                        read, local_name, 0, None, "this process's rank on its host"
                    )
                break
        else:
            raise MeshError(
                "no launcher variables found (RANK and WORLD_SIZE, as `accy launch --gpus N` and "
                "torchrun set; or mpirun's OMPI_COMM_WORLD_*, or srun's SLURM_*): start one "
                "process per GPU with `accy launch --gpus N script.py`"
            )
        port = DEFAULT_PORT
        if read("MASTER_PORT") is not None:
            port = _whole_variable(read, "MASTER_PORT", 1, 65535, "the TCP port of rank 0's store")
        address = read("MASTER_ADDR") or "127.0.0.1"
        return cls(rank, size, local, address, port, read(SECRET_VARIABLE) or None)


def _digest(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).hexdigest().encode()


def _send_line(stream: Any, line: bytes) -> None:
    stream.write(line + b"\n")
    stream.flush()


def _receive_line(stream: Any) -> bytes:
    return stream.readline(_HANDSHAKE_LINE).rstrip(b"\n")


def _challenge(reader: Any, writer: Any, secret: bytes) -> bool:
    """Send a random nonce; True when the peer answers with its HMAC under `secret`."""
    nonce = secrets.token_hex(_NONCE_BYTES).encode()
    _send_line(writer, nonce)
    return hmac.compare_digest(_receive_line(reader), _digest(secret, nonce))


def _answer(reader: Any, writer: Any, secret: bytes) -> None:
    """Answer the peer's challenge: the HMAC of its nonce under `secret`."""
    _send_line(writer, _digest(secret, _receive_line(reader)))


class _Handler(socketserver.StreamRequestHandler):
    timeout = HANDSHAKE_TIMEOUT  # for the handshake only; lifted once the peer is admitted

    def handle(self) -> None:
        if not self._admitted():
            return  # the connection closes unanswered: a stranger learns nothing
        self.connection.settimeout(None)
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

    def _admitted(self) -> bool:
        """The peer proves it knows the job's secret, then the store proves it too."""
        secret: bytes = self.server.secret  # type: ignore[attr-defined]
        try:
            if not _challenge(self.rfile, self.wfile, secret):
                return False
            _answer(self.rfile, self.wfile, secret)
        except OSError:  # the peer left or stayed silent past HANDSHAKE_TIMEOUT
            return False
        return True


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


def _job_secret(env: Environment) -> bytes:
    """The job's secret; one process alone may go without (a random one nobody else knows)."""
    if env.secret:
        return env.secret.encode()
    if env.world_size == 1:
        return secrets.token_hex(_NONCE_BYTES).encode()
    raise MeshError(
        f"rank {env.rank}: {SECRET_VARIABLE} is not set, and rank 0's store admits only the "
        f"processes that know the job's secret. `accy launch` sets it; with torchrun, mpirun or "
        f"srun give every process the same random value: {_MAKE_SECRET} before starting them"
    )


def _serve(env: Environment, secret: bytes) -> _Server:
    """Rank 0's store, listening on MASTER_ADDR (only) at MASTER_PORT, in a daemon thread."""
    where = f"{env.master_addr}:{env.master_port}"
    try:
        server = _Server((env.master_addr, env.master_port), _Handler)
    except socket.gaierror as error:
        raise MeshError(
            f"rank 0 cannot serve the store at {where}: MASTER_ADDR={env.master_addr!r} is not a "
            f"known host name or address ({error})"
        ) from None
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            reason = (
                "the port is in use (another job, or one still ending): set MASTER_PORT to a "
                "free port"
            )
        elif error.errno == errno.EADDRNOTAVAIL:
            reason = (
                "MASTER_ADDR is not an address of this machine: run rank 0 on the host it names"
            )
        else:
            reason = str(error)
        raise MeshError(f"rank 0 cannot serve the store at {where}: {reason}") from None
    server.store = _Served()  # type: ignore[attr-defined]
    server.secret = secret  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


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
        """Serve (rank 0) and connect; other ranks retry until rank 0 listens or `timeout`.
        Every connection proves the job's secret both ways (see the module docstring)."""
        if not 0 <= env.master_port <= 65535:
            raise MeshError(f"master_port {env.master_port} is not a TCP port (0 to 65535)")
        secret = _job_secret(env)
        server = _serve(env, secret) if env.rank == 0 else None
        port = env.master_port if server is None else server.server_address[1]
        deadline = time.monotonic() + timeout
        while True:
            try:
                connection = socket.create_connection((env.master_addr, port), timeout=timeout)
            except socket.gaierror as error:
                raise MeshError(
                    f"rank {env.rank}: MASTER_ADDR={env.master_addr!r} is not a known host name "
                    f"or address ({error})"
                ) from None
            except OSError as error:
                if time.monotonic() > deadline:
                    raise MeshError(
                        f"rank {env.rank}: no store at {env.master_addr}:{port} after {timeout} s "
                        f"({error}); is rank 0 running, and MASTER_ADDR/MASTER_PORT the same "
                        "in every process?"
                    ) from error
                time.sleep(0.05)
                continue
            store = cls(connection, server, timeout, env)
            store._authenticate(secret, f"{env.master_addr}:{port}")
            # A request waits up to `timeout` on the server (`get`): the reply must be given
            # longer than that to arrive, or a loaded machine turns a late reply into an error.
            connection.settimeout(timeout + REPLY_MARGIN)
            return store

    def _authenticate(self, secret: bytes, where: str) -> None:
        """Answer the store's challenge, then challenge it; a MeshError (and everything of this
        process's closed) when either side does not know the job's secret."""
        self.connection.settimeout(HANDSHAKE_TIMEOUT)
        nonce = secrets.token_hex(_NONCE_BYTES).encode()
        try:
            with self.connection.makefile("wb") as writer:
                _answer(self.reader, writer, secret)
                _send_line(writer, nonce)
            proof = _receive_line(self.reader)
        except OSError:  # the store closed the connection on our answer
            proof = b""
        if hmac.compare_digest(proof, _digest(secret, nonce)):
            return
        self._leave()
        if not proof:
            raise MeshError(
                f"rank {self.env.rank}: the store at {where} refused this process: its "
                f"{SECRET_VARIABLE} is not the one rank 0 has (give every process of the job the "
                "same value)"
            )
        raise MeshError(
            f"rank {self.env.rank}: what listens at {where} is not this job's store (it does not "
            f"know the job's {SECRET_VARIABLE}); check MASTER_ADDR and MASTER_PORT"
        )

    def _leave(self) -> None:
        self.reader.close()
        self.connection.close()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

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
        self._leave()


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


__all__ = ["SECRET_VARIABLE", "Environment", "Store", "share_ids"]
