"""Sweep the column-reduction kernel's cut (`accy.backends.cuda.columns`: blocks in flight,
vectors per tile) on the GPU: microseconds and GB/s of one column sum for each setting, so that
the defaults can be checked against their neighbours.

    PYTHONPATH=src python3 tools/device/colred_sweep.py
"""

from __future__ import annotations

import sys

import cupy

import accy
from accy import spec
from accy.backends.base import backend_for, compile_artifact
from accy.backends.cuda import columns
from accy.backends.cuda.runtime import load

SHAPES = [("bf16", 8192, 768), ("bf16", 8192, 3072), ("f32", 8192, 768)]
SETTINGS = [(busy, vectors) for busy in (264, 396, 528, 792) for vectors in (8, 16, 32)]


def time_us(dtype: str, rows: int, cols: int) -> tuple[float, int]:
    d = getattr(accy, dtype)
    program = accy.trace.define(
        f"colsum_{columns.BUSY_BLOCKS}_{columns.COLUMN_VECTORS}",
        [spec(d, row=rows, col=cols)],
        lambda b, a: a[0].sum("row"),
    )
    fragment = load(compile_artifact(backend_for("cuda"), program, None))
    x = (cupy.random.standard_normal((rows, cols)) * 0.5).astype(d.numpy)
    out = cupy.zeros((cols,), dtype=d.numpy)
    actions = fragment.profile([x.data.ptr, out.data.ptr], repeats=20)
    return sum(ms for _, ms in actions) * 1e3, rows * cols * d.itemsize


def main() -> int:
    defaults = (columns.BUSY_BLOCKS, columns.COLUMN_VECTORS)
    print(f"defaults: BUSY_BLOCKS={defaults[0]} COLUMN_VECTORS={defaults[1]}")
    print("busy vec  " + "  ".join(f"{d}[{r}x{c}]".rjust(18) for d, r, c in SHAPES))
    for busy, vectors in SETTINGS:
        columns.BUSY_BLOCKS, columns.COLUMN_VECTORS = busy, vectors
        cells = []
        for shape in SHAPES:
            try:
                us, nbytes = time_us(*shape)
                cells.append(f"{us:6.1f}us {nbytes / us / 1e3:5.0f}GB/s")
            except Exception as error:  # one failing setting must not hide the others
                cells.append(f"FAILED {type(error).__name__}"[:18])
        mark = " *" if (busy, vectors) == defaults else ""
        print(f"{busy:4d} {vectors:3d}  " + "  ".join(c.rjust(18) for c in cells) + mark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
