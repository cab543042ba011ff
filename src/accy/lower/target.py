"""What a code generator's hardware makes cheap or costly, which the plan's choices follow."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core import Operation
from .convolution import cpu_orders, cpu_scratch
from .expand import Keep, compose_all
from .pooling import pool_orders


@dataclass(frozen=True)
class Target:
    """The plan's view of a backend.

    `half_gemms_in_float32`: the target converts 16-bit GEMM operands to float32 (the CPU, whose
    BLAS has no bf16, needs workspace for that; a GPU's GEMM reads them as they are).
    `recomputes_transcendentals`: a transcendental (exp, tanh, log...) needed element by element
    in a few steps is computed again in each rather than stored: on a GPU a few special-function
    instructions cost far less than writing and reading back the value (GPT-2's f32 softmax
    numerator alone was 1.6 GB), while on a CPU the two cost about the same.
    `splits_widened_gemms`: f32 contractions of an operand widened from bf16 run as bf16
    contractions that sum in f32, with the same result (`accy.lower.split_gemms`): a GPU's
    tensor cores take bf16, not f32, at ten times the rate.
    `rematerialize_after`: a value made of cheap elementwise work and read again more than this
    many operations after its previous reader (a value a training step saves for its backward
    pass) is computed again there from values alive anyway, instead of being kept
    (`accy.lower.remat`; 0: never), when it takes at least `rematerialize_min_bytes` (a copy
    that a GEMM reads is a kernel of its own). On a GPU that takes 1 GB off the peak of GPT-2's
    bf16 step (3.7 GB of live intermediates) for 6% more steps. The CPU leaves it off: its bar
    is time, and GPT-2's CPU-scale f32 step would hold 10% less (362 to 326 MiB) for 5% more
    steps.
    `rematerializes_transcendentals`: whether those copies may repeat transcendentals. A GPU's
    copies repeat only arithmetic: GPT-2's GELU output (tanh) took 88 us to compute again per
    layer in the bf16 step (38 us once CUDA kept 16-bit intermediates in float32), to save
    528 MiB of a peak that stays below PyTorch's without it (measured on the H200).
    `epilogue_excludes`: elementwise operations (unary op names, binary kinds) that a row
    reduction's epilogue may not compute (`accy.lower.grouping.reduction_epilogues`). The CPU's
    loops call libmvec's vector variants of exp, log, tanh... whose last bits differ from the
    scalar calls an epilogue makes (one result at a time): loops that call them stay loops
    there, so that the plan's results are the bits of the unfused plan.
    `chains_reductions`: row reductions that read earlier ones' per-row results only at their
    own row run as one step, each row walked once per phase while it is still in cache
    (`accy.lower.grouping.reduction_chains`): a GPU reads the row's later passes from L2 instead
    of HBM and saves a launch, a CPU from its L2 instead of memory. Both take it; the values are
    the unchained plan's bits (each phase computes what its step computed).
    `chains_end_in_place`: the longest rows (in elements; 0: none) over which a chain may end
    with a loop that writes its result over a buffer it reads for the last time, where the
    chain's earlier phases read that buffer at their own rows alone (each row is done with
    before its last pass stores over it): the input's gradient is then the last phase of
    LayerNorm's backward chain, which reads each row from cache, one launch fewer. The GPU
    takes it up to 8192 elements: GPT-2's cross-entropy rows (50,304) measured slower as one
    chain ending with the logits' gradient (1141 us on the H200) than as the chain and a loop
    of its own (384 + 659 us). On the CPU such a loop stays a step of its own (GPT-2's
    CPU-scale f32 step took the same time either way, 1.70-1.76 s a step in two runs each on
    2 cores).
    `converts_inside_scans`: a conversion of at least `rematerialize_min_bytes` that only scans
    read, as an operand they slice, is made inside their bodies a slice at each step
    (`accy.lower.remat.convert_inside_scans`): mixed precision's bf16 copy of the stacked f32
    layer weights never exists whole (1.8 GB of the llama1b step's peak), for one more
    conversion of the weights in the backward scan (5.6 GB more traffic a step, ~1.3 ms on
    the H200). The GPU can, where `accy.config.lower_convert_inside_scans` asks for it: off by
    default, since the whole copy keeps that step's peak (24 GB) under PyTorch's (25.9 GB).
    `clusters_loops`: flat loops over the same elements that other steps separate are moved
    next to each other where the steps' dependences allow, to share one pass
    (`accy.lower.plan._cluster_loops`; SwiGLU's backward: three passes over its 8192-wide
    activations become one). The GPU takes it: each pass is a launch and a round trip to HBM.
    `fuses_gemm_epilogues`: a loop that adds a bias vector to a GEMM's product is done by the
    GEMM, and so are GELU after it and GELU's derivative scaling a product
    (`accy.lower.gemm_epilogues`; cuBLASLt's BIAS, GELU_AUX_BIAS and DGELU epilogues on the
    GPU). `stores_bias_sums`: fusion stores a GEMM's biased product that several steps read
    (`fusion.decide`), which the GEMM's bias epilogue writes, and GELU's epilogues read. The
    GPU's top-level plan does; its bodies' and branches' plans do not (`plan._steps`): the
    CUDA backend issues a loop body's GEMM with cuBLASLt's epilogues only where its
    contraction is long, so there a kernel of its own would add the bias (GPT-2's scanned
    layers: a launch a layer).
    `keep`: which kinds that have a composition the target runs whole, on operands in which
    layout (`accy.lower.expand`; by default every such kind is composed). `conv_scratch`: the
    workspace (names and bytes) of a conv kept for the target's own kernel (the CPU's tiled
    implicit GEMM, `accy.lower.convolution`); None where a library brings its own (cuDNN).

    >>> CPU.half_gemms_in_float32, GPU.recomputes_transcendentals
    (True, True)
    """

    half_gemms_in_float32: bool = True
    recomputes_transcendentals: bool = False
    splits_widened_gemms: bool = False
    rematerialize_after: int = 0
    rematerialize_min_bytes: int = 0
    rematerializes_transcendentals: bool = True
    epilogue_excludes: frozenset[str] = frozenset()
    chains_reductions: bool = True
    chains_end_in_place: int = 0
    converts_inside_scans: bool = False
    clusters_loops: bool = False
    fuses_gemm_epilogues: bool = False
    stores_bias_sums: bool = False
    keep: Keep = compose_all
    conv_scratch: Callable[[Operation], tuple[tuple[str, int], ...]] | None = None


VECTOR_MATH = frozenset(
    {"exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "pow", "logistic"}
    | {"gelu_tanh", "gelu_tanh_slope"}
)
"""What the CPU's vectorized loops compute with libmvec's variants (`logistic` calls `expf`);
`accy.backends.cpu.vector_math` declares them."""


def cpu_keep(op: Operation) -> tuple[tuple[str, ...], ...] | None:
    """The CPU's `keep`: convs for its tiled implicit GEMM (`convolution.cpu_orders`), the
    windowed reductions for its one-pass loops (`pooling.pool_orders`).

    >>> import accy
    >>> p = accy.trace.define("m", [accy.spec(accy.f32, h=4)],
    ...                       lambda b, a: accy.nn.max_pool(a[0], {"h": 2}, 1))
    >>> cpu_keep(p.operations[-1])
    (('h',),)
    """
    return cpu_orders(op) if op.kind == "conv" else pool_orders(op)


CPU = Target(epilogue_excludes=VECTOR_MATH, keep=cpu_keep, conv_scratch=cpu_scratch)
GPU = Target(
    half_gemms_in_float32=False,
    recomputes_transcendentals=True,
    splits_widened_gemms=True,
    rematerialize_after=64,
    rematerialize_min_bytes=8 << 20,
    rematerializes_transcendentals=False,
    chains_end_in_place=8192,
    converts_inside_scans=True,
    clusters_loops=True,
    fuses_gemm_epilogues=True,
    stores_bias_sums=True,
)
