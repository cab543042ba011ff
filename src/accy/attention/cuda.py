"""Attention on CUDA: cuDNN's fused attention (SDPA) for bf16 and f16, inside the program's graph.

The kernel function of each record returns a `KernelCall` whose `library` is a `CudnnAttention`
(an `accy.kernel.call.LibraryStep`): the CUDA backend gives it fixed addresses and scratch, and
it enqueues its work on the capturing stream, so it runs inside the per-invocation CUDA graph.

The records' results are in the operands' dtype, so cuDNN reads and writes them in place:

- forward: cuDNN's SDPA writes O straight into the record's result [O | hi | lo | zeros]
  (rows strided by dim + 8) and Stats (f32, the row's natural-log logsumexp of the scaled,
  biased, masked scores: the same as the record's) into scratch; a rows-sized kernel
  (`split_stats`) writes each row's hi, lo and zeros.
- backward: a rows-sized kernel (`prepare_backward`) makes Stats = hi + lo; cuDNN's SDPA
  backward reads O and dO in place from `packed` and `dpacked` and writes dQ, dK and dV in
  place into the record's result (rows [dQ; dK; dV]). cuDNN takes no cotangent of the
  logsumexp (`dlse`, zero unless something uses the lse itself, as second derivatives do):
  cuDNN reads O only for delta = rowsum(dO ∘ O), so a nonzero `dlse` is folded into O at the
  row's largest |dO| entry, O[m] -= dlse / dO[m], in `packed` itself, and put back by
  `restore_output` after cuDNN (the program's actions run in order on one stream, so nothing
  else reads `packed` in between; exact when dlse is 0; a row whose dO is all zero with a
  nonzero dlse gives NaN, loudly).

Operands are read in place: the batch axes (in the query's order) are collapsed into cuDNN's
(b, h) dims where their strides allow, the query/key axis is s and the dim axis d, so any layout
whose dim axis is innermost needs no copy. When the program is compiled (the kernel function
is called then), cuDNN plans each graph and says whether it supports it (validate to
check_support); the chosen plan is built when the program's fragment loads (`Issuer`), while
NVRTC compiles the generated kernels in other threads, and its workspace is the issuer's own
buffer: building the plans (1.1 s for GPT-2's forward and backward on a fresh H200 host) is
then off a cold start's critical path, and the compiled fragment does not depend on which
plan cuDNN picks. Both are cached per problem (shapes, strides, dtype, causal, scale, bias
layout). The kernel function declines, and the composition runs instead, for f32/f64, without
`cudnn` (`nvidia-cudnn-frontend`) or a GPU, with `ACCY_CUDNN_ATTENTION=0`, for layouts it cannot
map, and whenever cuDNN does not support the graph; `decline_reasons()` says why, and every
step of building a graph is logged (logger `accy.attention.cuda`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..backends.cuda import binaries
from ..backends.cuda import cudnn as cudnn_library
from ..backends.cuda.cudnn import ALIGN, Built, Decline, handle
from ..caches import memoized
from ..codegen.c.dialect import CUDA
from ..config import config
from ..core.types import TensorType, bf16, f16
from ..errors import ConfigurationError
from ..kernel.call import KernelCall
from .signature import Signature, backward_type, check, element_strides, packed_type

log = logging.getLogger("accy.attention.cuda")
# Planned graphs per problem, and why cuDNN declined calls; built graphs per problem (`_plan`
# and `_build` are defined below).
_GRAPHS = cudnn_library.Graphs("attention", lambda problem: _plan(problem))
_BUILT = cudnn_library.Graphs("attention plan", lambda problem: _build(problem))


def decline_reasons() -> dict[str, str]:
    """Why cuDNN attention declined, per problem (its description), since the process started.

    >>> isinstance(decline_reasons(), dict)
    True
    """
    return _GRAPHS.reasons()


@dataclass(frozen=True)
class Settings:
    """How accy configures cuDNN's attention graphs (the alternatives `bench/attention_probe.py`
    times side by side on a GPU; `configure` switches them for graphs built afterwards).

    - `mask`: how `causal` is spelled: "causal_mask" (`use_causal_mask`, what PyTorch and XLA
      pass) or "band" (`diagonal_band_right_bound=0`, top-left aligned: the frontend's
      preferred spelling of the same mask);
    - `heuristics`: cuDNN's heuristic modes asked for engine configurations, in order;
    - `plan`: "heuristic" (the first plan that builds, as PyTorch and XLA do) or "fastest"
      (every plan is built and run a few times when the program is compiled; the fastest is
      kept);
    - `deterministic`: the backward's `use_deterministic_algorithm`;
    - `min_blocks`: cuDNN runs one thread block per 128 rows of each (batch, head); a long
      sequence (1,024 tokens or more) that makes fewer blocks than this leaves most of the GPU
      idle, while the composition's GEMMs use all of it, so such calls can be composed
      instead. Default 0 (never declines for this), or `$ACCY_CUDNN_MIN_BLOCKS`: on the H200,
      the `attention` workload's one head of 2,048 tokens with a bias (16 blocks on 132 SMs)
      took 166 us a step through cuDNN and 197 us composed (`tools/gpt2_profile.py
      --workload attention`).

    >>> Settings().plan, Settings(plan="fastest").plan
    ('heuristic', 'fastest')
    """

    mask: str = "causal_mask"
    heuristics: tuple[str, ...] = ("A", "FALLBACK")
    plan: str = "heuristic"
    deterministic: bool = False
    min_blocks: int = field(default_factory=lambda: config.cudnn_min_blocks)


LONG_SEQUENCE = 1024  # tokens from which `Settings.min_blocks` applies
ROWS_PER_BLOCK = 128


MASKS = ("causal_mask", "band")
PLANS = ("heuristic", "fastest")
HEURISTIC_MODES = ("A", "B", "FALLBACK")
_SETTINGS = [Settings()]


def settings() -> Settings:
    """The settings graphs are built with now.

    >>> settings().mask in MASKS
    True
    """
    return _SETTINGS[0]


def configure(new: Settings) -> Settings:
    """Build cuDNN attention graphs with `new` from now on (programs compiled before keep
    theirs: the settings are part of each graph's cache key); returns the previous settings.

    >>> previous = configure(Settings(plan="fastest"))
    >>> settings().plan
    'fastest'
    >>> configure(previous).plan
    'fastest'
    """
    _check_settings(new)
    previous, _SETTINGS[0] = _SETTINGS[0], new
    return previous


def _check_settings(new: Settings) -> None:
    if not isinstance(new, Settings):
        raise ConfigurationError(
            f"cuDNN attention settings must be an accy.attention.cuda.Settings, got {new!r}"
        )
    if new.mask not in MASKS:
        raise ConfigurationError(
            f"cuDNN attention settings: mask {new.mask!r} is not one of {', '.join(MASKS)}"
        )
    if new.plan not in PLANS:
        raise ConfigurationError(
            f"cuDNN attention settings: plan {new.plan!r} is not one of {', '.join(PLANS)}"
        )
    unknown = [m for m in new.heuristics if m not in HEURISTIC_MODES]
    if not new.heuristics or unknown or isinstance(new.heuristics, str):
        raise ConfigurationError(
            f"cuDNN attention settings: heuristics {new.heuristics!r} must be a non-empty tuple "
            f"of {', '.join(HEURISTIC_MODES)}"
        )
    if not isinstance(new.deterministic, bool):
        raise ConfigurationError(
            f"cuDNN attention settings: deterministic must be True or False, got "
            f"{new.deterministic!r}"
        )
    if (
        isinstance(new.min_blocks, bool)
        or not isinstance(new.min_blocks, int)
        or new.min_blocks < 0
    ):
        raise ConfigurationError(
            f"cuDNN attention settings: min_blocks must be a whole number of thread blocks, 0 "
            f"or more, got {new.min_blocks!r}"
        )


def kernel_factory(
    s: Signature, part: str
) -> Callable[[Sequence[TensorType], TensorType], KernelCall | None]:
    """The `kernels["cuda"]` entry of record `part` ("forward" or "backward") of `s`: a cuDNN
    step for bf16/f16 operands cuDNN supports, else None (the composition)."""

    def factory(operand_types: Sequence[TensorType], result_type: TensorType) -> KernelCall | None:
        return _kernel(s, part, tuple(operand_types), result_type, settings())

    return factory


@memoized("cudnn attention kernels", "kernels_max_entries")
def _kernel(
    s: Signature,
    part: str,
    types: tuple[TensorType, ...],
    result: TensorType,
    chosen: Settings,
) -> KernelCall | None:
    where = f"{s.target(part)} on ({', '.join(map(str, types))})"
    try:
        problem = describe(s, part, types, chosen)
        planned(problem)
    except Decline as why:
        _GRAPHS.decline(where, str(why))
        return None
    except Exception as error:  # an unexpected failure declines too, with its traceback logged
        _GRAPHS.decline(where, f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        return None
    step = CudnnAttention(problem)
    names = list(problem.operand_names)
    names += ["packed", "dpacked"] if part == "backward" else []
    parameters = [("dst", result), *zip(names, types, strict=True)]
    digest = hashlib.sha256(repr(problem).encode()).hexdigest()[:16]
    symbol = f"accy_cudnn_attention_{part}_{digest}"
    log.info("cuDNN attention %s: using %s", where, symbol)
    return KernelCall.of_library(
        s.target(part), symbol, parameters, f"cuDNN SDPA {part} {problem.summary}", step
    )


# -- the problem: cuDNN's dims and strides of every operand --------------------------------------


ELEMENT_BYTES = 2  # every dtype a Problem holds (bf16, f16): cuDNN runs no other here


@dataclass(frozen=True)
class Problem:
    """One cuDNN attention graph: (b, h, s, d) dims and element strides of each tensor."""

    part: str  # "forward" or "backward"
    dtype: str  # "bf16" or "f16"
    b: int
    h: int
    tokens: int
    keys: int
    dim: int
    q: tuple[int, int, int, int]  # strides of (b, h, s, d)
    k: tuple[int, int, int, int]
    v: tuple[int, int, int, int]
    bias: tuple[tuple[int, int], ...] | None  # (extent, stride) of (b, h, s_q, s_kv)
    o: tuple[int, int, int, int]  # strides of O (dO) in the forward's result (its cotangent)
    grads: tuple[int, int, int, int]  # strides of dQ (dK, dV) in the backward's result
    causal: bool
    scale: float
    settings: Settings = Settings()
    # Each query sequence cut into this many chunks, given to cuDNN as query heads that share
    # the key/value head (grouped-query attention): see `query_chunks`.
    chunks: int = 1
    # Nonzero: q, k and v are one stacked operand, entries 0, 1, 2 this many elements apart,
    # and the backward's result is its gradient (dQ, dK, dV as far apart, strided as q).
    part_stride: int = 0
    # Grouped-query attention: this many key/value heads (0: as many as query heads, h), each
    # shared by h / kv_heads consecutive query heads.
    kv_heads: int = 0
    # Where the backward writes dQ, dK and dV when they are not rows of one layout: (element
    # offset, strides of (b, h, s, d)) of each, in a result of `result_size` elements.
    gradient_layout: tuple[tuple[int, tuple[int, int, int, int]], ...] | None = None
    result_size: int = 0

    @property
    def key_heads(self) -> int:
        """Key/value heads: `kv_heads`, or h."""
        return self.kv_heads or self.h

    @property
    def has_bias(self) -> bool:
        return self.bias is not None

    def graph_dims(self) -> dict[str, tuple[list[int], list[int]]]:
        """(dims, strides) of each of the graph's (b, h, s, d) tensors, the query side's
        (q, o, dq, stats and the bias) with its chunks as heads."""
        c, rows = self.chunks, self.tokens // self.chunks

        def chunked(strides: Sequence[int]) -> list[int]:
            b, h, s, d = strides
            return [b, h if c == 1 else rows * s, s, d]

        q_dims = [self.b, self.h * c, rows, self.dim]
        k_dims = [self.b, self.key_heads, self.keys, self.dim]
        grads = [self.grads] * 3
        if self.gradient_layout is not None:
            grads = [strides for _, strides in self.gradient_layout]
        dims = {
            "q": (q_dims, chunked(self.q)),
            "k": (k_dims, list(self.k)),
            "v": (k_dims, list(self.v)),
            "o": (q_dims, chunked(self.o)),
            "dq": (q_dims, chunked(grads[0])),
            "dk": (k_dims, list(grads[1])),
            "dv": (k_dims, list(grads[2])),
            "stats": ([self.b, self.h * c, rows, 1], [self.h * self.tokens, rows, 1, 1]),
        }
        if self.bias is not None:
            (b, sb), (h, sh), (_, sq), (keys, sk) = self.bias
            head = (h, sh) if c == 1 else (c, rows * sq)
            dims["bias"] = ([b, head[0], rows, keys], [sb, head[1], sq, sk])
        return dims

    @property
    def summary(self) -> str:
        return (
            f"[b={self.b} h={self.h}{f' h_kv={self.kv_heads}' if self.kv_heads else ''} "
            f"s_q={self.tokens} s_kv={self.keys} d={self.dim} "
            f"{self.dtype}{' causal' if self.causal else ''}{' bias' if self.has_bias else ''} "
            f"scale={self.scale:.6g}{f' chunks={self.chunks}' if self.chunks > 1 else ''}]"
        )

    @property
    def packed_row(self) -> int:
        """Entries of a row of the forward's result: dim, then the logsumexp's slots."""
        return self.o[2]

    @property
    def rows(self) -> int:
        """Query rows: b h s_q."""
        return self.b * self.h * self.tokens

    def gradient_offsets(self) -> tuple[int, int, int]:
        """Element offsets of dQ, dK and dV in the backward's result (rows [dQ; dK; dV] of
        each batch entry)."""
        if self.gradient_layout is not None:
            return tuple(offset for offset, _ in self.gradient_layout)
        if self.part_stride:
            return 0, self.part_stride, 2 * self.part_stride
        row = self.grads[2]
        return 0, self.tokens * row, (self.tokens + self.keys) * row

    def operand_pointers(self, operands: Sequence[int]) -> dict[str, int]:
        """The addresses of q, k, v (and the bias) from the step's operand addresses."""
        if self.part_stride:
            step = ELEMENT_BYTES * self.part_stride  # bytes from one entry to the next
            return {n: operands[0] + j * step for j, n in enumerate("qkv")}
        names = ["q", "k", "v", "bias"][: 3 + self.has_bias]
        return dict(zip(names, operands[: 3 + self.has_bias], strict=True))

    @property
    def operand_names(self) -> list[str]:
        """The step's operands before the backward's packed and dpacked."""
        if self.part_stride:
            return ["qkv"]
        return ["q", "k", "v", "bias"][: 3 + self.has_bias]

    def buffers(self) -> dict[str, int]:
        """Bytes of each buffer the step keeps in its scratch: the f32 Stats, and in the
        backward each row's folded logsumexp cotangent (see `HELPERS`)."""
        sizes = {"stats": self.rows * 4}
        if self.part == "backward":
            sizes["fold"] = self.rows * 4
        return sizes

    def offsets(self) -> tuple[dict[str, int], int]:
        """(byte offset of each buffer in the step's scratch, where they end), ALIGN-aligned."""
        offsets, at = {}, 0
        for name, size in self.buffers().items():
            offsets[name] = at
            at += -(-size // ALIGN) * ALIGN
        return offsets, at


def _group(t: TensorType, axes: Sequence[str], what: str) -> tuple[int, int]:
    """(extent, stride) of `axes` of `t` as one dimension, or `Decline` if their strides
    cannot be merged (they must be adjacent in `t`, in this order)."""
    strides = element_strides(t)
    present = [a for a in axes if t.has(a)]
    if not present:
        return 1, 0
    if len(present) != len(axes):
        raise Decline(f"the {what} {t} has some but not all of the batch axes {axes} of a group")
    for outer, inner in zip(present, present[1:], strict=False):
        if strides[outer] != strides[inner] * t.extent(inner):
            raise Decline(f"the batch axes {axes} of the {what} {t} are not adjacent")
    return math.prod(t.extent(a) for a in present), strides[present[-1]]


def _batch_groups(s: Signature, operands: dict[str, TensorType]) -> tuple[tuple[str, ...], ...]:
    """The query's batch axes (extent 1 left out) split into cuDNN's (b, h): two runs in the
    query's order that every operand can merge."""
    q = operands["q"]
    axes = [a for a in s.batch_axes if q.extent(a) != 1]
    if len(axes) <= 2:
        return (*[()] * (2 - len(axes)), *[(a,) for a in axes])
    for split in range(1, len(axes)):
        groups = (tuple(axes[:split]), tuple(axes[split:]))
        try:
            for name, t in operands.items():
                for group in groups:
                    _group(t, group, name)
        except Decline:
            continue
        return groups
    raise Decline(f"the batch axes {axes} cannot be merged into two dims in every operand")


def _dense_when_single(dims: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """`strides` with those of extent-1 dims (0 when no batch axis makes them) set as if the
    tensor were dense there: the result tensors keep the nonzero strides they always had.

    >>> _dense_when_single((1, 1, 8, 4), (0, 0, 4, 1))
    (32, 32, 4, 1)
    """
    span = max(d * x for d, x in zip(dims, strides, strict=True))
    return tuple(span if d == 1 and x == 0 else x for d, x in zip(dims, strides, strict=True))


def describe(
    s: Signature, part: str, types: Sequence[TensorType], chosen: Settings | None = None
) -> Problem:
    """The cuDNN problem of a call (dims and strides, read in place), or `Decline`; built
    with the settings `chosen` (default: `settings()`). `s` may be a stacked signature
    (`qkv.QkvSignature`: one operand holding q, k and v along its part axis), read in place
    too, its gradient written into d(qkv).

    >>> from accy import spec, bf16
    >>> s = Signature(("batch", "token", "head", "dim"), ("batch", "key", "head", "dim"),
    ...               ("batch", "key", "head", "dim"), causal=True)
    >>> q = spec(bf16, batch=2, token=8, head=3, dim=16)
    >>> kv = spec(bf16, batch=2, key=8, head=3, dim=16)
    >>> p = describe(s, "forward", [q, kv, kv])
    >>> p.b, p.h, p.q
    (2, 3, (384, 16, 48, 1))
    """
    if not config.cudnn_attention:
        raise Decline("switched off (accy.config.cudnn_attention, ACCY_CUDNN_ATTENTION=0)")
    if getattr(s, "groups", None):
        return _describe_grouped(s, part, types, chosen)
    split = getattr(s, "split", None)
    if split is None:
        count = 3 if s.bias is None else 4
        names = ["q", "k", "v", "bias"][:count]
        operands = dict(zip(names, types[:count], strict=True))
        rows = {"q": s.query_axis, "k": s.key_axis, "v": s.key_axis}
        return _describe(s, part, operands, operands, rows, chosen)
    qkv = types[0]
    operands = dict(zip("qkv", s.split_types(qkv), strict=True))
    # Each of q, k and v is read from the stacked operand, its rows along the query axis.
    return _describe(
        split,
        part,
        operands,
        dict.fromkeys("qkv", qkv),
        dict.fromkeys("qkv", s.query_axis),
        chosen,
        part_axis=s.part_axis,
    )


def _describe(
    s: Signature,
    part: str,
    operands: dict[str, TensorType],
    views: dict[str, TensorType],
    rows: dict[str, str],
    chosen: Settings | None,
    part_axis: str | None = None,
    kv_without: tuple[str, ...] = (),
) -> Problem:
    """`describe` of the operands' types `operands` (q, k, v[, bias]) read through `views`
    (the types their memory has: themselves, or the stacked operand) with the rows of each
    along `rows`; with `part_axis`, q, k and v are entries 0, 1, 2 of it in every view and the
    backward's result is laid out as the stacked operand."""
    shape = check(s, *operands.values())
    if shape.dtype not in (bf16, f16):
        raise Decline(f"cuDNN's fused attention needs bf16 or f16, not {shape.dtype.name}")
    if shape.tokens == 0 or shape.keys == 0 or shape.dim == 0 or shape.batch_size == 0:
        raise Decline("an empty operand")
    if kv_without:  # the query's (b, h); the key and value lack the group axes of its h
        groups = _batch_groups(s, {"q": views["q"]})
        if kv_without != groups[1][len(groups[1]) - len(kv_without) :]:
            raise Decline(
                f"the group axes {kv_without} are not the innermost of the query's head axes "
                f"{groups[1]} (cuDNN shares each key/value head among consecutive query heads)"
            )
    else:
        groups = _batch_groups(s, {n: views[n] for n in "qkv"})
    kv_groups = (groups[0], groups[1][: len(groups[1]) - len(kv_without)])
    dims: dict[str, tuple[int, int, int, int]] = {}
    for name in ("q", "k", "v"):
        t = views[name]
        strides = element_strides(t)
        (b, sb), (h, sh) = (_group(t, g, name) for g in (groups if name == "q" else kv_groups))
        if strides[s.dim_axis] != 1:
            raise Decline(
                f"the {name} {t} does not have the dim axis {s.dim_axis!r} innermost "
                "(cuDNN reads rows of dim contiguous values)"
            )
        dims[name] = (sb, sh, strides[rows[name]], 1)
    q_type = operands["q"]
    b = math.prod(q_type.extent(a) for a in groups[0]) if groups[0] else 1
    h = math.prod(q_type.extent(a) for a in groups[1]) if groups[1] else 1
    chosen = settings() if chosen is None else chosen
    _check_parallelism(b * h, shape.tokens, chosen.min_blocks)
    bias = None
    if "bias" in operands:
        t = operands["bias"]
        if not (t.has(s.query_axis) and t.has(s.key_axis)):
            raise Decline(f"the bias {t} lacks the query or the key axis (cuDNN needs both)")
        strides = element_strides(t)
        bias = (
            _group(t, groups[0], "bias"),
            _group(t, groups[1], "bias"),
            (shape.tokens, strides[s.query_axis]),
            (shape.keys, strides[s.key_axis]),
        )
    packed = packed_type(s, shape)
    o = (
        *(_group(packed, g, "result")[1] for g in groups),
        element_strides(packed)[s.query_axis],
        1,
    )
    part_stride = 0
    if part_axis is None:
        result = backward_type(s, shape)
        grads = (*(_group(result, g, "result")[1] for g in groups), shape.dim, 1)
    else:  # d(qkv): dQ, dK and dV with the stacked operand's strides, entries of its part axis
        grads = dims["q"]
        part_stride = element_strides(views["q"])[part_axis]
    o, grads = (_dense_when_single((b, h, shape.tokens, shape.dim), x) for x in (o, grads))
    chunks = query_chunks(b, h, shape.tokens, s.causal)
    kv_heads = math.prod(q_type.extent(a) for a in kv_groups[1]) if kv_without else 0
    return Problem(
        part,
        shape.dtype.name,
        b,
        h,
        shape.tokens,
        shape.keys,
        shape.dim,
        dims["q"],
        dims["k"],
        dims["v"],
        bias,
        o,
        grads,
        s.causal,
        s.scale_for(shape.dim),
        chosen,
        chunks,
        part_stride,
        kv_heads,
    )


def _describe_grouped(
    s: Any, part: str, types: Sequence[TensorType], chosen: Settings | None
) -> Problem:
    """`describe` of grouped-query attention (`grouped.GroupedSignature`): the key and value
    lack the query's group axes and are read in place with their own heads (cuDNN's h_k);
    the backward writes dQ, dK and dV in the operands' own layouts, one after another in each
    block of its result (`grouped.backward_type`)."""
    from dataclasses import replace

    q, k, v = types[:3]
    operands = {"q": q, "k": s.broadcast_type(k, q), "v": s.broadcast_type(v, q)}
    views = {"q": q, "k": k, "v": v}
    rows = {"q": s.query_axis, "k": s.key_axis, "v": s.key_axis}
    problem = _describe(s.split, part, operands, views, rows, chosen, kv_without=s.groups)
    blocks, block = s.result_blocks(q, k, v)
    if blocks > 1 and (problem.b != blocks or problem.q[0] != q.size // blocks):
        raise Decline(f"the query {q}'s batch dims do not lie as the result's blocks")
    layout, at = [], 0
    for t, strides in ((q, problem.q), (k, problem.k), (v, problem.v)):
        layout.append((at, (block if blocks > 1 else strides[0], *strides[1:])))
        at += t.size // blocks
    layout = [
        (offset, _dense_when_single(dims, x))
        for (offset, x), dims in zip(
            layout,
            [(problem.b, problem.h, problem.tokens, problem.dim)]
            + [(problem.b, problem.key_heads, problem.keys, problem.dim)] * 2,
            strict=True,
        )
    ]
    return replace(problem, gradient_layout=tuple(layout), result_size=blocks * block)


CHUNKED_HEADS = 128  # query chunks are made until batch x chunks reaches this


def query_chunks(b: int, h: int, tokens: int, causal: bool) -> int:
    """Into how many chunks to cut each query sequence of a single-head call (b batch entries,
    h = 1 head), each chunk a query head of its own sharing the key/value head.

    cuDNN's backward runs a thread block per 128 keys of each (batch, query head), its forward
    one per 128 queries: one long head keeps a few of the GPU's 132 SMs busy. As grouped-query
    heads the chunks multiply that, and cuDNN sums dK and dV over them. On the H200, one head
    of 2,048 tokens with a bias (the `attention` workload): forward 53 -> 39 us, backward
    90 -> 44 us with 16 chunks of 128 rows (cuDNN's graphs timed alone). Chunks
    halve while each keeps at least 128 rows; never with a causal mask (its diagonal is the
    whole sequence's, not each chunk's) or several heads.

    >>> query_chunks(1, 1, 2048, False), query_chunks(8, 1, 1024, False)
    (16, 8)
    >>> query_chunks(1, 1, 2048, True), query_chunks(8, 12, 1024, False)
    (1, 1)
    """
    if causal or h != 1:
        return 1
    chunks = 1
    while (
        b * chunks < CHUNKED_HEADS
        and tokens % (2 * chunks) == 0
        and tokens // (2 * chunks) >= ROWS_PER_BLOCK
    ):
        chunks *= 2
    return chunks


def _check_parallelism(rows: int, tokens: int, min_blocks: int) -> None:
    """Decline a long sequence over too few (batch, head) rows to fill the GPU (see
    `Settings.min_blocks`).

    >>> _check_parallelism(96, 1024, 64)  # GPT-2 small: 8 x 12 heads, 768 blocks
    >>> try:
    ...     _check_parallelism(1, 2048, 64)
    ... except Decline as why:
    ...     print(str(why)[:60])
    1 batch x head row(s) of 2048 tokens make 16 blocks of 128 r
    """
    blocks = rows * -(-tokens // ROWS_PER_BLOCK)
    if tokens >= LONG_SEQUENCE and blocks < min_blocks:
        raise Decline(
            f"{rows} batch x head row(s) of {tokens} tokens make {blocks} blocks of "
            f"{ROWS_PER_BLOCK} rows, fewer than Settings.min_blocks={min_blocks}: most of the "
            "GPU would idle (composed instead)"
        )


# -- cuDNN graphs, built once per problem ---------------------------------------------------------


def planned(problem: Problem) -> Built:
    """The graph of `problem` planned, its support checked, its plan not built yet (its
    `workspace` unknown: 0); cached. `Decline` with cuDNN's reason when it does not support
    it."""
    return _GRAPHS.built(problem, f"{problem.part} {problem.summary}")


def built(problem: Problem) -> Built:
    """The graph of `problem` with its plan built and its workspace size (on first use, then
    cached), or `Decline` with cuDNN's reason."""
    return _BUILT.built(problem, f"{problem.part} {problem.summary} plan")


def _mask_options(p: Problem, cudnn: Any) -> dict[str, Any]:
    """The graph arguments of `p`'s causal mask in its settings' spelling (none without one)."""
    if not p.causal:
        return {}
    if p.settings.mask == "band":
        return dict(
            diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0
        )
    return dict(use_causal_mask=True)


def _plan(p: Problem) -> Built:
    """`p`'s graph through check_support: the ranked plans, and cuDNN's word that it can run."""
    cudnn = cudnn_library.module()
    h = handle(0)
    io = {"bf16": cudnn.data_type.BFLOAT16, "f16": cudnn.data_type.HALF}[p.dtype]
    options = dict(
        io_data_type=io,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=h,
    )
    try:
        graph = cudnn.pygraph(**options, is_cuda_graph_replay_expected=True)
    except TypeError:  # an older frontend without that statement
        graph = cudnn.pygraph(**options)
    log.info("cuDNN attention %s %s: building with %s", p.part, p.summary, p.settings)
    dims = p.graph_dims()

    def tensor(name: str, like: str | None = None, data_type: Any = io) -> Any:
        shape, strides = dims[like or name]
        return graph.tensor(name=name, dim=shape, stride=strides, data_type=data_type)

    t = {name: tensor(name) for name in ("q", "k", "v")}
    if p.bias is not None:
        t["bias"] = tensor("bias")
    common = dict(attn_scale=p.scale, bias=t.get("bias"), **_mask_options(p, cudnn))
    if p.part == "forward":
        o, stats = graph.sdpa(
            name="sdpa", q=t["q"], k=t["k"], v=t["v"], generate_stats=True, **common
        )
        o.set_output(True).set_dim(dims["o"][0]).set_stride(dims["o"][1]).set_data_type(io)
        stats.set_output(True).set_dim(dims["stats"][0]).set_stride(dims["stats"][1])
        stats.set_data_type(cudnn.data_type.FLOAT)
        t |= {"o": o, "stats": stats}
    else:
        t["o"], t["do"] = tensor("o"), tensor("do", like="o")
        t["stats"] = tensor("stats", data_type=cudnn.data_type.FLOAT)
        if p.settings.deterministic:
            common["use_deterministic_algorithm"] = True
        dq, dk, dv = graph.sdpa_backward(
            name="sdpa_backward",
            q=t["q"],
            k=t["k"],
            v=t["v"],
            o=t["o"],
            dO=t["do"],
            stats=t["stats"],
            **common,
        )
        for gradient, like in ((dq, "dq"), (dk, "dk"), (dv, "dv")):
            gradient.set_output(True).set_dim(dims[like][0]).set_stride(dims[like][1])
            gradient.set_data_type(io)
        t |= {"dq": dq, "dk": dk, "dv": dv}
    modes = [getattr(cudnn.heur_mode, m) for m in p.settings.heuristics]
    _steps(
        p,
        ("validate", graph.validate),
        ("build_operation_graph", graph.build_operation_graph),
        ("create_execution_plans", lambda: graph.create_execution_plans(modes)),
        ("check_support", graph.check_support),
    )
    return Built(graph, t, 0)


def _build(p: Problem) -> Built:
    """`p`'s planned graph with its plan built (`Settings.plan` says which), and its workspace."""
    ready = planned(p)
    graph, t = ready.graph, ready.tensors
    _steps(p, ("build_plans", lambda: _build_plans(graph, p, t, handle(0))))
    workspace = int(graph.get_workspace_size())
    log.info(
        "cuDNN attention %s %s: built, workspace %d bytes, plan %s",
        p.part,
        p.summary,
        workspace,
        plan_name(graph),
    )
    return Built(graph, t, workspace)


def _steps(p: Problem, *steps: tuple[str, Callable[[], Any]]) -> None:
    """Run cuDNN's graph `steps` (name, call) in order, each logged; `Decline` at the first
    that fails."""
    for name, run in steps:
        try:
            run()
        except Exception as error:
            log.info("cuDNN attention %s %s: %s failed: %s", p.part, p.summary, name, error)
            raise Decline(f"cuDNN {name} failed for {p.part} {p.summary}: {error}") from None
        log.info("cuDNN attention %s %s: %s ok", p.part, p.summary, name)


def plan_name(graph: Any) -> str:
    """The name of the plan `graph` runs (its engine), or "unknown" if the frontend cannot say."""
    try:
        return str(graph.get_plan_name_at_index(graph._plan_index))
    except Exception:  # older frontends: no ranked list in Python
        engine = getattr(graph, "selected_engine", None)
        return "unknown" if engine is None else str(getattr(engine, "name", engine))


def _build_plans(graph: Any, p: Problem, tensors: dict[str, Any], h: Any) -> None:
    """Build the plan `p.settings.plan` asks for: the heuristic's first that builds, or the
    fastest of all that build (each run on zeroed buffers, the median of a few runs)."""
    if p.settings.plan == "heuristic":
        graph.build_plans()
        return
    times = time_plans(graph, p, tensors, h)
    for index, (name, ms) in sorted(times.items()):
        log.info("cuDNN attention %s %s: plan %d %s: %s", p.part, p.summary, index, name, ms)
    timed = {i: ms for i, (_, ms) in times.items() if isinstance(ms, float)}
    if not timed:
        raise Decline(f"no plan of {p.part} {p.summary} could be built and run: {times}")
    graph.select_plan(min(timed, key=timed.get))
    graph.build_plans()


def time_plans(
    graph: Any, p: Problem, tensors: dict[str, Any], h: Any, runs: int = 5
) -> dict[int, tuple[str, float | str]]:
    """Each plan of a planned graph: (its name, median milliseconds of `runs` runs on zeroed
    buffers, or why it could not be built or run). Used by `plan="fastest"`."""
    import cupy

    buffers = {name: cupy.zeros(max(size, 1), cupy.uint8) for name, size in _sizes(p).items()}
    pack = {int(t.uid): buffers[name].data.ptr for name, t in tensors.items()}
    # The handle may be bound to another program's stream: time on one of our own (every
    # `Issuer` binds the handle again before it issues).
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()  # the zeroed buffers are ready
    cudnn_library.module().set_stream(h, stream.ptr)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times: dict[int, tuple[str, float | str]] = {}
    try:
        for index in range(graph.get_execution_plan_count()):
            name = str(graph.get_plan_name_at_index(index))
            try:
                graph.build_plan_at_index(index)
                workspace = cupy.zeros(
                    max(int(graph.get_workspace_size_plan_at_index(index)), 1), "u1"
                )
                samples = []
                cupy.cuda.Device().synchronize()
                for _ in range(runs + 1):  # the first run loads the kernels: not counted
                    start.record(stream)
                    graph.execute_plan_at_index(pack, workspace.data.ptr, index, handle=h)
                    stop.record(stream)
                    stop.synchronize()
                    samples.append(cupy.cuda.get_elapsed_time(start, stop))
                times[index] = (name, sorted(samples[1:])[runs // 2])
            except Exception as error:  # a plan that does not build or run is skipped, with why
                times[index] = (name, f"{type(error).__name__}: {error}")
    finally:
        stream.synchronize()
        cudnn_library.module().set_stream(h, 0)  # not left on a stream that is about to be freed
    return times


def _span(dims: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from the first to the last of a strided tensor, both included."""
    return 1 + sum((d - 1) * s for d, s in zip(dims, strides, strict=True))


def _sizes(p: Problem) -> dict[str, int]:
    """Bytes of every tensor of `p`'s graph (operands from their strides; O and dO the whole
    forward result, whose lse slots the helper kernels touch; dK and dV the whole backward
    result, as they lie in it)."""
    q_dims, k_dims = (p.b, p.h, p.tokens, p.dim), (p.b, p.key_heads, p.keys, p.dim)
    sizes = {
        "q": _span(q_dims, p.q) * 2,
        "k": _span(k_dims, p.k) * 2,
        "v": _span(k_dims, p.v) * 2,
        "o": p.rows * p.packed_row * 2,  # the forward's whole result (O and the lse slots)
        "stats": p.rows * 4,
    }
    if p.part_stride:  # the stacked operand: q's span and the two entries after it
        sizes["qkv"] = (_span(q_dims, p.q) + 2 * p.part_stride) * 2
    if p.bias is not None:
        sizes["bias"] = _span(*zip(*p.bias, strict=True)) * 2
    if p.part == "backward":
        grads = _result_bytes(p)
        sizes |= {"do": sizes["o"], "dq": grads, "dk": grads, "dv": grads}
    return sizes


def _result_bytes(p: Problem) -> int:
    """Bytes of the record's result: [O | lse slots] rows, or [dQ; dK; dV] rows."""
    if p.part == "forward":
        return p.rows * p.packed_row * 2
    if p.result_size:
        return p.result_size * 2
    if p.part_stride:  # d(qkv)
        return (_span((p.b, p.h, p.tokens, p.dim), p.grads) + 2 * p.part_stride) * 2
    return p.b * p.h * (p.tokens + 2 * p.keys) * p.dim * 2


# -- the library step ------------------------------------------------------------------------------

HELPERS = r"""
/* After the CUDA dialect's prelude, with FROM and TO defined as its 16-bit loads and stores.
   cuDNN reads and writes O, dO, dQ, dK and dV in the records' results in place; these kernels
   touch only the logsumexp's entries of a packed row (dp entries: d of O, then hi, lo, zeros). */
typedef uint16_t u16;
#define GRID_STRIDE(i, n) \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (long long)gridDim.x * blockDim.x)
#define NO_FOLD 0xffffffffu

/* cuDNN's f32 Stats -> the forward's result: hi (rounded), lo (the rest, rounded), zeros. */
extern "C" __global__ void split_stats(u16 *dst, const float *stats, long long rows, int d,
                                       int dp) {
  GRID_STRIDE(r, rows) {
    u16 *slots = dst + r * dp + d;
    const float lse = stats[r];
    const u16 hi = TO(lse);
    slots[0] = hi;
    slots[1] = TO(lse - FROM(hi));
    for (int z = 2; z < dp - d; ++z) slots[z] = TO(0.0f);
  }
}

/* Before cuDNN's backward: Stats = hi + lo of each packed row. cuDNN takes no cotangent of the
   logsumexp (dlse, the hi entry of dpacked's row: zero unless something uses the lse itself, as
   second derivatives do) and reads O only for delta = rowsum(dO * O), where delta must be
   rowsum(dO * O) - dlse: so a nonzero dlse moves O at the row's largest |dO| (the first such
   column m), O[m] -= dlse / dO[m], in place; `fold` keeps m and the old bits for
   `restore_output` (a row whose dO is all zero with a nonzero dlse gives NaN, loudly). */
extern "C" __global__ void prepare_backward(float *stats, unsigned *fold, u16 *packed,
                                            const u16 *dpacked, long long rows, int d, int dp) {
  GRID_STRIDE(r, rows) {
    u16 *o = packed + r * dp;
    const u16 *dout = dpacked + r * dp;
    stats[r] = FROM(o[d]) + FROM(o[d + 1]);
    const float dlse = FROM(dout[d]);
    unsigned kept = NO_FOLD;
    if (dlse != 0.0f) {
      int m = 0;
      float largest = -1.0f;
      for (int c = 0; c < d; ++c) {
        const float a = fabsf(FROM(dout[c]));
        if (a > largest) { largest = a; m = c; }
      }
      kept = ((unsigned)o[m] << 16) | (unsigned)m;
      o[m] = TO(FROM(o[m]) - dlse / FROM(dout[m]));
    }
    fold[r] = kept;
  }
}

/* After cuDNN's backward: O as it was (the forward's result is read by others too). */
extern "C" __global__ void restore_output(u16 *packed, const unsigned *fold, long long rows,
                                          int dp) {
  GRID_STRIDE(r, rows) {
    const unsigned kept = fold[r];
    if (kept != NO_FOLD) packed[r * dp + (kept & 0xffffu)] = (u16)(kept >> 16);
  }
}
"""
BLOCK, MAX_BLOCKS = 256, 132 * 16


def _blocks(items: int) -> int:
    return max(1, min(-(-items // BLOCK), MAX_BLOCKS))


@dataclass(frozen=True)
class CudnnAttention:
    """The `LibraryStep` of one cuDNN attention problem (see the module docstring)."""

    problem: Problem

    @property
    def scratch_bytes(self) -> int:
        _, end = self.problem.offsets()
        return end + ALIGN  # + ALIGN: the scratch base is aligned up to ALIGN

    def load(self, ordinal: int) -> Issuer:
        """The issuer of this step on GPU `ordinal`, its plan built and warmed up (run once,
        outside capture). NVRTC, which lets the GIL go, compiles the helper kernels in a
        thread meanwhile."""
        if ordinal != 0:
            raise Decline("cuDNN attention plans are built on GPU 0 only")
        with ThreadPoolExecutor(1, thread_name_prefix="accy-cudnn-helpers") as pool:
            helpers = pool.submit(_helpers_on, ordinal, self.problem.dtype)
            graph = built(self.problem)
            return Issuer(self, graph, helpers.result())


CONVERSIONS = {
    "bf16": ("accy_bf16_load", "accy_bf16_store"),
    "f16": ("accy_half_to_float", "accy_float_to_half"),
}


def helper_source(dtype: str) -> str:
    """The CUDA C of the helper kernels for 16-bit `dtype` ("bf16" or "f16"): the shared CUDA
    dialect's prelude (its conversions round to nearest even, as the reference does), then the
    kernels.

    >>> "split_stats" in helper_source("bf16") and "accy_bf16_store" in helper_source("bf16")
    True
    """
    load, store = CONVERSIONS[dtype]
    return f"{CUDA.prelude}#define FROM {load}\n#define TO {store}\n{HELPERS}"


@memoized("cudnn attention helpers")
def _helpers(dtype: str) -> Any:
    module = binaries.module(helper_source(dtype))
    names = ("split_stats", "prepare_backward", "restore_output")
    return {name: module.get_function(name) for name in names}


def _helpers_on(ordinal: int, dtype: str) -> Any:
    """`_helpers(dtype)` from any thread (which makes GPU `ordinal`'s context current first)."""
    import cupy

    with cupy.cuda.Device(ordinal):
        return _helpers(dtype)


class Issuer:
    """Enqueues one cuDNN attention step on the bound stream (see `LibraryStep`)."""

    def __init__(self, step: CudnnAttention, graph: Built, kernels: dict[str, Any]):
        import cupy

        self.step, self.graph = step, graph
        self.problem = step.problem
        self.kernels = kernels  # the helper kernels: compiled now, not during a capture
        self.offsets, _ = self.problem.offsets()
        # The plan's workspace, this issuer's own: the plan is chosen when the program loads,
        # after its scratch was laid out. One per problem and fragment (its steps run in order).
        self.workspace = cupy.empty(max(graph.workspace, 1), cupy.uint8)
        self.stream = 0
        self._warm_up(cupy)

    def bind(self, stream: int) -> None:
        """Issue the following work on `stream` (cuDNN's handle is bound now, before any
        capture begins, so that `issue` makes no handle call while capturing)."""
        self.stream = int(stream)
        cudnn_library.bind(self.stream)

    def _warm_up(self, cupy) -> None:
        """Run once on zeroed buffers, so that cuDNN finishes any lazy setup (loading kernels)
        before a capture."""
        p = self.problem
        sizes = _sizes(p)
        operands = p.operand_names + (["o", "do"] if p.part == "backward" else [])
        sizes = [sizes[name] for name in operands]
        result = _result_bytes(p)
        stream = cupy.cuda.Stream(non_blocking=True)
        buffers = [cupy.zeros(max(n, 1), cupy.uint8) for n in sizes]
        dst = cupy.zeros(result, cupy.uint8)
        scratch = cupy.zeros(self.step.scratch_bytes, cupy.uint8)
        log.info("cuDNN attention %s %s: warming up", p.part, p.summary)
        previous = self.stream
        self.bind(stream.ptr)
        with stream:
            self.issue(dst.data.ptr, tuple(b.data.ptr for b in buffers), scratch.data.ptr)
        stream.synchronize()
        self.stream = previous
        if previous:
            self.bind(previous)
        log.info("cuDNN attention %s %s: warm-up ran", p.part, p.summary)

    def issue(self, dst: int, operands: Sequence[int], scratch: int) -> None:
        """Enqueue the step: cuDNN's execution and its helper kernels, on the bound stream,
        which the caller has made CuPy's current stream too (the helper kernels launch there)."""
        cudnn = cudnn_library.module()
        p = self.problem
        base = -(-scratch // ALIGN) * ALIGN
        at = {name: base + offset for name, offset in self.offsets.items()}
        workspace = self.workspace.data.ptr
        pointers = p.operand_pointers(operands)
        rows, grid = _i64(p.rows), ((_blocks(p.rows),), (BLOCK,))
        dims = (_i32(p.dim), _i32(p.packed_row))
        h = handle(0)
        cudnn.set_stream(h, self.stream)  # a no-op when `bind` set it already
        if p.part == "forward":
            pointers |= {"o": dst, "stats": at["stats"]}
            self._execute(pointers, workspace, h)
            self.kernels["split_stats"](*grid, (_ptr(dst), _ptr(at["stats"]), rows, *dims))
            return
        packed, dpacked = operands[-2:]
        stats, fold = _ptr(at["stats"]), _ptr(at["fold"])
        self.kernels["prepare_backward"](
            *grid, (stats, fold, _ptr(packed), _ptr(dpacked), rows, *dims)
        )
        gradients = (dst + 2 * offset for offset in p.gradient_offsets())
        pointers |= {"o": packed, "do": dpacked, "stats": at["stats"]}
        pointers |= dict(zip(("dq", "dk", "dv"), gradients, strict=True))
        self._execute(pointers, workspace, h)
        self.kernels["restore_output"](*grid, (_ptr(packed), fold, rows, dims[1]))

    def _execute(self, pointers: dict[str, int], workspace: int, h: Any) -> None:
        # Keyed by uid (the frontend's own key; its tensors need not be hashable).
        tensors = self.graph.tensors
        pack = {int(tensors[name].uid): int(address) for name, address in pointers.items()}
        self.graph.graph.execute(pack, int(workspace), handle=h)


def _ptr(address: int) -> Any:
    import numpy as np

    return np.uint64(address)


def _i64(x: int) -> Any:
    import numpy as np

    return np.int64(x)


def _i32(x: int) -> Any:
    import numpy as np

    return np.int32(x)
