"""Every kind on the CUDA backend against the reference evaluator (skipped without a GPU, the
skip naming the closed gate)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import accy

from ..executors import cuda_device_or_skip, native_cuda
from ..halves import comparable
from .kind_programs import CASES, Case


@pytest.fixture(scope="module")
def gpu():
    return cuda_device_or_skip()


def _compare(got: list[np.ndarray], expected: list[np.ndarray], case: Case) -> None:
    assert len(got) == len(expected)
    for position, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype, f"output {position}: {g.dtype} != {e.dtype}"
        assert g.shape == e.shape, f"output {position}: {g.shape} != {e.shape}"
        g, e = comparable(g), comparable(e)
        if e.dtype.kind == "f" and (case.rtol or case.atol):
            np.testing.assert_allclose(
                g, e, rtol=case.rtol, atol=case.atol, equal_nan=True, err_msg=f"output {position}"
            )
        else:
            np.testing.assert_array_equal(g, e, err_msg=f"output {position}")


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_every_kind_matches_the_reference_on_cuda(gpu, case):
    program = case.build()
    # Three calls: the first two capture one graph each (two slots), the third replays the
    # first graph on new buffers.
    for call in range(3):
        rng = np.random.default_rng(call + zlib.crc32(case.name.encode()))
        inputs = case.inputs(rng, program)
        _compare(native_cuda(program, inputs), accy.reference.run(program, inputs), case)
