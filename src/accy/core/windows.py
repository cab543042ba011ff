"""Windowed operations with named axes: convolution (the kind `conv`, and its composition)
and reduce_window (a composition of pad, strided slices, concatenate and reduce).

`conv` checks its axes, resolves padding and groups (a paired axis) and emits the kind, whose
derivatives are convolutions (`core/kinds/convolution.py`). `conv_by_windows` is that kind
composed: every window position gathered into new axes `<axis>_window` (im2col: one strided
slice of the padded input per window offset), contracted with the kernel (a GEMM, BLAS on the
CPU and cuBLAS on CUDA); the backends lower `conv` so where they have no library call for it.
`reduce_window` gathers windows alike and reduces them.

Padding: "valid" (none), "same" (output extent ceil(n / stride), the odd element after, as
JAX and TensorFlow), or one (low, high) pair per spatial axis; negative widths crop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import AxisError, TypeRuleError
from .kinds.convolution import axis_roles, conv_attrs
from .kinds.registry import rule_for

Pair = tuple[int, int]


def _per_axis(name: str, value, axes: Sequence[str]) -> tuple:
    """An int (or pair) for every axis, from one value or one per axis."""
    if isinstance(value, Mapping):
        return tuple(value[a] for a in axes)
    if isinstance(value, int) or (name == "padding" and isinstance(value, str)):
        return (value,) * len(axes)
    value = tuple(value)
    if len(value) != len(axes):
        raise AxisError(f"{name} has {len(value)} entries for the {len(axes)} axes {axes}")
    return value


def _positive(name: str, value, axes: Sequence[str]) -> tuple[int, ...]:
    """One positive int per axis (stride, dilation), or an error naming the axis."""
    values = _per_axis(name, value, axes)
    for axis, v in zip(axes, values, strict=True):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise AxisError(f"conv: {name} of axis {axis!r} is {v!r}; use a positive integer")
    return values


def _check_conv_axes(x, kernel, spatial, in_axis: str, out_axis: str, groups: int) -> None:
    """Channels and groups agree: the input's `in_axis` is the kernel's times `groups`, and
    `groups` divides the kernel's `out_axis`."""
    if in_axis in spatial or out_axis in spatial or in_axis == out_axis:
        raise AxisError(
            f"conv: in_axis {in_axis!r}, out_axis {out_axis!r} and the spatial axes {spatial} "
            "must all be different axes"
        )
    if x.has(out_axis):
        raise AxisError(
            f"conv: the input {x} already has the output axis {out_axis!r}; rename one of them"
        )
    channels, per_group = x.extent(in_axis), kernel.extent(in_axis)
    outputs = kernel.extent(out_axis)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise AxisError(f"conv: groups is {groups!r}; use a positive integer")
    if groups == 1 and channels != per_group:
        raise AxisError(
            f"conv: the input's {in_axis!r} has extent {channels} ({x}) but the kernel's has "
            f"{per_group} ({kernel}); they must be equal (or the input's a multiple: groups)"
        )
    if channels % groups or outputs % groups:
        raise AxisError(
            f"conv: {groups} groups must divide the input's {in_axis!r} ({channels}) and the "
            f"kernel's {out_axis!r} ({outputs})"
        )
    if channels != per_group * groups:
        raise AxisError(
            f"conv: with {groups} groups the kernel's {in_axis!r} must be "
            f"{channels // groups} (the input's {channels} / {groups}), got {per_group}"
        )


def padding_pairs(padding, extents, windows, strides, dilations) -> list[Pair]:
    """(low, high) per axis for "valid", "same" or explicit pairs.

    >>> padding_pairs("same", [5], [3], [2], [1])
    [(1, 1)]
    """
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            raise TypeRuleError(f"padding {padding!r}: use 'valid', 'same' or (low, high) pairs")
        if padding == "valid":
            return [(0, 0)] * len(extents)
        pairs = []
        for n, k, s, r in zip(extents, windows, strides, dilations, strict=True):
            total = max((-(-n // s) - 1) * s + (k - 1) * r + 1 - n, 0)
            pairs.append((total // 2, total - total // 2))
        return pairs
    pairs = list(padding)
    if len(pairs) != len(extents) or not all(_is_pair(p) for p in pairs):
        raise AxisError(
            f"padding {padding!r} needs one (low, high) pair of ints per spatial axis "
            f"({len(extents)}), or 'valid' or 'same'"
        )
    return [tuple(p) for p in pairs]


def _is_pair(p) -> bool:
    return (
        isinstance(p, Sequence)
        and len(p) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in p)
    )


class Windows:
    """Convolution and windowed reductions over `OpsApi`'s primitives (a mixin)."""

    def windows(self, x, axes, sizes, strides=1, dilations=1, padding="valid", fill=0):
        """`x` with, for each axis in `axes`, a new axis `<axis>_window` of extent `size` over
        the window offsets, and the axis itself over the window positions."""
        axes = tuple(axes)
        self._require_axes("windows", x, axes)
        sizes = _per_axis("window", sizes, axes)
        strides = _per_axis("stride", strides, axes)
        dilations = _per_axis("dilation", dilations, axes)
        extents = [x.ty.extent(a) for a in axes]
        pairs = padding_pairs(padding, extents, sizes, strides, dilations)
        for axis, k, s, r, (low, high) in zip(axes, sizes, strides, dilations, pairs, strict=True):
            if k < 1 or s < 1 or r < 1:
                raise AxisError(
                    f"window {k}, stride {s} and dilation {r} of {axis!r} must all be >= 1"
                )
            padded = self.pad(x, axis, low, high, fill) if (low, high) != (0, 0) else x
            n = padded.ty.extent(axis)
            span = (k - 1) * r + 1
            if n < span:
                raise AxisError(
                    f"the window of axis {axis!r} spans {span} elements; the padded axis has {n}"
                )
            out = (n - span) // s + 1
            pieces = []
            for offset in range(k):
                start = offset * r
                piece = self.slice(padded, axis, start, start + (out - 1) * s + 1, s)
                named = (*piece.ty.named_extents, (f"{axis}_window", 1))
                pieces.append(self.reshape(piece, named))
            x = pieces[0] if k == 1 else self.concatenate(pieces, f"{axis}_window")
        return x

    def conv(
        self,
        x,
        kernel,
        spatial: Sequence[str],
        in_axis: str,
        out_axis: str,
        stride=1,
        padding="valid",
        dilation=1,
        groups: int = 1,
        lhs_dilation=1,
    ):
        """Convolution (cross-correlation, as every framework) of `x` with `kernel` over the
        `spatial` axes, which both have (the kernel's extents are the window): the kind `conv`.
        `x` has `in_axis` and any batch axes; `kernel` has `spatial`, `in_axis` (channels per
        group) and `out_axis`. The result has `x`'s axes with `in_axis` replaced by
        `out_axis`. `lhs_dilation` spaces the input's elements (a transposed convolution).
        Groups split `in_axis` and `out_axis` into a paired axis `<in_axis>_group`.
        """
        spatial = tuple(spatial)
        self._require_axes("conv", x, (*spatial, in_axis))
        self._require_axes("conv", kernel, (*spatial, in_axis, out_axis))
        _check_conv_axes(x.ty, kernel.ty, spatial, in_axis, out_axis, groups)
        strides = _positive("stride", stride, spatial)
        dilations = _positive("dilation", dilation, spatial)
        lhs_dilations = _positive("lhs_dilation", lhs_dilation, spatial)
        extents = [
            (x.ty.extent(a) - 1) * d + 1 for a, d in zip(spatial, lhs_dilations, strict=True)
        ]
        sizes = [kernel.ty.extent(a) for a in spatial]
        padding = (
            _per_axis("padding", padding, spatial) if not isinstance(padding, str) else padding
        )
        pairs = padding_pairs(padding, extents, sizes, strides, dilations)
        attrs = conv_attrs(spatial, (in_axis,), strides, pairs, lhs_dilations, dilations)
        if groups == 1:
            return self.emit("conv", [x, kernel], attrs)
        group = f"{in_axis}_group"
        per_group, outputs = kernel.ty.extent(in_axis), kernel.ty.extent(out_axis)
        x = self.split(x, in_axis, {group: groups, in_axis: per_group})
        kernel = self.split(kernel, out_axis, {group: groups, out_axis: outputs // groups})
        result = self.emit("conv", [x, kernel], attrs)
        return self.merge(result, (group, out_axis), out_axis)

    def conv_by_windows(self, x, kernel, attrs):
        """The kind `conv` composed of pad (interior for lhs_dilation), strided slices and one
        contraction (im2col: a GEMM), laid out as the kind's result. The backends lower `conv`
        this way where they have no library for it.

        Per spatial axis the patches are gathered by whichever is shorter: the window offsets
        (one slice of every output position per offset, into `<axis>_window`: a forward
        convolution) or the output positions (one slice of the window per position, into
        `<axis>_out`: a kernel gradient, whose window is the whole cotangent).
        """
        spatial = tuple(attrs["spatial"])
        roles = axis_roles(x.ty, kernel.ty, attrs)
        out_type = self._conv_type(x, kernel, attrs)
        summed, renames = list(roles["contract"]), {}
        for i, axis in enumerate(spatial):
            ld, low, high = attrs["lhs_dilation"][i], attrs["low"][i], attrs["high"][i]
            if ld > 1:
                x = self.pad(x, axis, 0, 0, 0, interior=ld - 1)
            if (low, high) != (0, 0):
                x = self.pad(x, axis, low, high, 0)
            k, m = kernel.ty.extent(axis), out_type.extent(axis)
            stride, dilation = attrs["stride"][i], attrs["rhs_dilation"][i]
            if k <= m:
                window = f"{axis}_window"
                x = self._gathered(x, axis, window, k, dilation, m, stride)
                kernel = self.rename(kernel, axis, window)
                summed.append(window)
            else:
                position = f"{axis}_out"
                x = self._gathered(x, axis, position, m, stride, k, dilation)
                summed.append(axis)
                renames[position] = axis
        result = self.contract(x, kernel, summed)
        result = self.rename_axes(result, [renames.get(a, a) for a in result.ty.axes])
        return self.transpose(result, out_type.axes)

    def _gathered(self, x, axis: str, new: str, count: int, step: int, extent: int, stride: int):
        """`x` with a new axis `new` of `count` slices of `axis`: slice j starts at j * step
        and takes `extent` elements `stride` apart."""
        pieces = []
        for j in range(count):
            start = j * step
            piece = self.slice(x, axis, start, start + (extent - 1) * stride + 1, stride)
            pieces.append(self.reshape(piece, (*piece.ty.named_extents, (new, 1))))
        return pieces[0] if count == 1 else self.concatenate(pieces, new)

    def _conv_type(self, x, kernel, attrs):
        return rule_for("conv").infer((x.ty, kernel.ty), attrs)

    def reduce_window(self, x, op: str, window, stride=None, padding="valid", dilation=1):
        """Reduce `op` (sum, max, min, prod) over windows: `window` maps axis -> extent;
        `stride` (default: the window) and `dilation` map axis -> int or are one int; padding
        as `conv` (filled with `op`'s identity)."""
        axes = tuple(window)
        sizes = tuple(window[a] for a in axes)
        stride = sizes if stride is None else stride
        fill = {"sum": 0, "prod": 1}.get(op)
        if fill is None:
            fill = self.extreme_value(x.ty.dtype, lowest=op == "max")
        patches = self.windows(x, axes, sizes, stride, dilation, padding, fill)
        return self.reduce(patches, fill, op, [f"{a}_window" for a in axes])
