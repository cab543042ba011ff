"""The launcher and the bootstrap, with several CPU processes on one host: processes agree on
their ranks and share one id per device group (the NCCL ids on GPUs)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from accy.errors import MeshError
from accy.launch import launch
from accy.mesh import Mesh
from accy.mesh.bootstrap import Environment, Store, share_ids

WORKER = str(Path(__file__).with_name("bootstrap_worker.py"))


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
    with pytest.raises(MeshError, match="not in 0..1"):
        Environment.from_env({"RANK": "2", "WORLD_SIZE": "2"})


def test_store_in_one_process():
    store = Store.connect(Environment(0, 1, 0, "127.0.0.1", 0), timeout=0.2)
    try:
        assert share_ids(store, Mesh([0], "data"), 0, lambda: [1, 2]) == {"data": [1, 2]}
        with pytest.raises(MeshError, match="no process set 'missing'"):
            store.get("missing")
    finally:
        store.close()
