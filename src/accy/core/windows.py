"""Windowed operations with named axes: convolution and reduce_window, composed of pad, strided
slices, concatenate, reduce and dot_general (no new kind).

Both gather every window position into new axes `<axis>_window` (im2col: one strided slice of
the padded input per window offset), then contract them with the kernel (a GEMM, BLAS on the
CPU and cuBLAS on CUDA) or reduce them. The derivatives are those of the recorded kinds: the
transposed convolution (pad and slice transpose into each other) and the kernel-gradient
convolution (the contraction's transpose) come out of `grad` without rules of their own.

Padding: "valid" (none), "same" (output extent ceil(n / stride), the odd element after, as
JAX and TensorFlow), or one (low, high) pair per spatial axis; negative widths crop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import AxisError, TypeRuleError

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
    pairs = [tuple(p) for p in padding]
    if len(pairs) != len(extents) or any(len(p) != 2 for p in pairs):
        raise AxisError(f"padding {padding!r} needs one (low, high) pair per spatial axis")
    return pairs


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
    ):
        """Convolution (cross-correlation, as every framework) of `x` with `kernel` over the
        `spatial` axes, which both have (the kernel's extents are the window). `x` has
        `in_axis` and any batch axes; `kernel` has `spatial`, `in_axis` (channels per group)
        and `out_axis`. The result has `x`'s axes with `in_axis` replaced by `out_axis`.
        """
        spatial = tuple(spatial)
        self._require_axes("conv", x, (*spatial, in_axis))
        self._require_axes("conv", kernel, (*spatial, in_axis, out_axis))
        channels, per_group = x.ty.extent(in_axis), kernel.ty.extent(in_axis)
        outputs = kernel.ty.extent(out_axis)
        if groups < 1 or channels != per_group * groups or outputs % groups:
            raise AxisError(
                f"conv: {groups} groups need the input's {in_axis!r} ({channels}) to be the "
                f"kernel's ({per_group}) times {groups}, and {out_axis!r} ({outputs}) divisible"
            )
        sizes = [kernel.ty.extent(a) for a in spatial]
        patches = self.windows(x, spatial, sizes, stride, dilation, padding)
        windows = [f"{a}_window" for a in spatial]
        kernel = self.rename_axes(
            kernel, [f"{a}_window" if a in spatial else a for a in kernel.ty.axes]
        )
        if groups == 1:
            result = self.contract(patches, kernel, (in_axis, *windows))
        else:
            group = f"{in_axis}_group"
            patches = self.split(patches, in_axis, {group: groups, in_axis: per_group})
            kernel = self.split(kernel, out_axis, {group: groups, out_axis: outputs // groups})
            result = self.contract(patches, kernel, (in_axis, *windows))
            result = self.merge(result, (group, out_axis), out_axis)
        order = [out_axis if a == in_axis else a for a in x.ty.axes]
        return self.transpose(result, order)

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
