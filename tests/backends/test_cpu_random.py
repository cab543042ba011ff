"""accy.random on the native CPU backend: every stream bit for bit as on the reference."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy import bf16, f32, f64, i32, spec
from accy.random import KEY


def _streams(b, args):
    k, logits = args
    keys = accy.random.split(k, 6)
    t = spec(f32, row=300, col=1000)
    return (
        accy.random.bits(keys[0], spec(i32, n=4097)),
        accy.random.uniform(keys[1], t),
        accy.random.normal(keys[2], t),
        accy.random.uniform(keys[3], spec(f64, n=1000), -1.0, 2.0),
        accy.random.uniform(keys[3], spec(bf16, n=1000)),
        accy.random.categorical(keys[4], b.broadcast_to(logits, spec(f32, n=500, c=5)), "c"),
        accy.nn.dropout(keys[5], accy.random.normal(keys[1], spec(f32, n=999)), 0.3),
        accy.random.uniform(accy.random.split_along(k, "batch", 3), spec(f32, n=7)),
    )


def _program():
    return accy.trace.define("streams", [KEY, spec(f32, c=5)], _streams)


@pytest.mark.slow
def test_random_streams_are_bit_identical_to_the_reference(native_cpu):
    program = _program()
    inputs = [accy.random.key(42), np.linspace(-1, 1, 5).astype(np.float32)]
    native = accy.compile(program, device="cpu")(*inputs)
    expected = accy.reference.run(program, inputs)
    for position, (got, want) in enumerate(zip(native, expected, strict=True)):
        assert got.dtype == want.dtype, position
        np.testing.assert_array_equal(
            got.view(np.uint8), want.view(np.uint8), err_msg=f"output {position}"
        )
