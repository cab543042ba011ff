"""The launcher and the bootstrap, with several CPU processes on one host: processes agree on
their ranks and share one id per device group (the NCCL ids on GPUs)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from accy.errors import MeshError
from accy.launch import launch
from accy.mesh import Mesh
from accy.mesh.bootstrap import Environment, Store, share_ids

WORKER = str(Path(__file__).with_name("bootstrap_worker.py"))
STEPPING = str(Path(__file__).with_name("stepping_worker.py"))


def with_source(path: str) -> str:
    """The tree's src first, then the caller's path (where packages such as optree may live)."""
    return os.pathsep.join(filter(None, [str(Path(__file__).parents[2] / "src"), path]))


@pytest.mark.slow
def test_processes_agree_on_ranks_and_ids(tmp_path):
    assert launch(4, [sys.executable, WORKER, str(tmp_path)]) == 0
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["rank"] for r in reports] == [0, 1, 2, 3]
    assert {r["world"] for r in reports} == {4}
    mesh = Mesh([[0, 1], [2, 3]], ("data", "model"))
    for axis in ("data", "model"):
        for report in reports:
            group = mesh.group(report["rank"], axis)
            assert all(reports[g]["ids"][axis] == report["ids"][axis] for g in group)
    # Different groups along one axis have different ids.
    assert reports[0]["ids"]["model"] != reports[2]["ids"]["model"]
    assert reports[0]["ids"]["data"] != reports[1]["ids"]["data"]


def test_a_failing_process_stops_the_others_and_fails_the_launch():
    script = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(60)"
    started = time.monotonic()
    assert launch(2, [sys.executable, "-c", script]) == 3
    assert time.monotonic() - started < 30  # rank 0 was stopped, not waited for


def test_environment_variables_of_other_launchers():
    mpi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "MASTER_ADDR": "h0"}
    assert Environment.from_env(mpi) == Environment(3, 8, 3, "h0", 29500)
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    assert Environment.from_env(slurm).local_rank == 0
    with pytest.raises(MeshError, match="accy launch --gpus N"):
        Environment.from_env({})
    with pytest.raises(MeshError, match="RANK='2' .* from 0 to 1"):
        Environment.from_env({"RANK": "2", "WORLD_SIZE": "2"})


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not valid: .* from 0 to 1"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' is not valid"),
        ({"RANK": "0", "WORLD_SIZE": "2.5"}, "WORLD_SIZE='2.5' .* at least 1"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' .* at least 1"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x"}, "LOCAL_RANK='x' .* at least 0"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "65536"}, "MASTER_PORT='65536' .* 65535"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "9" * 5000}, "MASTER_PORT="),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": ""}, "MASTER_PORT='' .* from 1"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "two"}, "SLURM_NTASKS='two' .* at least 1"),
    ],
)
def test_a_malformed_launcher_variable_is_named_with_its_value(variables, message):
    with pytest.raises(MeshError, match=message):
        Environment.from_env(variables)


def test_a_port_in_use_or_an_address_of_another_machine_is_a_mesh_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MeshError, match=f"127.0.0.1:{port}: the port is in use"):
            Store.connect(Environment(0, 1, 0, "127.0.0.1", port), timeout=0.2)
    # 198.51.100.1 (TEST-NET-2) is no address of this machine: binding to it sends nothing.
    with pytest.raises(MeshError, match="not an address of this machine"):
        Store.connect(Environment(0, 1, 0, "198.51.100.1", 0), timeout=0.2)
    with pytest.raises(MeshError, match="not a TCP port"):
        Store.connect(Environment(0, 1, 0, "127.0.0.1", 70000), timeout=0.2)
    with pytest.raises(MeshError, match="not a TCP port"):
        launch(1, [sys.executable, "-c", "pass"], port=70000)


def test_store_in_one_process():
    store = Store.connect(Environment(0, 1, 0, "127.0.0.1", 0), timeout=0.2)
    try:
        assert share_ids(store, Mesh([0], "data"), 0, lambda: [1, 2]) == {"data": [1, 2]}
        with pytest.raises(MeshError, match="no process set 'missing'"):
            store.get("missing")
    finally:
        store.close()


def own_non_loopback_address() -> str | None:
    """An IPv4 address of one of this machine's interfaces other than loopback, or None."""
    named = socket.gethostbyname(socket.gethostname())
    if not named.startswith("127."):
        return named
    siocgifaddr = 0x8915  # Linux: an interface's IPv4 address
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(
                    probe.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode())
                )
            except OSError:  # no IPv4 address on this interface
                continue
        address = socket.inet_ntoa(packed[20:24])
        if not address.startswith("127."):
            return address
    return None


def test_the_store_listens_on_the_named_address_only():
    store = Store.connect(Environment(0, 1, 0, "127.0.0.1", 0), timeout=0.2)
    try:
        host, port = store.server.server_address
        assert host == "127.0.0.1"
        other = own_non_loopback_address()
        if other is not None:  # this machine's own address: the store must not answer there
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((other, port), timeout=5).close()
    finally:
        store.close()


def two_rank_store(secret: str | None = "the job's secret") -> tuple[Store, Environment]:
    """Rank 0's store of a two-rank job, and the environment rank 1 would have."""
    first = Store.connect(Environment(0, 2, 0, "127.0.0.1", 0, secret), timeout=5)
    port = first.server.server_address[1]
    return first, Environment(1, 2, 1, "127.0.0.1", port, secret)


def test_a_process_without_the_jobs_secret_is_refused():
    first, second = two_rank_store()
    try:
        other = Store.connect(second, timeout=5)  # the same secret: admitted
        other.set("from rank 1", 1)
        assert first.get("from rank 1") == 1
        other.reader.close()
        other.connection.close()
        wrong = Environment(1, 2, 1, "127.0.0.1", second.master_port, "another secret")
        with pytest.raises(MeshError, match="refused this process: its ACCY_LAUNCH_SECRET"):
            Store.connect(wrong, timeout=5)
        with pytest.raises(MeshError, match="ACCY_LAUNCH_SECRET is not set"):
            Store.connect(Environment(1, 2, 1, "127.0.0.1", second.master_port), timeout=5)
        # A client that skips the handshake and sends requests is never answered, and its
        # requests do not reach the table.
        with socket.create_connection(("127.0.0.1", second.master_port), timeout=5) as raw:
            raw.sendall(b"deadbeef\n" + b'{"op": "set", "key": "nccl-id/forged", "value": 1}\n')
            received = b""
            while chunk := raw.recv(4096):
                received += chunk
            assert len(received.strip()) == 64  # the store's challenge, then nothing but EOF
        assert "nccl-id/forged" not in first.server.store.values
    finally:
        first._leave()


def test_a_store_that_does_not_know_the_secret_is_not_trusted():
    # An impostor listening where rank 0's store should be admits anyone but cannot prove
    # that it knows the job's secret.
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        listening.settimeout(10)
        port = listening.getsockname()[1]

        def impostor() -> None:
            connection, _ = listening.accept()
            with connection, connection.makefile("rb") as reader:
                connection.sendall(b"0" * 64 + b"\n")  # a challenge
                reader.readline()  # the answer, not checked
                reader.readline()  # the client's challenge, answered at random:
                connection.sendall(b"1" * 64 + b"\n")

        thread = threading.Thread(target=impostor)
        thread.start()
        with pytest.raises(MeshError, match="is not this job's store"):
            Store.connect(Environment(1, 2, 1, "127.0.0.1", port, "the job's secret"), 5)
        thread.join(10)


def wait_for(paths: list[Path], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"never written: {[p for p in paths if not p.exists()]}"
        time.sleep(0.05)


def assert_gone(folder: Path, ranks: int) -> None:
    for rank in range(ranks):
        pid = int((folder / f"pid{rank}").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
def test_a_rank_that_dies_mid_step_ends_the_others_even_one_ignoring_sigterm(tmp_path):
    started = time.monotonic()
    assert launch(2, [sys.executable, STEPPING, str(tmp_path), "die+stubborn"], grace=1) == 7
    assert time.monotonic() - started < 30  # rank 0, blocked at the next meeting, was killed
    assert_gone(tmp_path, 2)


@pytest.mark.slow
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_is_forwarded_then_escalated(tmp_path, number):
    command = [sys.executable, "-m", "accy.launch", "--gpus", "2", "--grace", "1"]
    launcher = subprocess.Popen(
        [*command, STEPPING, str(tmp_path), "block+stubborn"],
        env=dict(os.environ, PYTHONPATH=with_source(os.environ.get("PYTHONPATH", ""))),
    )
    try:
        wait_for([tmp_path / "blocked0", tmp_path / "blocked1"], 60)
        launcher.send_signal(number)
        assert launcher.wait(timeout=30) == 128 + number
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert_gone(tmp_path, 2)
