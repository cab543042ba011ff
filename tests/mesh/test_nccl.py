"""NCCL on several GPUs (skipped without CuPy and two GPUs): `accy launch --gpus 2` runs
nccl_worker.py, which checks every collective and the DP/FSDP gradient programs on each GPU, as one
CUDA graph per program (NCCL steps inside; no buckets, 4 KiB and 25 MiB buckets) and as
segments between NCCL calls."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from accy.launch import launch

from ..executors import cuda_gate


def gpus() -> int:
    if cuda_gate() is not None:
        return 0
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def test_collectives_and_sharded_programs_through_nccl():
    count = gpus()
    if count < 2:
        pytest.skip(cuda_gate() or f"nccl: {count} GPU here, two are needed")
    worker = str(Path(__file__).with_name("nccl_worker.py"))
    assert launch(min(count, 8), [sys.executable, worker]) == 0
