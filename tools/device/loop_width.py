"""Elementwise loops at GPT-2's sizes with 16 and 32 bytes a thread: does a second vector load
in flight per thread bring a bandwidth-bound loop closer to HBM's speed?

    PYTHONPATH=src:. python3 tools/device/loop_width.py

Loops: the cross-entropy's logits gradient (8192 x 50304: read the logits, write the gradient,
a label, a cotangent and a logsumexp per row) in f32 and bf16, and GELU's backward (8192 x
3072, three operands) in f32. Each is compiled for CUDA with the usual lane width and with
twice it (`accy.backends.cuda.steps.common.lane_width` patched), its one kernel timed alone
(`CudaFragment.profile`), and the bytes it moves divided by that time.
"""

from __future__ import annotations

import math
import sys

import cupy
import numpy as np

sys.path.insert(0, ".")
import accy  # noqa: E402
from accy.backends.base import backend_for, compile_artifact  # noqa: E402
from accy.backends.cuda import vectors  # noqa: E402
from accy.backends.cuda.runtime import load  # noqa: E402
from accy.backends.cuda.steps import common  # noqa: E402

ROWS, VOCAB, HIDDEN = 8192, 50304, 3072


def cross_entropy_gradient(dtype):
    specs = [
        accy.spec(dtype, row=ROWS, vocab=VOCAB),
        accy.spec(accy.i32, row=ROWS),
        accy.spec(accy.f32, row=ROWS),
        accy.spec(accy.f32, row=ROWS),
    ]

    def body(b, a):
        logits, labels, lse, cotangent = a
        positions = b.iota(accy.spec(accy.i32, row=ROWS, vocab=VOCAB), "vocab")
        gradient = cotangent * (b.convert(logits, accy.f32) - lse).exp()
        return b.convert(b.select(positions.eq(labels), gradient - 1.0 / ROWS, gradient), dtype)

    return accy.trace.define("ce_gradient", specs, body), 2 * ROWS * VOCAB * dtype.itemsize


def gelu_backward(dtype):
    specs = [accy.spec(dtype, row=ROWS, hidden=HIDDEN)] * 2 + [accy.spec(dtype, hidden=HIDDEN)]

    def body(b, a):
        cotangent, x, bias = a
        y = x + bias
        inner = (y + y * y * y * 0.044715) * math.sqrt(2.0 / math.pi)
        t = inner.tanh()
        derivative = 0.5 * (1.0 + t) + 0.5 * y * (1.0 - t * t) * math.sqrt(2.0 / math.pi) * (
            1.0 + 3 * 0.044715 * y * y
        )
        return cotangent * derivative

    return accy.trace.define("gelu_backward", specs, body), 3 * ROWS * HIDDEN * dtype.itemsize


def kernel_ms(program) -> float:
    fragment = load(compile_artifact(backend_for("cuda"), program, None))
    buffers = []
    for t in (*program.parameter_types, *program.output_types):
        if np.issubdtype(t.dtype.numpy, np.integer):
            buffers.append(cupy.zeros(t.extents, dtype=t.dtype.numpy))
        else:
            buffers.append((cupy.random.standard_normal(t.extents) * 0.02).astype(t.dtype.numpy))
    actions = fragment.profile([b.data.ptr for b in buffers], repeats=20)
    return sum(ms for what, ms in actions if "loop" in what)


def main() -> None:
    usual = common.lane_width
    print("loop: lanes a thread -> ms, TB/s")
    for name, make, dtype in (
        ("cross-entropy gradient f32", cross_entropy_gradient, accy.f32),
        ("cross-entropy gradient bf16", cross_entropy_gradient, accy.bf16),
        ("GELU backward f32", gelu_backward, accy.f32),
    ):
        results = []
        for factor in (1, 2):
            vectors.MAX_WIDTH = 8 * factor
            common.lane_width = lambda sizes, f=factor: f * usual(sizes)  # noqa: B023
            program, nbytes = make(dtype)
            ms = kernel_ms(program)
            width = common.lane_width([dtype.itemsize])
            results.append(f"{width} lanes {ms:.3f} ms {nbytes / ms / 1e9:.2f} TB/s")
        print(f"  {name}: " + "; ".join(results))
    common.lane_width, vectors.MAX_WIDTH = usual, 8


if __name__ == "__main__":
    main()
