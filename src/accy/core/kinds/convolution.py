"""`conv`: convolution (cross-correlation, as every framework) over named spatial axes.

`conv(x, kernel) {spatial, contract, stride, low, high, lhs_dilation, rhs_dilation}`, as
StableHLO's convolution with named axes instead of dimension numbers:

- `spatial` axes are on both operands; the kernel's extents are the window. Per spatial axis
  (entries positional, like `pad`'s): the input is dilated by `lhs_dilation` (zeros between
  its elements: the transposed convolution), padded by `low`/`high` (negative crops), and
  the dilated window (`rhs_dilation`) moves by `stride`.
- `contract` axes (the input channels) are on both operands and summed.
- other axes on both are *paired* (elementwise, as dot_general's batch axes): groups, and a
  vmapped kernel;
- axes only on the kernel are its outputs (the output channels); axes only on the input are
  batch axes.

The result has the input's axes in order, each spatial axis with its output extent, the
contracted axes replaced by the kernel's output axes (in the kernel's order) at the place of
the first contracted axis (at the end when nothing is contracted).

Why a kind (and groups only in the values API, as a paired axis): the derivatives close over
it. The JVP is bilinear; the transpose in the input is a convolution of the cotangent with the
flipped kernel (outputs contracted, stride and lhs_dilation swapped); the transpose in the
kernel is a convolution of the input with the cotangent (batch axes contracted, stride and
rhs_dilation swapped), as JAX's. The backends lower it whole (cuDNN; the CPU's tiled implicit
GEMM, `accy.lower.convolution`) or as the im2col composition (`core/windows.py`).
"""

from __future__ import annotations

import itertools

import numpy as np

from ...errors import AxisError, TypeRuleError
from ..types import TensorType, bool_, compute_dtype
from .registry import (
    Linear,
    Rule,
    Zero,
    attr,
    batched_operand,
    check_arity,
    check_has_axes,
    check_same_dtype,
    describe,
    register,
)

PER_AXIS = ("stride", "low", "high", "lhs_dilation", "rhs_dilation")


def conv_attrs(spatial, contract, stride, padding, lhs_dilation, rhs_dilation) -> dict[str, tuple]:
    """The attributes of a conv operation from per-axis tuples (`padding`: (low, high) pairs).

    >>> conv_attrs(["h"], ["c"], [2], [(1, 1)], [1], [1])["low"]
    (1,)
    """
    return {
        "spatial": tuple(spatial),
        "contract": tuple(contract),
        "stride": tuple(stride),
        "low": tuple(lo for lo, _ in padding),
        "high": tuple(hi for _, hi in padding),
        "lhs_dilation": tuple(lhs_dilation),
        "rhs_dilation": tuple(rhs_dilation),
    }


def axis_roles(x: TensorType, kernel: TensorType, attrs) -> dict[str, tuple[str, ...]]:
    """The axes by role: spatial, contract, paired (on both), outputs (kernel only), batch
    (input only), each in its operand's order."""
    spatial, contract = tuple(attrs["spatial"]), tuple(attrs["contract"])
    named = set(spatial) | set(contract)
    return {
        "spatial": spatial,
        "contract": contract,
        "paired": tuple(a for a in x.axes if kernel.has(a) and a not in named),
        "outputs": tuple(a for a in kernel.axes if not x.has(a)),
        "batch": tuple(a for a in x.axes if not kernel.has(a)),
    }


def result_axes(x_axes, contract, outputs) -> tuple[str, ...]:
    """The input's axes with the contracted ones replaced by `outputs` at the place of the
    first contracted axis (at the end without one).

    >>> result_axes(("n", "c", "h"), ("c",), ("o",))
    ('n', 'o', 'h')
    """
    kept = [a for a in x_axes if a not in contract]
    at = next((i for i, a in enumerate(x_axes) if a in contract), len(x_axes))
    return (*kept[:at], *outputs, *kept[at:])


def output_extent(n: int, k: int, stride: int, low: int, high: int, ld: int, rd: int) -> int:
    """The extent of one spatial axis of the result (-1 when the window does not fit).

    >>> output_extent(5, 3, 2, 1, 1, 1, 1)
    3
    """
    padded = (n - 1) * ld + 1 + low + high if n else low + high
    span = (k - 1) * rd + 1
    return -1 if padded < span else (padded - span) // stride + 1


def _check_per_axis(attrs, spatial) -> None:
    for name in PER_AXIS:
        values = attr("conv", attrs, name)
        if not isinstance(values, tuple) or len(values) != len(spatial):
            raise TypeRuleError(
                f"conv: {name} needs one integer per spatial axis {spatial}, got {values!r}"
            )
        for axis, v in zip(spatial, values, strict=True):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeRuleError(f"conv: {name} of axis {axis!r} must be an int, got {v!r}")
            if name in ("stride", "lhs_dilation", "rhs_dilation") and v < 1:
                raise TypeRuleError(
                    f"conv: {name} of axis {axis!r} is {v}; it must be a positive integer"
                )


def _infer(types, attrs):
    check_arity("conv", types, 2)
    check_same_dtype("conv", types)
    x, kernel = types
    if x.dtype == bool_:
        raise TypeRuleError(f"conv does not apply to bool operands ({describe(types)})")
    spatial, contract = (
        tuple(attr("conv", attrs, "spatial")),
        tuple(attr("conv", attrs, "contract")),
    )
    named = (*spatial, *contract)
    if len(set(named)) != len(named):
        raise AxisError(f"conv: spatial {spatial} and contract {contract} repeat an axis")
    check_has_axes("conv", x, named, role="input")
    check_has_axes("conv", kernel, named, role="kernel")
    _check_per_axis(attrs, spatial)
    roles = axis_roles(x, kernel, attrs)
    for axis in (*contract, *roles["paired"]):
        if x.extent(axis) != kernel.extent(axis):
            what = "contracted (input channel)" if axis in contract else "paired"
            raise AxisError(
                f"conv: the {what} axis {axis!r} has extent {x.extent(axis)} on the input {x} "
                f"and {kernel.extent(axis)} on the kernel {kernel}; they must be equal"
            )
    extents = dict(x.named_extents)
    for i, axis in enumerate(spatial):
        per = [attrs[name][i] for name in PER_AXIS]
        stride, low, high, ld, rd = per
        m = output_extent(x.extent(axis), kernel.extent(axis), stride, low, high, ld, rd)
        if m < 0:
            raise AxisError(
                f"conv: the kernel's window on axis {axis!r} spans "
                f"{(kernel.extent(axis) - 1) * rd + 1} elements, more than the padded input's "
                f"{(x.extent(axis) - 1) * ld + 1 + low + high} ({x}); pad the input more or use "
                f"a smaller kernel"
            )
        extents[axis] = m
    extents.update((a, kernel.extent(a)) for a in roles["outputs"])
    names = result_axes(x.axes, contract, roles["outputs"])
    return TensorType(x.dtype, tuple((a, extents[a]) for a in names))


def dilated_padded(x: np.ndarray, position: int, ld: int, low: int, high: int, fill=0):
    """`x` along axis `position` with `ld - 1` zeros between elements, then `low`/`high`
    elements before/after (negative: removed), as NumPy arrays.

    >>> dilated_padded(np.array([1, 2]), 0, 2, 1, -1).tolist()
    [0, 1, 0]
    """
    shape = list(x.shape)
    n = shape[position]
    shape[position] = (n - 1) * ld + 1 if n else 0
    dilated = np.full(shape, fill, x.dtype)
    index = [slice(None)] * x.ndim
    index[position] = slice(None, None, ld)
    dilated[tuple(index)] = x
    widths = [(0, 0)] * x.ndim
    widths[position] = (max(low, 0), max(high, 0))
    padded = np.pad(dilated, widths)
    index[position] = slice(-min(low, 0), padded.shape[position] + min(high, 0))
    return padded[tuple(index)]


def conv_reference(x: np.ndarray, k: np.ndarray, xt: TensorType, kt: TensorType, attrs, shape):
    """The convolution by explicit windows: for every kernel offset, the strided slice of the
    dilated, padded input that it meets, multiplied with that kernel element (an einsum over
    named letters), summed over offsets. In the compute dtype (the caller rounds); `shape` is
    the result's."""
    spatial = attrs["spatial"]
    dtype = compute_dtype(xt.dtype).numpy
    x, k = x.astype(dtype), k.astype(dtype)
    for i, axis in enumerate(spatial):
        x = dilated_padded(
            x, xt.position(axis), attrs["lhs_dilation"][i], attrs["low"][i], attrs["high"][i]
        )
    roles = axis_roles(xt, kt, attrs)
    out_axes = result_axes(xt.axes, roles["contract"], roles["outputs"])
    letters = {a: chr(ord("a") + i) for i, a in enumerate(dict.fromkeys((*xt.axes, *kt.axes)))}
    kernel_axes = [a for a in kt.axes if a not in spatial]
    subscripts = (
        "".join(letters[a] for a in xt.axes)
        + ","
        + "".join(letters[a] for a in kernel_axes)
        + "->"
        + "".join(letters[a] for a in out_axes)
    )
    windows = [kt.extent(a) for a in spatial]
    out_extents = {}
    for i, axis in enumerate(spatial):
        span = (windows[i] - 1) * attrs["rhs_dilation"][i] + 1
        out_extents[axis] = (x.shape[xt.position(axis)] - span) // attrs["stride"][i] + 1
    total = None
    for offsets in itertools.product(*(range(w) for w in windows)):
        piece = [slice(None)] * x.ndim
        kernel_index = [slice(None)] * k.ndim
        for i, axis in enumerate(spatial):
            start = offsets[i] * attrs["rhs_dilation"][i]
            stop = start + (out_extents[axis] - 1) * attrs["stride"][i] + 1
            piece[xt.position(axis)] = slice(start, stop, attrs["stride"][i])
            kernel_index[kt.position(axis)] = offsets[i]
        term = np.einsum(subscripts, x[tuple(piece)], k[tuple(kernel_index)])
        total = term if total is None else total + term
    return np.zeros(shape, dtype) if total is None else total  # None: an empty window


def _evaluate(attrs, args, ev):
    xt, kt = ev.operand_types
    shape = ev.result_types[0].extents
    return conv_reference(np.asarray(args[0]), np.asarray(args[1]), xt, kt, attrs, shape)


def _jvp(e, op, primals, tangents, outputs):
    """Bilinear: conv(dx, k) + conv(x, dk)."""
    x, k = primals
    dx, dk = tangents
    left = Zero(op.type) if isinstance(dx, Zero) else e.emit("conv", [dx, k], op.attrs)
    right = Zero(op.type) if isinstance(dk, Zero) else e.emit("conv", [x, dk], op.attrs)
    return e.add_tangents(left, right)


def _input_cotangent(e, op, ct, kernel):
    """The transposed convolution: the cotangent with the flipped kernel, the kernel's
    outputs contracted and its contracted axes produced; stride and lhs_dilation swap."""
    xt, kt = op.operand_types
    attrs = op.attrs
    roles = axis_roles(xt, kt, attrs)
    low, high = [], []
    for i, axis in enumerate(roles["spatial"]):
        n, k, m = xt.extent(axis), kt.extent(axis), op.type.extent(axis)
        span = (k - 1) * attrs["rhs_dilation"][i] + 1
        before = span - attrs["low"][i] - 1
        dilated_in = (n - 1) * attrs["lhs_dilation"][i] + 1 if n else 0
        dilated_out = (m - 1) * attrs["stride"][i] + 1 if m else 0
        low.append(before)
        high.append(dilated_in + span - 1 - dilated_out - before)
    flipped = kernel
    for axis in roles["spatial"]:
        flipped = e.flip(flipped, axis)
    new = conv_attrs(
        roles["spatial"],
        roles["outputs"],
        attrs["lhs_dilation"],
        list(zip(low, high, strict=True)),
        attrs["stride"],
        attrs["rhs_dilation"],
    )
    result = e.emit("conv", [ct, flipped], new)
    return e.transpose(result, xt.axes)


def _kernel_cotangent(e, op, ct, x):
    """The kernel-gradient convolution: the input with the cotangent as the kernel, batch axes
    contracted, the cotangent's outputs produced; stride and rhs_dilation swap."""
    xt, kt = op.operand_types
    attrs = op.attrs
    roles = axis_roles(xt, kt, attrs)
    high = []
    for i, axis in enumerate(roles["spatial"]):
        n, k, m = xt.extent(axis), kt.extent(axis), op.type.extent(axis)
        span = (k - 1) * attrs["rhs_dilation"][i] + 1
        dilated_in = (n - 1) * attrs["lhs_dilation"][i] + 1 if n else 0
        dilated_out = (m - 1) * attrs["stride"][i] + 1 if m else 0
        high.append(dilated_out - dilated_in + span - attrs["low"][i] - 1)
    new = conv_attrs(
        roles["spatial"],
        roles["batch"],
        attrs["rhs_dilation"],
        list(zip(attrs["low"], high, strict=True)),
        attrs["lhs_dilation"],
        attrs["stride"],
    )
    result = e.emit("conv", [x, ct], new)
    return e.transpose(result, kt.axes)


def _transpose(e, op, ct, operands):
    x, k = operands
    if isinstance(x, Linear) and isinstance(k, Linear):
        raise TypeRuleError("conv of two linear values is not linear")
    if isinstance(x, Linear):
        return [e.convert(_input_cotangent(e, op, ct, k), x.type.dtype), None]
    return [None, e.convert(_kernel_cotangent(e, op, ct, x), k.type.dtype)]


def _batch(e, op, operands, batched, ctx):
    """A batched input alone: the batch axis is one more batch axis (first in the result, as
    it is first in the input). A batched kernel: the input is repeated along it, so that it is
    a paired axis (each kernel meets its own input)."""
    x, k = operands
    if batched[1]:
        x, k = (batched_operand(e, v, b, ctx) for v, b in zip(operands, batched, strict=True))
    return e.emit("conv", [x, k], op.attrs)


register(Rule("conv", _infer, _evaluate, _jvp, _transpose, arity=2, batch=_batch))
