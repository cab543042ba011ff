"""Parallel reductions: how the elements of each result are shared among threads.

A reduction computes `outputs` results of `length` elements each. Its `Cut` says how:
`lanes` threads (1, a warp, or a block) walk one chunk of a result's elements with a stride of
`lanes`, then combine their partial values with warp shuffles (and shared memory across the
warps of a block); a result's elements are cut into `chunks` chunks when there are too few
results to fill the GPU. With one chunk the combined value is the result; with several, each
chunk writes a partial value to scratch and a second kernel combines them in chunk order.
With `width > 1` a thread takes that many adjacent elements per step (vector loads,
`accy.backends.cuda.vectors`) where its buffers are aligned, one at a time otherwise.

Every cut is fixed by the shapes alone, so a reduction adds in the same order on every run:
results are deterministic. The reduction's initial value is combined in last, with the partial
values in the compute type (float for f16/bf16), and the result is rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ...codegen.c import templates
from ...codegen.c.dialect import CUDA
from ...codegen.c.literals import highest, lowest
from ...core.types import DType
from ...errors import AccyError
from .kernels import BLOCK, WARP, grid_stride

BUSY_THREADS = 1 << 19  # threads that keep an H200 busy: 132 SMs x 2048 threads, twice over
ONE_WAVE = BUSY_THREADS // 2  # threads an H200 holds at once
ELEMENTS_PER_THREAD = 16  # fewer than this per thread and a chunk is not worth its own threads
MAX_CHUNKS = 2048


@dataclass(frozen=True)
class Cut:
    """How `outputs` reductions of `length` elements each are shared among threads; each thread
    takes `width` adjacent elements at a time (one vector load, `accy.backends.cuda.vectors`)."""

    outputs: int
    length: int
    lanes: int
    chunks: int
    width: int = 1

    @property
    def groups(self) -> int:
        """Thread groups of `lanes` threads that one pass needs: one per (result, chunk)."""
        return self.outputs * self.chunks

    @property
    def grid(self) -> int:
        return max(1, min(math.ceil(self.groups * self.lanes / BLOCK), 65535))

    @property
    def steps(self) -> int:
        """Vectors of `width` elements per result."""
        return self.length // self.width


def choose_cut(
    outputs: int, length: int, contiguous: bool, split: bool = True, width: int = 1
) -> Cut:
    """The cut for `outputs` results of `length` elements; `contiguous` when each result's
    elements are adjacent in memory (a warp then reads them in one transaction), a block per
    result when they are many. Without `split` every result is one chunk (a final pass).
    `width` (dividing `length`) is how many adjacent elements a thread takes at a time.

    >>> choose_cut(1, 1 << 22, True)
    Cut(outputs=1, length=4194304, lanes=256, chunks=1024, width=1)
    >>> choose_cut(4096, 512, True)
    Cut(outputs=4096, length=512, lanes=32, chunks=1, width=1)
    >>> choose_cut(8192, 50304, True, width=8)
    Cut(outputs=8192, length=50304, lanes=256, chunks=1, width=8)
    >>> choose_cut(10, 100000, False)
    Cut(outputs=10, length=100000, lanes=1, chunks=2048, width=1)
    >>> choose_cut(10, 100000, False, split=False).chunks
    1
    """
    if outputs == 1:
        lanes = BLOCK
    elif contiguous and length >= WARP:
        # A long row is a block's: enough threads in flight without a second pass.
        lanes = BLOCK if length >= BLOCK * ELEMENTS_PER_THREAD else WARP
    else:
        lanes = 1
    chunks = 1
    if split and outputs * lanes < BUSY_THREADS:
        wanted = math.ceil(BUSY_THREADS / (outputs * lanes))
        chunks = max(1, min(wanted, length // (lanes * ELEMENTS_PER_THREAD), MAX_CHUNKS))
    return Cut(outputs, length, lanes, chunks, width)


def chain_cut(outputs: int, length: int, width: int = 1) -> Cut | None:
    """The cut of a pass of a chain over rows (`chain_lines`: one chunk per row), or None
    where splitting rows into chunks pays more: when `choose_cut` would split them and one
    chunk per row leaves the GPU less than a wave of threads. Rows a warp would walk take
    fewer lanes while they would fill more than a wave (`_rows_in_one_wave`).

    >>> chain_cut(8192, 50304, 8)
    Cut(outputs=8192, length=50304, lanes=256, chunks=1, width=8)
    >>> chain_cut(8192, 768, 8)  # GPT-2's layer norms: half a warp a row
    Cut(outputs=8192, length=768, lanes=16, chunks=1, width=8)
    >>> chain_cut(1024, 8192) is not None, chain_cut(64, 8192)
    (True, None)
    """
    cut = choose_cut(outputs, length, True, width=width)
    if cut.chunks == 1:
        return _rows_in_one_wave(cut)
    whole = choose_cut(outputs, length, True, split=False, width=width)
    return whole if whole.outputs * whole.lanes >= ONE_WAVE else None


MIN_CHAIN_VECTORS = 4  # a chain's lane takes at least this many vectors of its row a pass
IN_FLIGHT_ELEMENTS = 1 << 23  # rows in flight x their length that leave the rows in L2


def _rows_in_one_wave(cut: Cut) -> Cut:
    """`cut` (a warp a row) with half the lanes a row while its rows would keep more than a
    wave of threads and each lane still takes `MIN_CHAIN_VECTORS` vectors a pass. A chain's
    passes are latency-bound: each waits for the last one's stores of the row (its statistics)
    to come back, so rows in flight matter more than lanes a row; GPT-2's 8192 layer-norm rows
    of 768 were 1.3 waves of warps at 6 blocks a multiprocessor (25-28 us for 38 MB). A warp
    holds whole rows only (`outputs` divisible by its rows), so both halves of a warp run the
    same passes and meet at the same shuffles and `__syncwarp`.

    Halving stops where it would put more rows in flight than `IN_FLIGHT_ELEMENTS` of them
    hold: a pass after the first reads its rows again, from L2 only while the rows in flight
    fit there (50 MB on an H200). GPT-2's 65,536 layer-norm rows of 768 (64 x 1024 tokens) at 2
    lanes a row all ran at once: 450 us a backward pass for 500 MB, 1.1 TB/s.

    >>> chain_cut(65536, 768, 8).lanes, chain_cut(8192, 768, 8).lanes
    (32, 16)
    """
    if cut.lanes != WARP:
        return cut
    lanes = WARP
    while lanes > 1 and cut.outputs * lanes >= ONE_WAVE:
        half = lanes // 2
        if cut.steps < half * MIN_CHAIN_VECTORS or cut.outputs % (WARP // half):
            break
        in_flight, more = (min(cut.outputs, ONE_WAVE // n) for n in (lanes, half))
        if more > in_flight and more * cut.length > IN_FLIGHT_ELEMENTS:
            break
        lanes = half
    return cut if lanes == cut.lanes else replace(cut, lanes=lanes)


def identity(reducer: str, dtype: DType) -> str:
    """The value that leaves a reduction unchanged, as C.

    >>> identity("max", __import__("accy").f32)
    '(-INFINITY)'
    """
    return {"sum": "0", "prod": "1", "max": lowest(dtype), "min": highest(dtype)}[reducer]


@dataclass(frozen=True)
class Accumulator:
    """One running reduction in a kernel: its C variable, reducer and dtype."""

    name: str
    reducer: str
    dtype: DType

    @property
    def compute(self) -> str:
        return CUDA.c_type(self.dtype).compute

    def combine(self, a: str, b: str) -> str:
        return templates.binary(templates.REDUCERS[self.reducer], CUDA.c_type(self.dtype), a, b)


# counter -> (statements, values): one list of values (one per accumulator) per lane.
Element = Callable[[str], tuple[list[str], list[list[str]]]]
Finish = Callable[[int, str], list[str]]  # (accumulator, value) -> statements storing it


@dataclass(frozen=True)
class Vectors:
    """The vector form of a reduction's element: `element(counter)` gives `width` lanes from
    element `counter` on (a multiple of `width`), valid where C `condition` holds (the buffers
    are aligned); elsewhere the scalar element runs."""

    element: Element
    condition: str


@dataclass(frozen=True)
class OnlineSum:
    """The sum of `exp(x - max)` over each row, computed in the pass of the row's max (a
    chain's next phase folded into it, as FlashAttention's softmax does): accumulator `of` is
    the max, whose lane values are the x; `name` the thread's running sum, relative to its
    running max and rescaled whenever that grows; `finish(value)` stores the row's sum
    (`initial` combined in)."""

    name: str
    of: int
    initial: str
    finish: Callable[[str], list[str]]

    def rescaled(self, total: str, peak: str, new: str) -> str:
        """`total` (a sum relative to `peak`) relative to `new` (at least `peak`); 0 for no
        elements yet (`peak` still -inf)."""
        return f"({peak} == -INFINITY ? 0.0f : {total} * accy_softmax_expf({peak} - {new}))"


def _warp_combine(acc: Accumulator, width: int) -> list[str]:
    other = f"{acc.name}_other"
    return [
        f"for (int d = {width // 2}; d > 0; d >>= 1) {{",
        f"  const {acc.compute} {other} = accy_shfl_down({acc.name}, d);",
        f"  {acc.name} = {acc.combine(acc.name, other)};",
        "}",
    ]


def _block_combine(acc: Accumulator) -> list[str]:
    shared = f"{acc.name}_shared"
    return [
        f"if ((threadIdx.x & {WARP - 1}) == 0) {shared}[threadIdx.x / {WARP}] = {acc.name};",
        "__syncthreads();",
        f"if (threadIdx.x < {WARP}) {{",
        f"  {acc.name} = threadIdx.x < {BLOCK // WARP} ? {shared}[threadIdx.x] : "
        f"{identity(acc.reducer, acc.dtype)};",
        *("  " + line for line in _warp_combine(acc, BLOCK // WARP)),
        "}",
        "__syncthreads();",
    ]


def _online_pair(online: OnlineSum, peak: Accumulator, width: int) -> list[str]:
    """Shuffles adding `width` lanes' running sums (each relative to its lane's max) into
    lane 0's, relative to the largest max, which lane 0's max becomes."""
    total = online.name
    return [
        f"for (int d = {width // 2}; d > 0; d >>= 1) {{",
        f"  const float {peak.name}_other = accy_shfl_down({peak.name}, d);",
        f"  const float {total}_other = accy_shfl_down({total}, d);",
        f"  const float {total}_peak = {peak.combine(peak.name, f'{peak.name}_other')};",
        f"  {total} = {online.rescaled(total, peak.name, f'{total}_peak')} + "
        f"{online.rescaled(f'{total}_other', f'{peak.name}_other', f'{total}_peak')};",
        f"  {peak.name} = {total}_peak;",
        "}",
    ]


def _online_combine(online: OnlineSum, peak: Accumulator, lanes: int) -> list[str]:
    """The running sums and maxes of a row's threads combined: across the warp, then (a block
    a row) the warps' through shared memory."""
    if lanes == 1:
        return []
    lines = _online_pair(online, peak, min(lanes, WARP))
    if lanes < BLOCK:
        return lines
    total, shared = online.name, f"{peak.name}_shared"
    return lines + [
        f"if ((threadIdx.x & {WARP - 1}) == 0) {{",
        f"  {shared}[threadIdx.x / {WARP}] = {peak.name};",
        f"  {total}_shared[threadIdx.x / {WARP}] = {total};",
        "}",
        "__syncthreads();",
        f"if (threadIdx.x < {WARP}) {{",
        f"  {peak.name} = threadIdx.x < {BLOCK // WARP} ? {shared}[threadIdx.x] : -INFINITY;",
        f"  {total} = threadIdx.x < {BLOCK // WARP} ? {total}_shared[threadIdx.x] : 0.0f;",
        *("  " + line for line in _online_pair(online, peak, BLOCK // WARP)),
        "}",
        "__syncthreads();",
    ]


def _chunk_loop(
    cut: Cut,
    element: Element,
    accumulators: list[Accumulator],
    width: int,
    unrolled: bool,
    online: OnlineSum | None = None,
):
    """The loop over one chunk of one result's elements, `width` at a time (counter `r`),
    `unrolled` by 4 for vector loads; with `online`, its running sum rescaled to the grown
    max and the lanes' exponentials added, in lane order."""
    statements, lanes = element("r")
    count = cut.length // width
    chunked = cut.chunks > 1
    first = f"g * {count}LL / {cut.chunks}" if chunked else "0"
    stop = f"(g + 1) * {count}LL / {cut.chunks}" if chunked else f"{count}LL"
    counter = "r" if width == 1 else "rv"
    lines = [f"const int64_t r_stop = {stop};"]
    start = f"{first} + lane" if cut.lanes > 1 else first
    lines.append(
        f"for (int64_t {counter} = {start}; {counter} < r_stop; {counter} += {cut.lanes}) {{"
    )
    if unrolled:
        # Loads of the next steps are issued before this step's values are added in: more
        # bytes in flight per thread (the order of additions is the same).
        lines.insert(-1, "#pragma unroll 4")
    if width > 1:
        lines.append(f"  const int64_t r = rv * {width};")
    lines += ["  " + line for line in statements]
    if online is not None:
        lines.append(f"  const float {online.name}_peak = {accumulators[online.of].name};")
    for values in lanes:
        updates = zip(accumulators, values, strict=True)
        lines += [f"  {a.name} = {a.combine(a.name, x)};" for a, x in updates]
    if online is not None:
        peak = accumulators[online.of].name
        terms = [online.rescaled(online.name, f"{online.name}_peak", peak)]
        terms += [f"accy_softmax_expf({values[online.of]} - {peak})" for values in lanes]
        lines += [f"  if ({peak} != -INFINITY) {online.name} = {' + '.join(terms)};"]
    return lines + ["}"]


@dataclass(frozen=True)
class RowPass:
    """One pass of reductions over each result's elements in a kernel (the arguments of
    `reduction_lines`); a chain runs several over the same results, one after the other. A
    pass without accumulators is a loop over each row's elements (its `element` stores)."""

    cut: Cut
    kept: Callable[[str], list[str]]
    element: Element
    accumulators: list[Accumulator]
    initials: list[str] | None
    finish: Finish
    vectors: Vectors | None = None
    online: OnlineSum | None = None


def reduction_lines(
    cut: Cut,
    kept: Callable[[str], list[str]],
    element: Element,
    accumulators: list[Accumulator],
    initials: list[str] | None,
    finish: Finish,
    vectors: Vectors | None = None,
) -> list[str]:
    """The statements of a reduction kernel, one pass.

    `kept(o)` splits result number `o` into index statements; `element(r)` computes each
    accumulator's element at counter `r` of the chunk; with `initials` (C values of the initial
    values) the pass is final and combines them in, else it writes partial values. `finish(j,
    value)` stores accumulator `j`'s value for result `o` (and chunk `g`). With `vectors` each
    thread takes `cut.width` elements at a time where the buffers are aligned.
    """
    return chain_lines([RowPass(cut, kept, element, accumulators, initials, finish, vectors)])


def chain_lines(passes: list[RowPass]) -> list[str]:
    """The statements of a kernel that runs `passes` (their cuts alike but for the width) over
    each result in turn: each pass combines and stores its values, then the result's threads
    meet at a barrier before the next pass, which may load what they stored (a row
    reduction's max, read by the sum of `exp(x - max)`). With several passes each result is one
    chunk (the values are final)."""
    cut = passes[0].cut
    if len(passes) > 1 and cut.chunks != 1:
        raise AccyError("internal: a chain of reduction passes needs one chunk per result")
    per_block = BLOCK // cut.lanes
    lines: list[str] = []
    if cut.lanes > 1:
        lines.append(f"const int lane = threadIdx.x % {cut.lanes};")
    if cut.lanes == BLOCK:
        lines += [
            f"__shared__ {a.compute} {a.name}_shared[{BLOCK // WARP}];"
            for row in passes
            for a in row.accumulators
        ]
        lines += [
            f"__shared__ float {row.online.name}_shared[{BLOCK // WARP}];"
            for row in passes
            if row.online is not None
        ]
    lines.append(grid_stride("w", cut.groups, per_block, cut.lanes))
    inner = [
        f"const int64_t o = w % {cut.outputs}LL;" if cut.chunks > 1 else "const int64_t o = w;"
    ]
    if cut.chunks > 1:
        inner.append(f"const int64_t g = w / {cut.outputs}LL;")
    if len(passes) == 1:
        inner += _pass_lines(passes[0])
    for k, row in enumerate(passes if len(passes) > 1 else []):
        inner += ["{", *("  " + line for line in _pass_lines(row)), "}"]
        if k < len(passes) - 1:
            inner += _barrier(cut.lanes)
    return lines + ["  " + line for line in inner] + ["}"]


def _barrier(lanes: int) -> list[str]:
    """What makes one pass's stores visible to the threads of the next pass over the same
    result: the block's barrier (a block per result), the warp's (a warp per result), nothing
    (a thread per result reads what it stored)."""
    if lanes == BLOCK:
        return ["__syncthreads();"]
    return ["__syncwarp();"] if lanes > 1 else []


def _pass_lines(row: RowPass) -> list[str]:
    """One pass over result `o`'s elements: the accumulators' loop, their combination across
    the result's threads, and the stores."""
    cut, accumulators, initials, vectors = row.cut, row.accumulators, row.initials, row.vectors
    online = row.online
    inner = row.kept("o")
    inner += [f"{a.compute} {a.name} = {identity(a.reducer, a.dtype)};" for a in accumulators]
    if online is not None:
        inner.append(f"float {online.name} = 0;")
    if vectors is None:
        inner += _chunk_loop(cut, row.element, accumulators, 1, False, online)
    else:
        # Where a buffer is misaligned, the scalar loop: with `cut.width > 1` it takes the
        # elements in another order, so results are the same for the same alignment.
        inner.append(f"if ({vectors.condition}) {{")
        vector_loop = _chunk_loop(cut, vectors.element, accumulators, cut.width, True, online)
        inner += ["  " + line for line in vector_loop]
        inner.append("} else {")
        scalar_loop = _chunk_loop(cut, row.element, accumulators, 1, False, online)
        inner += ["  " + line for line in scalar_loop]
        inner.append("}")
    if online is not None:
        inner += _online_combine(online, accumulators[online.of], cut.lanes)
    for j, a in enumerate(accumulators):
        if online is not None and j == online.of:
            continue  # combined with the running sum
        if cut.lanes > 1:
            inner += _warp_combine(a, min(cut.lanes, WARP))
        if cut.lanes == BLOCK:
            inner += _block_combine(a)
    stores: list[str] = []
    for j, a in enumerate(accumulators):
        value = a.name if initials is None else a.combine(initials[j], a.name)
        stores += row.finish(j, value)
    if online is not None:
        # A row of -inf only: exp(-inf - -inf) is NaN in every term, as the reference has it.
        peak = accumulators[online.of].name
        total = f"({peak} == -INFINITY ? NAN : {online.name})"
        stores += online.finish(f"{online.initial} + {total}")
    if cut.lanes > 1 and stores:
        stores = ["if (lane == 0) {", *("  " + s for s in stores), "}"]
    return inner + stores
