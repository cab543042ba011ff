"""Windowed operations with named axes: convolution (the kind `conv`, and its composition)
and reduce_window (the kinds of `core/kinds/pooling.py`, and their compositions).

`conv` checks its axes, resolves padding and groups (a paired axis) and emits the kind, whose
derivatives are convolutions (`core/kinds/convolution.py`). `conv_by_windows` is that kind
composed of GEMMs (BLAS on the CPU and cuBLAS on CUDA); the backends lower `conv` so where they
have no library call for it. With fewer input channels than outputs it gathers every window
position into new axes `<axis>_window` (im2col: one strided slice of the padded input per
window offset) and contracts them with the kernel; otherwise it contracts first and sums
shifted slices of the products (see `conv_by_windows`).
`reduce_window` checks its axes and emits the kind `reduce_window` (sum, max, min), whose
derivatives are windowed kinds too; max and min send theirs to each window's first extreme
(row-major), as JAX's reduce_window does (a plain reduction's shares ties evenly). The
compositions the backends without loops of their own run (`reduce_window_by_windows`,
`select_and_gather_by_windows`, `select_and_scatter_by_windows`) gather windows alike (windows
that tile their axis, stride = window, are a reshape instead) and reduce or mask them; prod and
bool operands are such a composition from the start.

Padding: "valid" (none), "same" (output extent ceil(n / stride), the odd element after, as
JAX and TensorFlow), or one (low, high) pair per spatial axis; negative widths crop.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from ..errors import AxisError, TypeRuleError
from .kinds.convolution import axis_roles, conv_attrs
from .kinds.pooling import reduced_type, window_attrs
from .kinds.registry import rule_for
from .types import HALF_FLOATS, TensorType, bool_, f32, i32

Pair = tuple[int, int]
WINDOW_OPS = ("sum", "max", "min", "prod")


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


def _few_channels(x, kernel, attrs) -> bool:
    """Fewer input channels than outputs: gathering the windows (the input once per window
    offset) writes less than the shifted sum's products (once per offset and output) and makes
    a deeper GEMM. A one-channel image's first convolution is a 1-deep GEMM otherwise."""
    roles = axis_roles(x, kernel, attrs)
    channels = math.prod(kernel.extent(a) for a in roles["contract"])
    return channels < math.prod(kernel.extent(a) for a in roles["outputs"])


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


def _tiling(attrs) -> bool:
    """Whether a windowed kind's windows tile their axes: stride = window, no dilation."""
    return attrs["stride"] == attrs["window"] and all(r == 1 for r in attrs["dilation"])


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
        """The kind `conv` composed of pad (interior for lhs_dilation), strided slices and
        contractions (GEMMs), laid out as the kind's result. The backends lower `conv` this
        way where they have no library for it. Three ways, by shape:

        - fewer input channels than outputs, a window no larger than the output: im2col, the
          input gathered once per window offset (`_gathered`), one GEMM as deep as the window
          times the channels (the shifted sum below would write more and make a GEMM only as
          deep as the channels: 1 for a grey image);
        - otherwise, a window no larger than the output (forward convolutions, input gradients): one
          contraction of the padded input with every kernel element (a GEMM with the window
          offsets among its columns), then the sum over offsets of strided slices of it;
        - a window larger than the output (kernel gradients, whose window is the whole
          cotangent): one contraction per output position, of the window's slice of the
          padded input with the kernel, the results concatenated.
        """
        spatial = tuple(attrs["spatial"])
        contract = tuple(attrs["contract"])
        out_type = rule_for("conv").infer((x.ty, kernel.ty), attrs)
        for i, axis in enumerate(spatial):
            ld, low, high = attrs["lhs_dilation"][i], attrs["low"][i], attrs["high"][i]
            if ld > 1:
                x = self.pad(x, axis, 0, 0, 0, interior=ld - 1)
            if (low, high) != (0, 0):
                x = self.pad(x, axis, low, high, 0)
        windows = [kernel.ty.extent(a) for a in spatial]
        outputs = [out_type.extent(a) for a in spatial]
        # 16-bit floats: every product summed in f32 and rounded once, as the kind's.
        wide = f32 if x.ty.dtype in HALF_FLOATS else None
        if math.prod(windows) <= math.prod(outputs) and _few_channels(x.ty, kernel.ty, attrs):
            result = self._gathered(x, kernel, attrs, spatial, contract, outputs, wide)
        elif math.prod(windows) <= math.prod(outputs):
            result = self._shifted_sum(x, kernel, attrs, spatial, contract, outputs, wide)
        else:
            result = self._per_position(x, kernel, attrs, spatial, contract, outputs, wide)
        return self.transpose(self.convert(result, out_type.dtype), out_type.axes)

    def _gathered(self, x, kernel, attrs, spatial, contract, outputs, wide):
        """im2col: the padded input's windows gathered once, an axis `<axis>_window` per
        spatial axis (one strided slice of the input per window offset), then one contraction
        over the window offsets and the channels together: a GEMM as deep as the window times
        the channels. The window axes go just before the channels, so the gather copies runs of
        channels and the patches' contracted axes are in the kernel's order."""
        named = {a: f"{a}_window" for a in spatial}
        before = min(x.ty.position(a) for a in contract)
        for i, axis in enumerate(spatial):
            stride, dilation = attrs["stride"][i], attrs["rhs_dilation"][i]
            span = (outputs[i] - 1) * stride + 1
            pieces = []
            for offset in range(kernel.ty.extent(axis)):
                start = offset * dilation
                piece = self.slice(x, axis, start, start + span, stride)
                extents = list(piece.ty.named_extents)
                extents.insert(before + i, (named[axis], 1))
                pieces.append(self.reshape(piece, extents))
            x = pieces[0] if len(pieces) == 1 else self.concatenate(pieces, named[axis])
        kernel = self.rename_axes(kernel, [named.get(a, a) for a in kernel.ty.axes])
        return self.contract(x, kernel, (*named.values(), *contract), accumulate=wide)

    def _shifted_sum(self, x, kernel, attrs, spatial, contract, outputs, wide):
        """sum over offsets t of products[position * stride + t * dilation, t]."""
        named = {a: f"{a}_window" for a in spatial}
        kernel = self.rename_axes(kernel, [named.get(a, a) for a in kernel.ty.axes])
        products = self.contract(x, kernel, contract, accumulate=wide)
        total = None
        ranges = [range(kernel.ty.extent(named[a])) for a in spatial]
        for offsets in itertools.product(*ranges):
            term = products
            for i, (axis, t) in enumerate(zip(spatial, offsets, strict=True)):
                start = t * attrs["rhs_dilation"][i]
                stop = start + (outputs[i] - 1) * attrs["stride"][i] + 1
                term = self.slice(term, axis, start, stop, attrs["stride"][i])
                term = self.slice(term, named[axis], t, t + 1)
            term = self.reshape(
                term, [(a, e) for a, e in term.ty.named_extents if a not in named.values()]
            )
            total = term if total is None else self.add(total, term)
        return total

    def _per_position(self, x, kernel, attrs, spatial, contract, outputs, wide):
        """One contraction per output position (its window's slice of `x` with the whole
        kernel), each given the spatial axes back (extent 1), concatenated along them."""
        results = {}
        for position in itertools.product(*(range(m) for m in outputs)):
            piece = x
            for i, (axis, r) in enumerate(zip(spatial, position, strict=True)):
                start = r * attrs["stride"][i]
                dilation = attrs["rhs_dilation"][i]
                stop = start + (kernel.ty.extent(axis) - 1) * dilation + 1
                piece = self.slice(piece, axis, start, stop, dilation)
            product = self.contract(piece, kernel, (*contract, *spatial), accumulate=wide)
            results[position] = self.reshape(
                product, [*product.ty.named_extents, *((a, 1) for a in spatial)]
            )
        for level in range(len(spatial) - 1, -1, -1):  # concatenate the last axis first
            merged = {}
            for position in itertools.product(*(range(m) for m in outputs[:level])):
                pieces = [results[(*position, r)] for r in range(outputs[level])]
                merged[position] = (
                    pieces[0] if len(pieces) == 1 else self.concatenate(pieces, spatial[level])
                )
            results = merged
        return results[()]

    def reduce_window(self, x, op: str, window, stride=None, padding="valid", dilation=1):
        """Reduce `op` (sum, max, min, prod) over windows: `window` maps axis -> extent;
        `stride` (default: the window) and `dilation` map axis -> int or are one int; padding
        as `conv` (filled with `op`'s identity). The derivative of max (min) goes to each
        window's first maximum (minimum) in the row-major order of x's axes, as JAX's.
        sum, max and min are the kind `reduce_window` (one pass); prod, and bool operands,
        its composition (`reduce_window_by_windows`), whose derivative is the reduction's.

        >>> import accy
        >>> p = accy.trace.define("m", [accy.spec(accy.f32, w=4)],
        ...                       lambda b, a: a[0].reduce_window("max", {"w": 2}).sum())
        >>> accy.reference.run(accy.grad(p), [[3.0, 3.0, 1.0, 2.0]])[0].tolist()
        [1.0, 0.0, 0.0, 1.0]
        """
        if op not in WINDOW_OPS:
            raise TypeRuleError(f"reduce_window: op {op!r} is not one of {WINDOW_OPS}")
        self._require_axes("reduce_window", x, tuple(window))
        given = tuple(window)
        axes = tuple(a for a in x.ty.axes if a in window)  # row-major in x's layout

        def per_axis(name, value):  # one value per axis of `axes`, from `given`'s order
            return tuple(
                dict(zip(given, _per_axis(name, value, given), strict=True))[a] for a in axes
            )

        sizes = tuple(window[a] for a in axes)
        strides = per_axis("stride", sizes if stride is None else stride)
        dilations = per_axis("dilation", dilation)
        for axis, k, s, r in zip(axes, sizes, strides, dilations, strict=True):
            if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in (k, s, r)):
                raise AxisError(
                    f"window {k}, stride {s} and dilation {r} of {axis!r} must all be >= 1"
                )
        if not isinstance(padding, str):
            padding = list(per_axis("padding", padding))
        extents = [x.ty.extent(a) for a in axes]
        pairs = padding_pairs(padding, extents, sizes, strides, dilations)
        attrs = window_attrs(op, axes, sizes, strides, pairs, dilations)
        if op == "prod" or x.ty.dtype == bool_:  # differentiable (prod) or not at all (bool)
            reduced_type("reduce_window", x.ty, attrs)  # the kind's errors, for any op
            return self.reduce_window_by_windows(x, attrs)
        return self.emit("reduce_window", [x], attrs)

    def _window_fill(self, op: str, dtype):
        fill = {"sum": 0, "prod": 1}.get(op)
        return self.extreme_value(dtype, lowest=op == "max") if fill is None else fill

    def _patches(self, x, attrs, fill):
        """The windows of `x` (a kind's attributes) as new axes `<axis>_window`: a reshape
        where they tile their axes, else gathered (`windows`)."""
        axes, sizes = attrs["axes"], attrs["window"]
        pairs = list(zip(attrs["low"], attrs["high"], strict=True))
        if _tiling(attrs):
            return self._tiles(x, axes, sizes, pairs, fill)
        return self.windows(x, axes, sizes, attrs["stride"], attrs["dilation"], pairs, fill)

    def reduce_window_by_windows(self, x, attrs):
        """The kind `reduce_window` composed of its windows (`_patches`) and one reduction:
        how a backend without its own loops runs it."""
        op = attrs["op"]
        fill = self._window_fill(op, x.ty.dtype)
        patches = self._patches(x, attrs, fill)
        return self.reduce(patches, fill, op, [f"{a}_window" for a in attrs["axes"]])

    def _chosen(self, x, attrs):
        """x's windows (`_patches`) and a bool mask over them: each window's first extreme
        (the first NaN, else the first maximum or minimum), padded positions included."""
        op = attrs["op"]
        patches = self._patches(x, attrs, self._window_fill(op, x.ty.dtype))
        order = [f"{a}_window" for a in attrs["axes"]]
        offsets = TensorType(i32, tuple((a, patches.ty.extent(a)) for a in order))
        position, scale = None, 1
        for axis in reversed(order):  # the flat offset within the window
            term = self.iota(offsets, axis)
            term = term if scale == 1 else self.mul(term, scale)
            position = term if position is None else self.add(position, term)
            scale *= offsets.extent(axis)
        reduce = self.reduce_max if op == "max" else self.reduce_min
        hits = self.compare("eq", patches, reduce(patches, order))
        if patches.ty.dtype.is_float:
            hits = self.binary("or", hits, self.compare("ne", patches, patches))
        first = self.reduce_min(self.select(hits, position, scale), order)
        return patches, self.compare("eq", position, first)

    def select_and_gather_by_windows(self, t, x, attrs):
        """The kind `select_and_gather_add` composed: t's windows, masked by x's first
        extremes (`_chosen`), summed over each window."""
        _, chosen = self._chosen(x, attrs)
        tangents = self._patches(t, attrs, 0)
        zero = 0.0 if t.ty.dtype.is_float else 0
        picked = self.select(chosen, tangents, zero)
        return self.reduce(picked, zero, "sum", [f"{a}_window" for a in attrs["axes"]])

    def select_and_scatter_by_windows(self, s, x, attrs):
        """The kind `select_and_scatter_add` composed: `s` placed at x's first extremes
        (`_chosen`) over the windows, then the windows added back where they came from (the
        transpose of `_patches`)."""
        patches, chosen = self._chosen(x, attrs)
        zero = 0.0 if s.ty.dtype.is_float else 0
        placed = self.transpose(self.select(chosen, s, zero), patches.ty.axes)
        return self.transpose(self._unpatched(placed, x.ty, attrs), x.ty.axes)

    def _unpatched(self, patches, x_type: TensorType, attrs):
        """The transpose of `_patches`: values over x's windows added into x's shape."""
        axes = attrs["axes"]
        tiling = _tiling(attrs)
        for i in reversed(range(len(axes))):
            axis, named = axes[i], f"{axes[i]}_window"
            k, low, high = attrs["window"][i], attrs["low"][i], attrs["high"][i]
            padded = x_type.extent(axis) + low + high
            if tiling:
                merged = self.merge(patches, (axis, named), axis)
                whole = merged.ty.extent(axis)
                patches = self.pad(merged, axis, 0, padded - whole, 0) if padded > whole else merged
            else:
                s, r = attrs["stride"][i], attrs["dilation"][i]
                out = patches.ty.extent(axis)
                total = None
                for offset in range(k):
                    piece = self.slice(patches, named, offset, offset + 1)
                    kept = [(a, e) for a, e in piece.ty.named_extents if a != named]
                    piece = self.reshape(piece, kept)
                    start = offset * r
                    after = padded - (start + (out - 1) * s + 1)
                    piece = self.pad(piece, axis, start, after, 0, interior=s - 1)
                    total = piece if total is None else self.add(total, piece)
                patches = total
            if (low, high) != (0, 0):
                patches = self.pad(patches, axis, -low, -high, 0)
        return patches

    def _tiles(self, x, axes, sizes, padding, fill):
        """Windows that tile their axes (stride = window, no dilation) without copying: each
        axis padded (`fill`), cropped to whole windows and split into `<axis>` (the window
        positions) and `<axis>_window` (the offsets), a reshape. So a pooling reads its input
        once and its gradient (a reduction's) is elementwise, with no window gathered. None
        where a window would not fit (the general path then says why)."""
        extents = [x.ty.extent(a) for a in axes]
        pairs = padding_pairs(padding, extents, sizes, sizes, [1] * len(axes))
        for axis, k, (low, high) in zip(axes, sizes, pairs, strict=True):
            if k < 1 or x.ty.extent(axis) + low + high < k:
                return None
            if (low, high) != (0, 0):
                x = self.pad(x, axis, low, high, fill)
            whole = x.ty.extent(axis) // k * k
            if whole != x.ty.extent(axis):
                x = self.slice(x, axis, 0, whole)
            x = self.split(x, axis, {axis: whole // k, f"{axis}_window": k})
        return x
