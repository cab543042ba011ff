"""The CPU kernels of attention: FlashAttention-2's blocked online softmax, in the shared C dialect.

Each kernel is C generated for one signature and one set of operand types (every extent and
stride is a constant, so any layout of the operands is read in place, and gcc unrolls and
vectorizes the block loops), handed to the CPU backend as a `KernelCall`
(`accy.kernel.c_kernel_call`), the same contract as a kernel of the kernel DSL.

- forward: for each (batch, query block), loop over key blocks keeping the running max `m`,
  the running sum `l` and the unnormalised output; write [O | m + log l].
- backward: recompute P = exp(S - lse) block by block; one loop over (batch, query block)
  accumulates dQ, another over (batch, key block) accumulates dK and dV, so each gradient row
  has one writer (no atomics). delta = rowsum(dO ∘ O) - dlse is recomputed per block.

Every buffer is a block: extra memory is O(block × block + block × dim) per thread, never
O(tokens × keys). Computation is in f32 (f64 for f64 operands; bf16 and f16 are converted as
they are loaded); the results are stored in the operands' dtype, rounded once, with the
logsumexp of a bf16/f16 row as hi + lo (see `composition.pack`). Parallel over batch × block
pairs with OpenMP, only while the backend's fork-safety flag (`accy_shared->parallel`) allows
it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from ..caches import memoized
from ..codegen.c.dialect import GCC
from ..core.types import TensorType, f64
from ..kernel.call import KernelCall
from ..kernel.handwritten import c_kernel_call
from .signature import (
    Shape,
    Signature,
    backward_type,
    check,
    element_strides,
    lse_slots,
    packed_type,
    stride_constants,
)

# Per-thread scratch stays below this: each block array lives on the thread's stack.
SCRATCH_BYTES = 256 * 1024
# Below this many multiply-adds a parallel region costs more than it saves.
PARALLEL_WORK = 1 << 21

PREAMBLE = r"""
#ifndef ACCY_ATTENTION_PREAMBLE
#define ACCY_ATTENTION_PREAMBLE
/* Inside a CPU program accy_shared->parallel says whether OpenMP may start threads (it is
   cleared in a child made by fork()); a kernel compiled on its own runs serially. */
#ifdef ACCY_CPU_SHARED
#define ACCY_ATTENTION_PARALLEL (accy_shared->parallel)
#else
#define ACCY_ATTENTION_PARALLEL 0
#endif
#define ACCY_MIN(a, b) ((a) < (b) ? (a) : (b))
#endif
"""


def kernel_factory(
    s: Signature, part: str
) -> Callable[[Sequence[TensorType], TensorType], KernelCall]:
    """The `kernels["cpu"]` entry of record `part` ("forward" or "backward") of `s`."""

    def factory(operand_types: Sequence[TensorType], result_type: TensorType) -> KernelCall | None:
        return _kernel(s, part, tuple(operand_types), result_type)

    return factory


@memoized("cpu attention kernels", "kernels_max_entries")
def _kernel(
    s: Signature, part: str, types: tuple[TensorType, ...], result: TensorType
) -> KernelCall:
    count = 3 if s.bias is None else 4
    shape = check(s, *types[:count])
    expected = packed_type(s, shape) if part == "forward" else backward_type(s, shape)
    assert result == expected, (result, expected)  # the record's type rule made it
    digest = hashlib.sha256(repr((s, part, types)).encode()).hexdigest()[:16]
    symbol = f"accy_kernel_attention_{part}_{digest}"
    names = ["q", "k", "v", "bias"][:count] + (["packed", "dpacked"] if part == "backward" else [])
    layout = _Layout(s, shape, dict(zip(names, types, strict=True)))
    body = (_forward if part == "forward" else _backward)(layout)
    parameters = [("dst", result), *zip(names, types, strict=True)]
    signature = ", ".join(
        f"{'' if name == 'dst' else 'const '}{GCC.c_type(t.dtype).storage} *p_{name}"
        for name, t in parameters
    )
    source = f"{PREAMBLE}\nvoid {symbol}({signature}) {{\n{body}}}\n"
    return c_kernel_call(
        target=s.target(part), version=1, symbol=symbol, parameters=parameters, source=source
    )


class _Layout:
    """Constants of the generated C: extents, strides of each operand, block sizes."""

    def __init__(self, s: Signature, shape: Shape, operands: dict[str, TensorType]):
        self.s, self.shape, self.operands = s, shape, operands
        self.t = "double" if shape.accumulation == f64 else "float"
        self.fn = "" if shape.accumulation == f64 else "f"
        self.scale = repr(s.scale_for(shape.dim))
        self.slots = lse_slots(shape.dtype)
        self.out = GCC.c_type(shape.dtype)  # the results are in the operands' dtype
        self.block = _block_size(shape.dim, shape.accumulation.itemsize)
        work = shape.batch_size * shape.tokens * shape.keys * shape.dim
        self.parallel = "ACCY_ATTENTION_PARALLEL" if work >= PARALLEL_WORK else "0"

    def stride(self, name: str, axis: str) -> int:
        # 0 for a bias without this axis: broadcast
        return element_strides(self.operands[name]).get(axis, 0)

    def load(self, name: str, index: str) -> str:
        ctype = GCC.c_type(self.operands[name].dtype)
        return f"(({self.t}){ctype.load.format(x=f'p_{name}[{index}]')})"

    def store(self, value: str) -> str:
        """C converting the computed `value` to the results' dtype (rounding 16-bit ones)."""
        return self.out.store.format(x=f"({value})")

    def lse(self, name: str, row: str) -> str:
        """C reading the logsumexp of a packed row (`row` its offset in `name`): hi + lo in
        bf16/f16; of the cotangent `dpacked`, hi alone (see `composition.pack`)."""
        parts = 2 if self.slots > 1 and name == "packed" else 1
        return " + ".join(self.load(name, f"{row} + D + {i}") for i in range(parts))

    def offsets(self, names: Sequence[str]) -> str:
        """C declaring `o_<name>`, the offset of batch entry `b` in each operand."""
        lines = ["int64_t rest = b; (void)rest;"]
        lines += [f"int64_t o_{n} = 0;" for n in names]
        for axis, extent in reversed(self.shape.batch):
            lines.append(f"{{ const int64_t at = rest % {extent}; rest /= {extent};")
            lines += [f"  o_{n} += at * {self.stride(n, axis)};" for n in names]
            lines.append("}")
        return "\n".join(f"      {line}" for line in lines) + "\n"

    def scores(self, q: str, rows: str, cols: str) -> str:
        """C filling s[i][j] with the scaled, biased, masked scores of the block pair at rows
        i0.., cols j0.. (`q` the loaded query block, `kt` the key block transposed)."""
        s, bias = self.s, self.s.bias is not None
        lines = [
            f"for (int64_t i = 0; i < {rows}; ++i) {{",
            f"  for (int64_t j = 0; j < {cols}; ++j) s[i][j] = 0;",
            "  for (int64_t d = 0; d < D; ++d) {",
            f"    const {self.t} x = {q}[i][d];",
            f"    for (int64_t j = 0; j < {cols}; ++j) s[i][j] += x * kt[d][j];",
            "  }",
            f"  for (int64_t j = 0; j < {cols}; ++j) {{",
            "    s[i][j] *= SCALE;",
        ]
        if bias:
            index = (
                f"o_bias + (i0 + i) * {self.stride('bias', s.query_axis)} + "
                f"(j0 + j) * {self.stride('bias', s.key_axis)}"
            )
            lines.append(f"    s[i][j] += {self.load('bias', index)};")
        if s.causal:
            lines.append("    if (j0 + j > i0 + i) s[i][j] = -INFINITY;")
        lines += ["  }", "}"]
        return "".join(f"        {line}\n" for line in lines)

    def constants(self) -> str:
        s, shape = self.s, self.shape
        values = {
            "NB": shape.batch_size,
            "TQ": shape.tokens,
            "TK": shape.keys,
            "D": shape.dim,
            "DP": shape.dim + self.slots,  # a packed row: output, then the logsumexp's slots
            "BQ": self.block,
            "BK": self.block,
            **stride_constants(s, self.operands),
        }
        lines = [f"  enum {{ {', '.join(f'{k} = {v}' for k, v in values.items())} }};"]
        lines.append(f"  const {self.t} SCALE = {self.scale};")
        lines.append("  const int64_t NQB = (TQ + BQ - 1) / BQ, NKB = (TK + BK - 1) / BK;")
        lines.append("  (void)NQB; (void)NKB;")
        return "\n".join(lines) + "\n"

    def key_end(self) -> str:
        """The end of the keys that query block i0.. (nq rows) attends to."""
        return "ACCY_MIN(TK, i0 + nq)" if self.s.causal else "TK"


def _block_size(dim: int, itemsize: int) -> int:
    block = 64
    # Eight block-sized arrays (the backward's) must fit the per-thread scratch.
    while block > 8 and itemsize * (6 * block * dim + 2 * block * block) > SCRATCH_BYTES:
        block //= 2
    return block


def _parallel(layout: _Layout) -> str:
    return (
        "#ifdef _OPENMP\n"
        f"#pragma omp parallel for collapse(2) schedule(dynamic, 1) if ({layout.parallel})\n"
        "#endif\n"
    )


def _forward(layout: _Layout) -> str:
    t, fn = layout.t, layout.fn
    names = ["q", "k", "v"] + (["bias"] if layout.s.bias is not None else [])
    return (
        layout.constants()
        + _parallel(layout)
        + f"""  for (int64_t b = 0; b < NB; ++b)
    for (int64_t qb = 0; qb < NQB; ++qb) {{
{layout.offsets(names)}      const int64_t i0 = qb * BQ, nq = ACCY_MIN(BQ, TQ - i0);
      const int64_t kend = {layout.key_end()};
      {t} q[BQ][D], kt[D][BK], v[BK][D], s[BQ][BK], o[BQ][D], m[BQ], l[BQ];
      for (int64_t i = 0; i < nq; ++i) {{
        m[i] = -INFINITY;
        l[i] = 0;
        for (int64_t d = 0; d < D; ++d) {{
          q[i][d] = {layout.load("q", "o_q + (i0 + i) * QT + d * QD")};
          o[i][d] = 0;
        }}
      }}
      for (int64_t j0 = 0; j0 < kend; j0 += BK) {{
        const int64_t nk = ACCY_MIN(BK, kend - j0);
        for (int64_t j = 0; j < nk; ++j)
          for (int64_t d = 0; d < D; ++d) {{
            kt[d][j] = {layout.load("k", "o_k + (j0 + j) * KT + d * KD")};
            v[j][d] = {layout.load("v", "o_v + (j0 + j) * VT + d * VD")};
          }}
{layout.scores("q", "nq", "nk")}        for (int64_t i = 0; i < nq; ++i) {{
          {t} peak = m[i];
          for (int64_t j = 0; j < nk; ++j) peak = s[i][j] > peak ? s[i][j] : peak;
          if (peak == -INFINITY) continue; /* every key so far is masked */
          const {t} correction = exp{fn}(m[i] - peak);
          /* Two loops: the first vectorizes (libmvec's exp), a sum in order would stop it. */
          for (int64_t j = 0; j < nk; ++j) s[i][j] = exp{fn}(s[i][j] - peak);
          {t} total = 0;
          for (int64_t j = 0; j < nk; ++j) total += s[i][j];
          l[i] = l[i] * correction + total;
          m[i] = peak;
          for (int64_t d = 0; d < D; ++d) o[i][d] *= correction;
          for (int64_t j = 0; j < nk; ++j) {{
            const {t} p = s[i][j];
            for (int64_t d = 0; d < D; ++d) o[i][d] += p * v[j][d];
          }}
        }}
      }}
      {layout.out.storage} *out = p_dst + (b * TQ + i0) * DP;
      for (int64_t i = 0; i < nq; ++i) {{
        const {t} inverse = 1 / l[i];
        for (int64_t d = 0; d < D; ++d) out[i * DP + d] = {layout.store("o[i][d] * inverse")};
        const {t} lse = m[i] + log{fn}(l[i]);
{_store_lse(layout)}      }}
    }}
"""
    )


def _store_lse(layout: _Layout) -> str:
    """C storing `lse` into the packed row at `out + i * DP`: one entry in f32/f64; in
    bf16/f16 hi (lse rounded), lo (the rest, rounded) and zeros (see `composition.pack`)."""
    at = "out[i * DP + D"
    if layout.slots == 1:
        return f"        {at}] = lse;\n"
    high = f"{at}]"
    lines = [
        f"{high} = {layout.store('lse')};",
        f"{at} + 1] = {layout.store(f'lse - {layout.out.load.format(x=high)}')};",
        f"for (int64_t z = 2; z < {layout.slots}; ++z) {at} + z] = {layout.store('0.0f')};",
    ]
    return "".join(f"        {line}\n" for line in lines)


def _backward(layout: _Layout) -> str:
    t, fn = layout.t, layout.fn
    names = ["q", "k", "v"] + (["bias"] if layout.s.bias is not None else [])
    rows = "(TQ + 2 * TK) * D"  # per batch entry: rows [dQ; dK; dV]
    # Loads the query block's q, dO, lse and delta (rows i0.., nq of them).
    query_block = f"""
        for (int64_t i = 0; i < nq; ++i) {{
          const int64_t row = (b * TQ + i0 + i) * DP;
          {t} dot = 0;
          for (int64_t d = 0; d < D; ++d) {{
            q[i][d] = {layout.load("q", "o_q + (i0 + i) * QT + d * QD")};
            dout[i][d] = {layout.load("dpacked", "row + d")};
            dot += dout[i][d] * {layout.load("packed", "row + d")};
          }}
          lse[i] = {layout.lse("packed", "row")};
          delta[i] = dot - ({layout.lse("dpacked", "row")});
        }}
"""
    key_block = f"""
        for (int64_t j = 0; j < nk; ++j)
          for (int64_t d = 0; d < D; ++d) {{
            kt[d][j] = {layout.load("k", "o_k + (j0 + j) * KT + d * KD")};
            vt[d][j] = {layout.load("v", "o_v + (j0 + j) * VT + d * VD")};
          }}
"""
    # s becomes P, dp becomes dS.
    probabilities = f"""{layout.scores("q", "nq", "nk")}        for (int64_t i = 0; i < nq; ++i) {{
          for (int64_t j = 0; j < nk; ++j) {{
            s[i][j] = exp{fn}(s[i][j] - lse[i]); /* a masked score is -inf: P = 0 */
            dp[i][j] = 0;
          }}
          for (int64_t d = 0; d < D; ++d) {{
            const {t} x = dout[i][d];
            for (int64_t j = 0; j < nk; ++j) dp[i][j] += x * vt[d][j];
          }}
          for (int64_t j = 0; j < nk; ++j) dp[i][j] = s[i][j] * (dp[i][j] - delta[i]);
        }}
"""
    declarations = (
        f"      {t} q[BQ][D], dout[BQ][D], lse[BQ], delta[BQ], kt[D][BK], vt[D][BK], "
        f"s[BQ][BK], dp[BQ][BK];\n"
    )
    return (
        layout.constants()
        + _parallel(layout)
        + f"""  for (int64_t b = 0; b < NB; ++b)
    for (int64_t qb = 0; qb < NQB; ++qb) {{
{layout.offsets(names)}      const int64_t i0 = qb * BQ, nq = ACCY_MIN(BQ, TQ - i0);
      const int64_t kend = {layout.key_end()};
{declarations}      {t} k[BK][D], dq[BQ][D];
{query_block}
        for (int64_t i = 0; i < nq; ++i)
          for (int64_t d = 0; d < D; ++d) dq[i][d] = 0;
      for (int64_t j0 = 0; j0 < kend; j0 += BK) {{
        const int64_t nk = ACCY_MIN(BK, kend - j0);
{key_block}        for (int64_t j = 0; j < nk; ++j)
          for (int64_t d = 0; d < D; ++d) k[j][d] = kt[d][j];
{probabilities}        for (int64_t i = 0; i < nq; ++i)
          for (int64_t j = 0; j < nk; ++j) {{
            const {t} x = dp[i][j];
            for (int64_t d = 0; d < D; ++d) dq[i][d] += x * k[j][d];
          }}
      }}
      {layout.out.storage} *out = p_dst + b * {rows} + i0 * D;
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t d = 0; d < D; ++d) out[i * D + d] = {layout.store("dq[i][d] * SCALE")};
    }}
"""
        + _parallel(layout)
        + f"""  for (int64_t b = 0; b < NB; ++b)
    for (int64_t kb = 0; kb < NKB; ++kb) {{
{layout.offsets(names)}      const int64_t j0 = kb * BK, nk = ACCY_MIN(BK, TK - j0);
{declarations}      {t} dk[BK][D], dv[BK][D];
{key_block}      for (int64_t j = 0; j < nk; ++j)
        for (int64_t d = 0; d < D; ++d) dk[j][d] = dv[j][d] = 0;
      /* Causal: query blocks ending at or before j0 see none of these keys. */
      for (int64_t i0 = {"(j0 / BQ) * BQ" if layout.s.causal else "0"}; i0 < TQ; i0 += BQ) {{
        const int64_t nq = ACCY_MIN(BQ, TQ - i0);
{query_block}{probabilities}        for (int64_t i = 0; i < nq; ++i)
          for (int64_t j = 0; j < nk; ++j) {{
            const {t} p = s[i][j], ds = dp[i][j];
            for (int64_t d = 0; d < D; ++d) {{
              dv[j][d] += p * dout[i][d];
              dk[j][d] += ds * q[i][d];
            }}
          }}
      }}
      {layout.out.storage} *dk_out = p_dst + b * {rows} + (TQ + j0) * D;
      {layout.out.storage} *dv_out = dk_out + TK * D;
      for (int64_t j = 0; j < nk; ++j)
        for (int64_t d = 0; d < D; ++d) {{
          dk_out[j * D + d] = {layout.store("dk[j][d] * SCALE")};
          dv_out[j * D + d] = {layout.store("dv[j][d]")};
        }}
    }}
"""
    )
