"""The cross-entropy's logits gradient written in place over the logits (as in GPT-2's step),
with one and with two vectors a thread at a time (`accy.backends.cuda.steps.common`'s
`_pairs_vectors`), in f32 and bf16 at GPT-2's size (8192 x 50304).

    PYTHONPATH=src:. python3 tools/device/loop_pairs.py

The logits come from a GEMM and the gradient goes on to one, so that the gradient's loop may
write over the logits (the plan's `in_place`). Each program is compiled for CUDA, its loop
timed alone (`CudaFragment.profile`), and the bytes it moves divided by that time. (Session 9
also tried 32 bytes a thread instead of 16 out of place, with no gain: f32 0.884 against
0.947 ms, bf16 0.484 against 0.616.)
"""

from __future__ import annotations

import sys

import cupy
import numpy as np

sys.path.insert(0, ".")
import accy  # noqa: E402
from accy.backends.base import backend_for, compile_artifact  # noqa: E402
from accy.backends.cuda.runtime import load  # noqa: E402
from accy.backends.cuda.steps import common  # noqa: E402

ROWS, VOCAB, WIDTH = 8192, 50304, 64


def cross_entropy_gradient(dtype):
    specs = [
        accy.spec(dtype, row=ROWS, k=WIDTH),
        accy.spec(dtype, k=WIDTH, vocab=VOCAB),
        accy.spec(accy.i32, row=ROWS),
        accy.spec(accy.f32, row=ROWS),
        accy.spec(accy.f32, row=ROWS),
    ]

    def body(b, a):
        h, w, labels, lse, cotangent = a
        logits = h.contract(w, ("k",))
        positions = b.iota(accy.spec(accy.i32, row=ROWS, vocab=VOCAB), "vocab")
        gradient = cotangent * (b.convert(logits, accy.f32) - lse).exp()
        gradient = b.select(positions.eq(labels), gradient - 1.0 / ROWS, gradient)
        return b.convert(gradient, dtype).contract(w, ("vocab",))

    return accy.trace.define("ce_gradient", specs, body), 2 * ROWS * VOCAB * dtype.itemsize


def loop_ms(program) -> tuple[float, bool]:
    """(milliseconds of the program's loops, whether one wrote in place)."""
    compiled = compile_artifact(backend_for("cuda"), program, None)
    in_place = " *v" in compiled.source and "__restrict__" in compiled.source
    fragment = load(compiled)
    buffers = []
    for t in (*program.parameter_types, *program.output_types):
        if np.issubdtype(t.dtype.numpy, np.integer):
            buffers.append(cupy.zeros(t.extents, dtype=t.dtype.numpy))
        else:
            buffers.append((cupy.random.standard_normal(t.extents) * 0.02).astype(t.dtype.numpy))
    actions = fragment.profile([b.data.ptr for b in buffers], repeats=20)
    return sum(ms for what, ms in actions if what.endswith(": loop")), in_place


def main() -> None:
    pairs = common._pairs_vectors
    print("cross-entropy gradient in place: vectors a thread -> ms, TB/s")
    for dtype in (accy.f32, accy.bf16):
        results = []
        for paired in (False, True):
            common._pairs_vectors = pairs if paired else (lambda *_: False)
            program, nbytes = cross_entropy_gradient(dtype)
            ms, in_place = loop_ms(program)
            results.append(
                f"{2 if paired else 1}: {ms:.3f} ms {nbytes / ms / 1e9:.2f} TB/s"
                + ("" if in_place else " (not in place!)")
            )
        print(f"  {dtype.name}: " + "; ".join(results))
    common._pairs_vectors = pairs


if __name__ == "__main__":
    main()
