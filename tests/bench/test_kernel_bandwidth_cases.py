"""`bench.kernel_bandwidth`'s pack cases time the kernels they name (no GPU: the CUDA source
is generated in Python)."""

from __future__ import annotations

import re

import pytest

import accy
from accy.backends.cuda import compile_program
from bench import kernel_bandwidth

PACKS = {case.name: case for case in kernel_bandwidth.CASES if case.only == "(pack "}


@pytest.mark.parametrize(
    ("name", "pack"),
    [("transpose_pack", "pack lhs, 64x64 tiles"), ("plain_pack", "pack lhs")],
)
def test_each_pack_case_has_the_one_pack_it_times(name, pack):
    source = compile_program(PACKS[name].build(accy.bf16)).source
    assert re.findall(r"/\* step \d+: dot \((pack [^)]*)\) \*/", source) == [pack]
    # One read and one write of the 8 x 12 x 1024 x 64 values packed, 2 bytes each.
    assert PACKS[name].bytes_moved(2) == 2 * 8 * 12 * 1024 * 64 * 2


@pytest.mark.parametrize("name", ["qkv_split", "qkv_gradient"])
def test_the_qkv_cases_are_plain_vector_copies(name):
    (case,) = [c for c in kernel_bandwidth.CASES if c.name == name]
    compiled = compile_program(case.build(accy.bf16))
    kernels = re.findall(r"/\* step \d+: (\w+) \*/", compiled.source)
    assert kernels == ["loop"] * {"qkv_split": 3, "qkv_gradient": 1}[name]
    body = compiled.source[compiled.source.index("/* step") :]
    assert "ACCY_CLAMP" not in body and "accy_vector<uint16_t, 8>" in body
    # One read and one write of the 8 x 1024 x 3 x 12 x 64 values, 2 bytes each.
    assert case.bytes_moved(2) == 2 * 8 * 1024 * 3 * 12 * 64 * 2
