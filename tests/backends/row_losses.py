"""Losses over rows that the reduction tests share: cross-entropy (a max, a pick and a sum over
each row) and a LayerNorm feeding a GEMM (its backward reads the GEMM's gradient, as in GPT-2);
and their random inputs."""

from __future__ import annotations

import numpy as np

import accy
from accy import f32, i32, spec

from ..halves import assert_close_scaled


def cross_entropy_loss(dtype=f32, rows=16, classes=1000):
    return accy.trace.define(
        "cross_entropy",
        [spec(dtype, row=rows, v=classes), spec(i32, row=rows)],
        lambda b, a: accy.nn.cross_entropy(a[0], a[1], "v").mean("row"),
    )


def layer_norm_loss(dtype=f32, rows=8, cols=48, out=5):
    def body(b, a):
        y = accy.nn.layer_norm(a[0], "col") * a[1]
        z = y.contract(a[2], "col")
        return (z * z).sum()

    return accy.trace.define(
        "layer_norm",
        [spec(dtype, row=rows, col=cols), spec(dtype, col=cols), spec(dtype, col=cols, out=out)],
        body,
    )


def random_inputs(program, rng, scale: float = 1.0, shift: float = 0.0) -> list[np.ndarray]:
    """Inputs of `program`: rank-1 int32 parameters are labels (class indices below the first
    parameter's last extent), other int32 ones small integers, floats normal * scale + shift."""
    arrays = []
    for t in program.parameter_types:
        if t.dtype == i32 and t.rank == 1:  # labels
            classes = program.parameter_types[0].extents[-1]
            arrays.append(rng.integers(0, classes, t.extents).astype(np.int32))
        elif t.dtype == i32:
            arrays.append(rng.integers(-50, 50, t.extents).astype(np.int32))
        else:
            arrays.append((rng.standard_normal(t.extents) * scale + shift).astype(t.dtype.numpy))
    return arrays


def check_against_reference(
    executor, program, expected=None, rtol: float = 1e-5, seed: int = 0, **inputs_options
) -> list[np.ndarray]:
    """Run `program` through `executor` on `random_inputs` and compare every output with the
    reference evaluator's (same dtype, within `rtol` of the largest magnitude) and, given
    `expected(*inputs)`, with those values too; the inputs."""
    inputs = random_inputs(program, np.random.default_rng(seed), **inputs_options)
    got = executor(program, inputs)
    reference = accy.reference.run(program, inputs)
    for position, (g, r) in enumerate(zip(got, reference, strict=True)):
        assert g.dtype == r.dtype, f"output {position}: {g.dtype} != {r.dtype}"
        assert_close_scaled(g, r, rtol, f"{program.name} output {position} against the reference")
    if expected is not None:
        for position, (g, e) in enumerate(zip(got, expected(*inputs), strict=True)):
            assert_close_scaled(g, np.asarray(e), rtol, f"{program.name} output {position}")
    return inputs
