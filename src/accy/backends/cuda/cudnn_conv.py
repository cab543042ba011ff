"""The kind conv on CUDA: cuDNN's convolution (frontend graph API) inside the program's graph.

`layout_for(op)` is the CUDA backend's `keep` (see `accy.lower.expand`): for a conv cuDNN can
run, the axis orders its operands are transposed to (channels last, the layout of cuDNN's fast
engines); for any other, None, and the conv is composed (im2col and cuBLAS) instead. Which
cuDNN operation runs depends on the shapes, not on where the conv came from:

- `fprop` (`conv_fprop`): the input [N, C, spatial] (batch axes merged into N, contracted axes
  into C) with the kernel [K, C, window] (output axes merged into K): forward convolutions,
  and the input gradients of stride-1 convolutions (the flipped kernel is an ordinary kernel);
- `wgrad` (`conv_wgrad`), when the kernel operand's window is larger than the result's
  spatial extent (a kernel gradient: the cotangent is the window): image = the input with
  the contracted axes as N and its batch axes as C, loss = the kernel operand [N, K, spatial],
  result [K, C, window]; the original stride is the conv's rhs_dilation, the original dilation
  its stride, the paddings the conv's own.

Declined (composed, with the reason in `decline_reasons()`, logger `accy.cuda.cudnn_conv`):
paired axes (groups, a vmapped kernel), input dilation (the input gradient of a strided
convolution: `conv_dgrad` would need the kernel unflipped), negative padding, dtypes other than
f32/bf16/f16, more than 3 spatial axes, no `cudnn` or GPU, `ACCY_CUDNN_CONV=0`, and whatever
cuDNN's check_support refuses. f32 keeps to engines without tensor cores (no TF32), as accy's
f32 GEMMs do by default. Graphs are built when the program is planned and cached per problem.
"""

from __future__ import annotations

import hashlib
import logging
import math
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...caches import memoized
from ...config import config
from ...core import Operation
from ...core.kinds.convolution import axis_roles
from ...core.kinds.registry import rule_for
from ...core.types import TensorType, bf16, f16, f32
from ...kernel.call import KernelCall
from . import cudnn as cudnn_library
from .cudnn import ALIGN, Built, Decline, handle

log = logging.getLogger("accy.cuda.cudnn_conv")
# Built graphs per problem, and why cuDNN declined convs (`_build` is defined below).
_GRAPHS = cudnn_library.Graphs("conv", lambda problem: _build(problem))
DTYPES = {f32: "FLOAT", bf16: "BFLOAT16", f16: "HALF"}


def decline_reasons() -> dict[str, str]:
    """Why cuDNN declined a conv, per problem, since the process started.

    >>> isinstance(decline_reasons(), dict)
    True
    """
    return _GRAPHS.reasons()


@dataclass(frozen=True)
class Problem:
    """One cuDNN convolution: NCHW-ordered dims (channels-last strides), conv parameters."""

    mode: str  # "fprop" or "wgrad"
    dtype: str  # "f32", "bf16" or "f16"
    image: tuple[int, ...]  # [N, C, *spatial]
    filter: tuple[int, ...]  # [K, C, *window]
    output: tuple[int, ...]  # fprop: [N, K, *spatial] (y); wgrad: [N, K, *spatial] (dy)
    pre: tuple[int, ...]
    post: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]

    @property
    def summary(self) -> str:
        return (
            f"{self.mode} {self.dtype} image={list(self.image)} filter={list(self.filter)} "
            f"output={list(self.output)} pad={list(self.pre)}/{list(self.post)} "
            f"stride={list(self.stride)} dilation={list(self.dilation)}"
        )


def channels_last(dims: Sequence[int]) -> list[int]:
    """Element strides of NCHW-ordered `dims` laid out as NHWC (channels innermost).

    >>> channels_last([2, 3, 4, 5])
    [60, 1, 15, 3]
    """
    n, c, *spatial = dims
    strides = [0] * len(dims)
    step = c
    strides[1] = 1
    for i in range(len(spatial) - 1, -1, -1):
        strides[2 + i] = step
        step *= spatial[i]
    strides[0] = step
    return strides


def _mode(x: TensorType, kernel: TensorType, result: TensorType, spatial) -> str:
    window = math.prod(kernel.extent(a) for a in spatial)
    out = math.prod(result.extent(a) for a in spatial)
    return "wgrad" if window > out else "fprop"


def _check(x: TensorType, kernel: TensorType, attrs) -> dict[str, tuple[str, ...]]:
    """The axis roles of a conv cuDNN may run, or `Decline`."""
    if not config.cudnn_conv:
        raise Decline("switched off (accy.config.cudnn_conv, ACCY_CUDNN_CONV=0)")
    if x.dtype not in DTYPES:
        raise Decline(f"cuDNN convolutions take f32, bf16 or f16, not {x.dtype.name}")
    roles = axis_roles(x, kernel, attrs)
    if roles["paired"]:
        raise Decline(f"paired axes {roles['paired']} (groups or a vmapped kernel)")
    if any(d != 1 for d in attrs["lhs_dilation"]):
        raise Decline(f"input dilation {attrs['lhs_dilation']} (a strided conv's transpose)")
    if any(p < 0 for p in (*attrs["low"], *attrs["high"])):
        raise Decline("negative padding (cropping)")
    if not 1 <= len(roles["spatial"]) <= 3:
        raise Decline(f"{len(roles['spatial'])} spatial axes (cuDNN takes 1 to 3)")
    if 0 in (*x.extents, *kernel.extents):
        raise Decline("an empty operand")
    return roles


def operand_orders(op: Operation) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The axis orders cuDNN reads the operands in (channels last), by mode."""
    roles = axis_roles(*op.operand_types, op.attrs)
    spatial, contract = roles["spatial"], roles["contract"]
    if _mode(*op.operand_types, op.type, spatial) == "fprop":
        return (*roles["batch"], *spatial, *contract), (*roles["outputs"], *spatial, *contract)
    return (*contract, *spatial, *roles["batch"]), (*contract, *spatial, *roles["outputs"])


def problem_of(x: TensorType, kernel: TensorType, result: TensorType, a) -> Problem:
    """The cuDNN problem of a conv (operand types `x`, `kernel` laid out in
    `operand_orders`, attributes `a`), or `Decline`.

    >>> from accy import spec, f32
    >>> from accy.core.kinds.convolution import conv_attrs
    >>> a = conv_attrs(["h", "w"], ["c"], [1, 1], [(1, 1), (1, 1)], [1, 1], [1, 1])
    >>> x, k = spec(f32, n=2, h=8, w=8, c=4), spec(f32, o=6, h=3, w=3, c=4)
    >>> p = problem_of(x, k, spec(f32, n=2, h=8, w=8, o=6), a)
    >>> p.mode, p.image, p.filter, p.output
    ('fprop', (2, 4, 8, 8), (6, 4, 3, 3), (2, 6, 8, 8))
    """
    roles = _check(x, kernel, a)
    spatial = roles["spatial"]
    size = lambda t, axes: math.prod(t.extent(a) for a in axes)  # noqa: E731
    pad = (1,) * (2 - len(spatial)) if len(spatial) == 1 else ()  # cuDNN: 2 or 3 spatial dims
    zeros = (0,) * len(pad)
    mode = _mode(x, kernel, result, spatial)
    if mode == "fprop":
        n, c, k = (
            size(x, roles["batch"]),
            size(x, roles["contract"]),
            size(kernel, roles["outputs"]),
        )
        image = (n, c, *pad, *(x.extent(s) for s in spatial))
        filter_ = (k, c, *pad, *(kernel.extent(s) for s in spatial))
        output = (n, k, *pad, *(result.extent(s) for s in spatial))
        stride, dilation = a["stride"], a["rhs_dilation"]
    else:
        n, c, k = (
            size(x, roles["contract"]),
            size(x, roles["batch"]),
            size(kernel, roles["outputs"]),
        )
        image = (n, c, *pad, *(x.extent(s) for s in spatial))
        filter_ = (k, c, *pad, *(result.extent(s) for s in spatial))
        output = (n, k, *pad, *(kernel.extent(s) for s in spatial))
        stride, dilation = a["rhs_dilation"], a["stride"]
    return Problem(
        mode,
        x.dtype.name,
        image,
        filter_,
        output,
        (*zeros, *a["low"]),
        (*zeros, *a["high"]),
        (*pad, *stride),
        (*pad, *dilation),
    )


def layout_for(op: Operation) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The CUDA backend's `keep` for conv: the operand orders when cuDNN runs `op` (its graph
    built now, or found in the cache), else None (composed; the reason is recorded). Other
    kinds with a composition (the windowed reductions) are composed."""
    if op.kind != "conv":
        return None
    where = f"conv {op.operand_types[0]} * {op.operand_types[1]} -> {op.type}"
    try:
        _check(*op.operand_types, op.attrs)
        orders = operand_orders(op)
        x, kernel = _transposed(op, orders)
        result = rule_for("conv").infer((x, kernel), op.attrs)
        built(problem_of(x, kernel, result, op.attrs))
    except Decline as why:
        _GRAPHS.decline(where, str(why))
        return None
    except Exception as error:  # an unexpected failure declines too, with its traceback logged
        _GRAPHS.decline(where, f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        return None
    return orders


def _transposed(op: Operation, orders) -> tuple[TensorType, ...]:
    return tuple(
        t.with_axes(tuple((a, t.extent(a)) for a in order))
        for t, order in zip(op.operand_types, orders, strict=True)
    )


def built(problem: Problem) -> Built:
    """The built graph of `problem` (cached), or `Decline` with cuDNN's reason."""
    return _GRAPHS.built(problem, problem.summary)


def _build(p: Problem) -> Built:
    cudnn = cudnn_library.module()
    h = handle(0)
    io = getattr(cudnn.data_type, {"f32": "FLOAT", "bf16": "BFLOAT16", "f16": "HALF"}[p.dtype])
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
    image = graph.tensor(
        name="image", dim=list(p.image), stride=channels_last(p.image), data_type=io
    )
    geometry = dict(
        pre_padding=list(p.pre),
        post_padding=list(p.post),
        stride=list(p.stride),
        dilation=list(p.dilation),
        compute_data_type=cudnn.data_type.FLOAT,
    )
    if p.mode == "fprop":
        weight = graph.tensor(
            name="weight", dim=list(p.filter), stride=channels_last(p.filter), data_type=io
        )
        result = _with_padding(graph.conv_fprop, geometry, image=image, weight=weight)
        result.set_output(True).set_dim(list(p.output)).set_stride(channels_last(p.output))
        tensors = {"x": image, "k": weight, "dst": result}
    else:
        loss = graph.tensor(
            name="loss", dim=list(p.output), stride=channels_last(p.output), data_type=io
        )
        result = _with_padding(graph.conv_wgrad, geometry, image=image, loss=loss)
        result.set_output(True).set_dim(list(p.filter)).set_stride(channels_last(p.filter))
        tensors = {"x": image, "k": loss, "dst": result}
    result.set_data_type(io)

    def plans() -> None:
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        if p.dtype == "f32":  # exact f32: no TF32 tensor-core engines
            graph.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])

    steps = [
        ("validate", graph.validate),
        ("build_operation_graph", graph.build_operation_graph),
        ("create_execution_plans", plans),
        ("check_support", graph.check_support),
        ("build_plans", graph.build_plans),
    ]
    for name, run in steps:
        try:
            run()
        except Exception as error:
            raise Decline(f"cuDNN {name} failed for {p.summary}: {error}") from None
    workspace = int(graph.get_workspace_size())
    log.info("cuDNN conv %s: built, workspace %d bytes", p.summary, workspace)
    return Built(graph, tensors, workspace)


def _with_padding(operation, geometry: dict, **operands) -> Any:
    """`operation` with pre/post padding, or one symmetric `padding` for a frontend whose
    binding has no pre/post (then unequal paddings decline)."""
    try:
        return operation(**operands, **geometry)
    except TypeError as error:
        pre, post = geometry["pre_padding"], geometry["post_padding"]
        if pre != post:
            raise Decline(f"this cuDNN frontend takes one padding only ({error})") from None
        rest = {k: v for k, v in geometry.items() if k not in ("pre_padding", "post_padding")}
        return operation(**operands, padding=pre, **rest)


# -- the library step --------------------------------------------------------------------------


@dataclass(frozen=True)
class CudnnConv:
    """The `LibraryStep` of one cuDNN convolution: its scratch is cuDNN's workspace."""

    problem: Problem
    workspace: int

    @property
    def scratch_bytes(self) -> int:
        return self.workspace + ALIGN  # the scratch base is aligned up to ALIGN

    def load(self, ordinal: int) -> Issuer:
        if ordinal != 0:
            raise Decline("cuDNN conv plans are built on GPU 0 only")
        return Issuer(self, built(self.problem))


def kernel_call(op: Operation) -> KernelCall:
    """The library call of a kept conv (its operands laid out by `operand_orders`)."""
    problem = problem_of(*op.operand_types, op.type, op.attrs)
    step = CudnnConv(problem, built(problem).workspace)
    digest = hashlib.sha256(repr(problem).encode()).hexdigest()[:16]
    symbol = f"accy_cudnn_conv_{problem.mode}_{digest}"
    x, kernel = op.operand_types
    parameters = (("dst", op.type), ("x", x), ("k", kernel))
    return KernelCall.of_library("conv", symbol, parameters, f"cuDNN conv {problem.summary}", step)


class Issuer:
    """Enqueues one cuDNN convolution on the bound stream (see `LibraryStep`)."""

    def __init__(self, step: CudnnConv, graph: Built):
        import cupy

        self.step, self.graph, self.stream = step, graph, 0
        self._warm_up(cupy)

    def bind(self, stream: int) -> None:
        self.stream = int(stream)
        cudnn_library.bind(self.stream)

    def _warm_up(self, cupy) -> None:
        """Run once on zeroed buffers outside any capture (cuDNN's lazy setup happens now)."""
        p = self.problem
        item = 4 if p.dtype == "f32" else 2
        sizes = [math.prod(p.image), math.prod(p.filter if p.mode == "fprop" else p.output)]
        result = math.prod(p.output if p.mode == "fprop" else p.filter)
        stream = cupy.cuda.Stream(non_blocking=True)
        buffers = [cupy.zeros(n * item, cupy.uint8) for n in sizes]
        dst = cupy.zeros(result * item, cupy.uint8)
        scratch = cupy.zeros(self.step.scratch_bytes, cupy.uint8)
        previous = self.stream
        self.bind(stream.ptr)
        with stream:
            self.issue(dst.data.ptr, tuple(b.data.ptr for b in buffers), scratch.data.ptr)
        stream.synchronize()
        self.stream = previous
        if previous:
            self.bind(previous)

    @property
    def problem(self) -> Problem:
        return self.step.problem

    def issue(self, dst: int, operands: Sequence[int], scratch: int) -> None:
        h = handle(0)
        cudnn_library.module().set_stream(h, self.stream)
        tensors = self.graph.tensors
        pointers = {"x": operands[0], "k": operands[1], "dst": dst}
        pack = {int(tensors[name].uid): int(address) for name, address in pointers.items()}
        workspace = -(-scratch // ALIGN) * ALIGN
        self.graph.graph.execute(pack, int(workspace), handle=h)


@memoized("cudnn conv availability")
def available() -> bool:
    """Whether cuDNN can be imported here (the tests' gate; a GPU is needed to build graphs)."""
    try:
        cudnn_library.module()
    except Decline:
        return False
    return True
