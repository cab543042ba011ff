"""CUDA for sort: one block per row, a bitonic sort of (key, position) pairs in shared memory.

Bitonic sorting networks are not stable by themselves; comparing positions when keys are equal
makes the order total, so the result is the stable one (the CPU's and the reference's, bit for
bit). A row is padded to a power of two with positions past its end, which sort last. Rows
longer than `CUDA_MAX_ROW` (4096: keys of 8 bytes and 4-byte positions fill 48 KiB of static
shared memory) are refused with an error at compile time.
"""

from __future__ import annotations

from ....codegen.c.dialect import CUDA
from ....codegen.c.expressions import linear
from ....codegen.c.templates import precedes
from ....core.kinds.sorting import CUDA_MAX_ROW
from ....errors import AccyError
from ..context import StepCode, StepContext, launches, nothing
from ..kernels import MAX_BLOCKS, decompose
from .common import indent, store


def _before(family: str, descending: bool, first: tuple[str, str], second: tuple[str, str]):
    """C: does the pair (key, position) `first` sort strictly before `second`? Positions past
    the row (`n` and more: padding) sort last; equal keys go by position (stability)."""
    (ka, ia), (kb, ib) = first, second
    key_first = precedes(family, descending, ka, kb)
    key_second = precedes(family, descending, kb, ka)
    return (
        f"(({ia} >= n || {ib} >= n) ? ({ia} < {ib}) : "
        f"{key_first} ? true : {key_second} ? false : ({ia} < {ib}))"
    )


def emit_sort(ctx: StepContext) -> StepCode:
    """Sort each row of the keys in shared memory, then write every operand in that order."""
    op = ctx.step.op
    t = op.operand_types[0]
    if t.size == 0:
        return nothing
    position = t.position(op.attrs["axis"])
    n = t.extents[position]
    if n > CUDA_MAX_ROW:
        raise AccyError(
            f"sort on cuda sorts rows of up to {CUDA_MAX_ROW} elements; axis "
            f"{op.attrs['axis']!r} of {t} has {n} (sort on the cpu, or split the axis)"
        )
    padded = 1 << max(n - 1, 0).bit_length()
    rows = t.size // n
    ctype = CUDA.c_type(t.dtype)
    others = [p for p in range(t.rank) if p != position]
    names = {p: "0" if t.extents[p] == 1 else f"i{p}" for p in others}

    def index(along: str) -> tuple[str, ...]:
        return tuple(along if p == position else names[p] for p in range(t.rank))

    row_extents = tuple(t.extents[p] for p in others)
    pointers = ctx.pointers()
    load_body = ctx.body(pointers)
    key = load_body.value(op.operands[0], index("j"))
    other_first = _before(ctype.family, op.attrs["descending"], ("kb", "ib"), ("ka", "ia"))
    lines = [
        f"__shared__ {ctype.compute} keys[{padded}];",
        f"__shared__ int order[{padded}];",
        f"const int n = {n};",
        f"for (int64_t row = blockIdx.x; row < {rows}LL; row += gridDim.x) {{",
        *indent(decompose("row", row_extents, tuple(names[p] for p in others))),
        f"  for (int j = threadIdx.x; j < {padded}; j += blockDim.x) {{",
        "    if (j < n) {",
        *indent(indent(indent(load_body.lines))),
        f"      keys[j] = {key};",
        "    }",
        "    order[j] = j;",
        "  }",
        "  __syncthreads();",
        f"  for (int size = 2; size <= {padded}; size <<= 1) {{",
        "    for (int stride = size >> 1; stride > 0; stride >>= 1) {",
        f"      for (int i = threadIdx.x; i < {padded}; i += blockDim.x) {{",
        "        const int other = i ^ stride;",
        "        if (other > i) {",
        "          const int ia = order[i], ib = order[other];",
        f"          const {ctype.compute} ka = keys[ia < n ? ia : 0], kb = keys[ib < n ? ib : 0];",
        f"          const bool other_first = {other_first};",
        "          if (((i & size) == 0) == other_first) {",
        "            order[i] = ib;",
        "            order[other] = ia;",
        "          }",
        "        }",
        "      }",
        "      __syncthreads();",
        "    }",
        "  }",
    ]
    for result, operand, rt in zip(op.results, op.operands, op.result_types, strict=True):
        body = ctx.body(pointers)
        x = body.value(operand, index("s"))
        at = linear(index("j"), t.extents)
        lines += [
            "  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {",
            "    const int64_t s = order[j];",
            *indent(indent(body.lines)),
            "    " + store(rt.dtype, pointers[result], at, x),
            "  }",
        ]
    lines += ["  __syncthreads();", "}"]
    return launches((ctx.kernel(pointers, lines, "(bitonic)"), min(rows, MAX_BLOCKS)))
