"""Achieved memory bandwidth of accy's generated CUDA kernels (accy only, one GPU).

    python -m bench.kernel_bandwidth [--dtypes bf16,f32] [--repeats 20] [--json PATH]

Memory-bound programs, each in bf16 and f32, at the sizes of GPT-2 small's training step:

- `elementwise`: x * y + 1 over 25M elements (two reads, one write);
- `row_sum_exp`: sum(exp(x)) along the rows of the [8192 x 50304] logits (one read);
- `cross_entropy`: the value and logits' gradient of the mean cross-entropy over those logits,
  integer labels (at least one read of the logits and one write of their gradient);
- `layer_norm`: LayerNorm forward and backward over [8192 x 768] (the value and gradient of
  sum(layer_norm(x) * g): reads x and g, writes dx);
- `transpose_pack`: only the kernel that packs GPT-2's attention output for the output
  projection's weight gradient: [batch 8, head 12, token 1024, 64 of a row of 72] copied into
  [head, dim, batch, token] (a transposing copy: tiles through shared memory,
  `accy.backends.cuda.tiles`; one read and one write of 8 x 12 x 1024 x 64 values);
- `plain_pack`: only the pack of the same tensor for the projection itself, [batch, token,
  head, dim] (stride 1 along dim in both layouts: a plain copy), for comparison.
- `qkv_split`: q, k and v taken out of the fused qkv projection's output [batch 8, token 1024,
  3, head 12, dim 64] into three contiguous [batch, token, head, dim] buffers (a reshape of a
  slice: strided copies, one read and one write of every element);
- `qkv_gradient`: the qkv gradient [8, 1024, 3, 12, 64] assembled from the attention backward's
  stacked rows [batch, head, 3 x 1024 (dQ; dK; dV), 64] (the pullback of the three slices: a
  sum of zero pads, joined into one concatenate, one strided copy);
- `column_sum`, `column_sum_3072`: sums over the rows of [8192 x 768] and [8192 x 3072] (a
  bias gradient: the innermost axis kept, one read);
- `gain_gradient`: sum over the rows of dy * (xhat * s[row]) over [8192 x 768] (LayerNorm's
  gain gradient: a column reduction of a fused product, two reads).

Each program's schedule is timed action by action (`CudaFragment.profile`: CUDA events around
each kernel, median of `--repeats`); GB/s is the least bytes the program must move (each input
read once, each output written once) over the summed kernel time, so several passes over the
same data show as a lower rate. An H200's HBM3e peaks at about 4.8 TB/s; good kernels reach
about 4 TB/s. The slowest actions are listed below each program.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import accy
from accy import i32, spec

ELEMENTS = 25 * 1024 * 1024
ROWS, CLASSES = 8192, 50304
WIDTH = 768
HIDDEN = 3072


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable  # dtype -> program
    bytes_moved: Callable  # dtype itemsize -> least bytes the program moves
    # Only the actions whose description holds this text are timed (None: every action).
    only: str | None = None


def _elementwise(dtype):
    return accy.trace.define(
        "elementwise", [spec(dtype, n=ELEMENTS)] * 2, lambda b, a: a[0] * a[1] + 1.0
    )


def _row_sum_exp(dtype):
    return accy.trace.define(
        "row_sum_exp", [spec(dtype, row=ROWS, v=CLASSES)], lambda b, a: a[0].exp().sum("v")
    )


def _cross_entropy(dtype):
    program = accy.trace.define(
        "cross_entropy",
        [spec(dtype, row=ROWS, v=CLASSES), spec(i32, row=ROWS)],
        lambda b, a: accy.nn.cross_entropy(a[0], a[1], "v").mean("row"),
    )
    return accy.value_and_grad(program, wrt=[0])


def _layer_norm(dtype):
    program = accy.trace.define(
        "layer_norm",
        [spec(dtype, row=ROWS, col=WIDTH)] * 2,
        lambda b, a: (accy.nn.layer_norm(a[0], "col") * a[1]).sum(),
    )
    return accy.value_and_grad(program, wrt=[0])


BATCH, HEADS, TOKENS, HEAD_DIM, HEAD_ROW = 8, 12, 1024, 64, 72
PACKED = BATCH * HEADS * TOKENS * HEAD_DIM


def _attention_rows(dtype):
    # The fused attention's output: each row holds 64 values and the logsumexp (and padding).
    return spec(dtype, b=BATCH, h=HEADS, t=TOKENS, d=HEAD_ROW)


def _transpose_pack(dtype):
    return accy.trace.define(
        "transpose_pack",
        [_attention_rows(dtype), spec(dtype, b=BATCH, t=TOKENS, e=WIDTH)],
        lambda b, a: a[0].slice("d", 0, HEAD_DIM).contract(a[1], ("b", "t")),
    )


def _plain_pack(dtype):
    return accy.trace.define(
        "plain_pack",
        [_attention_rows(dtype), spec(dtype, h=HEADS, d=HEAD_DIM, e=WIDTH)],
        lambda b, a: a[0].slice("d", 0, HEAD_DIM).contract(a[1], ("h", "d")),
    )


def _qkv(dtype):
    return spec(dtype, b=BATCH, t=TOKENS, part=3, h=HEADS, d=HEAD_DIM)


def _qkv_split(dtype):
    def body(_, a):
        return [a[0].slice("part", j, j + 1).sum("part") for j in range(3)]

    # `accy.jit` simplifies what it traces: the sum over one element becomes a reshape.
    return accy.simplify(accy.trace.define("qkv_split", [_qkv(dtype)], body))


def _qkv_gradient(dtype):
    def body(_, a):
        total = None
        for j in range(3):
            rows = a[0].slice("row", j * TOKENS, (j + 1) * TOKENS).rename("row", "t")
            piece = rows.transpose("b", "t", "h", "d").broadcast_to(
                spec(dtype, b=BATCH, t=TOKENS, part=1, h=HEADS, d=HEAD_DIM)
            )
            padded = piece.pad("part", j, 2 - j)  # the pullback of slice j along part
            total = padded if total is None else total + padded
        return total

    rows = spec(dtype, b=BATCH, h=HEADS, row=3 * TOKENS, d=HEAD_DIM)
    return accy.simplify(accy.trace.define("qkv_gradient", [rows], body))


def _column_sum(columns: int):
    def build(dtype):
        types = [spec(dtype, row=ROWS, col=columns)]
        return accy.trace.define("column_sum", types, lambda b, a: a[0].sum("row"))

    return build


def _gain_gradient(dtype):
    types = [spec(dtype, row=ROWS, col=WIDTH)] * 2 + [spec(dtype, row=ROWS)]
    return accy.trace.define("gain_gradient", types, lambda b, a: (a[0] * (a[1] * a[2])).sum("row"))


CASES = [
    Case("elementwise", _elementwise, lambda s: 3 * ELEMENTS * s),
    Case("row_sum_exp", _row_sum_exp, lambda s: ROWS * CLASSES * s + ROWS * s),
    Case("cross_entropy", _cross_entropy, lambda s: 2 * ROWS * CLASSES * s + ROWS * 4),
    Case("layer_norm", _layer_norm, lambda s: 3 * ROWS * WIDTH * s),
    Case("transpose_pack", _transpose_pack, lambda s: 2 * PACKED * s, only="(pack "),
    Case("plain_pack", _plain_pack, lambda s: 2 * PACKED * s, only="(pack "),
    Case("qkv_split", _qkv_split, lambda s: 2 * 3 * PACKED * s),
    Case("qkv_gradient", _qkv_gradient, lambda s: 2 * 3 * PACKED * s),
    Case("column_sum", _column_sum(WIDTH), lambda s: (ROWS + 1) * WIDTH * s),
    Case("column_sum_3072", _column_sum(HIDDEN), lambda s: (ROWS + 1) * HIDDEN * s),
    Case("gain_gradient", _gain_gradient, lambda s: (2 * ROWS + 1) * WIDTH * s + ROWS * s),
]


def _buffers(program):
    import cupy
    import numpy as np

    buffers = []
    for t in (*program.parameter_types, *program.output_types):
        if np.issubdtype(t.dtype.numpy, np.integer):
            buffers.append(cupy.zeros(t.extents, dtype=t.dtype.numpy))
        else:
            buffers.append((cupy.random.standard_normal(t.extents) * 0.5).astype(t.dtype.numpy))
    return buffers


def measure(case: Case, dtype, repeats: int, top: int) -> dict:
    """Compile `case` in `dtype`, time its actions; the row of the report."""
    from accy.backends.base import backend_for, compile_artifact
    from accy.backends.cuda.runtime import load

    program = case.build(dtype)
    start = time.perf_counter()
    fragment = load(compile_artifact(backend_for("cuda"), program, None))
    compile_s = time.perf_counter() - start
    buffers = _buffers(program)
    actions = fragment.profile([b.data.ptr for b in buffers], repeats=repeats)
    if case.only is not None:
        actions = [(what, ms) for what, ms in actions if case.only in what]
    ms = sum(t for _, t in actions)
    nbytes = case.bytes_moved(dtype.itemsize)
    return {
        "case": case.name,
        "dtype": str(dtype),
        "ms": ms,
        "bytes": nbytes,
        "gb_per_s": nbytes / ms / 1e6,
        "actions": len(actions),
        "compile_s": compile_s,
        "slowest": sorted(actions, key=lambda a: -a[1])[:top],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--cases", default=",".join(c.name for c in CASES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--top", type=int, default=4, help="slowest actions listed per case")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if not accy.backends.cuda.platform_supported():
        print("kernel_bandwidth: needs CUDA (CuPy and a GPU)", file=sys.stderr)
        return 2
    dtypes = [getattr(accy, name) for name in args.dtypes.split(",")]
    cases = [c for c in CASES if c.name in args.cases.split(",")]
    rows = []
    print(f"{'case':14s} {'dtype':5s} {'ms':>8s} {'MB moved':>9s} {'GB/s':>7s} {'kernels':>7s}")
    for case in cases:
        for dtype in dtypes:
            try:
                row = measure(case, dtype, args.repeats, args.top)
            except Exception as error:  # one failing case must not hide the others
                print(f"{case.name:14s} {dtype!s:5s} FAILED: {type(error).__name__}: {error}")
                continue
            rows.append(row)
            print(
                f"{row['case']:14s} {row['dtype']:5s} {row['ms']:8.3f} "
                f"{row['bytes'] / 1e6:9.1f} {row['gb_per_s']:7.0f} {row['actions']:7d}"
            )
            for what, ms in row["slowest"]:
                print(f"    {ms * 1e3:8.1f} us  {what[:110]}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
