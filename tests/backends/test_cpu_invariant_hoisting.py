"""Definitions that do not depend on a loop nest's innermost counter are computed before the
innermost loop (`accy.backends.cpu.loops.nest_hoisting`): a masked exp whose mask is read once
per row and whose operand is read transposed (the shape of an attention softmax's scores) is
generated that way and computes NumPy's values."""

from __future__ import annotations

import numpy as np

import accy
from accy.backends.cpu.compile import compile_program


def masked_exp_program(rows: int, keys: int, lanes: int):
    types = [
        accy.spec(accy.bool_, row=rows, key=keys),
        accy.spec(accy.f32, lane=lanes, row=rows, key=keys),
    ]

    def body(builder, args):
        mask, x = args
        scores = builder.select(mask, x * 0.25, -np.inf)  # [row, key, lane]: lane innermost
        return scores.exp().transpose("row", "key", "lane")

    return accy.trace.define("masked_exp", types, body)


def test_a_row_invariant_mask_is_read_before_the_innermost_loop(native_cpu):
    program = masked_exp_program(6, 5, 64)
    source = compile_program(program).source
    lines = source.splitlines()
    innermost = next(i for i, line in enumerate(lines) if "for (int64_t i2 = 0; i2 < 64;" in line)
    mask_read = next(i for i, line in enumerate(lines) if "!= 0)" in line and "const int" in line)
    assert mask_read < innermost and "i2" not in lines[mask_read]
    rng = np.random.default_rng(0)
    mask = rng.random((6, 5)) < 0.6
    x = rng.standard_normal((64, 6, 5)).astype(np.float32)
    (out,) = accy.compile(program, device="cpu")(mask, x)
    scores = np.where(mask[None], x * np.float32(0.25), -np.inf).transpose(1, 2, 0)
    np.testing.assert_allclose(out, np.exp(scores), rtol=1e-6, atol=0)  # libmvec: ulps
    assert np.all(out[~mask] == 0)
