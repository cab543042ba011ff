"""NCCL on the GPUs of this machine (skipped without CuPy and a GPU): `accy launch --gpus N`
(every GPU, at most 8) runs nccl_worker.py, which checks every collective and the DP/FSDP
gradient programs on each GPU, as one CUDA graph per program (NCCL steps inside; no buckets,
4 KiB and 25 MiB buckets) and as segments between NCCL calls. On one GPU NCCL has one rank:
its collectives compute nothing across devices, but everything around them (the steps captured
in the graph, the second stream of the buckets, donation, the segmented path) runs as on
several."""

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
    if count < 1:
        pytest.skip(cuda_gate() or "nccl: no GPU here")
    worker = str(Path(__file__).with_name("nccl_worker.py"))
    assert launch(min(count, 8), [sys.executable, worker]) == 0
