"""FP8 GEMMs with per-tensor current scaling: `fp8_matmul`, and `Fp8Policy`, which picks them.

`fp8_matmul(x, w, axes)` is `x.contract(w, axes)` computed as Transformer Engine's FP8 linear
layers compute it. Each operand's amax (its largest |value|) gives its scale, fp8_max / amax
(1 when amax is 0 or not finite). The amax is an operation of the program (`amax_of`), an
operand of the GEMM's record: the GEMMs that quantise one tensor share one (`x` feeding two
projections, an output gradient feeding both GEMMs of the VJP), and the compiler may compute it
where the tensor is made. The operand times its scale is rounded to float8, saturating
(`accy.core.types.saturate_to_float8`); the float8 products are summed in f32, and the sum
times both inverse scales is the result, in the operands' dtype (or `out`). The forward GEMM
takes both operands in E4M3 (`float8_e4m3fn`); the two GEMMs of its VJP take the output
gradient in E5M2 (`float8_e5m2`: more range, less precision) and the other operand in its
forward format, through the same record, each laid out so that its result is the gradient's
layout. Forward mode (JVP) and the VJP's own derivatives treat the quantisation as the identity
(the straight-through estimator), in the operands' dtype.

One `accy.CustomCall` record per signature (contracted axes, formats, result dtype) holds it
all: its reference (NumPy, through ml_dtypes), its fallback composition, which the CPU runs
(the same quantisation from elementwise operations, then an f32 GEMM: bitwise the reference's
float8 values), its CUDA step (`accy.backends.cuda.fp8`: cuBLASLt FP8), its JVP and VJP.

>>> import accy, numpy as np
>>> rng = np.random.default_rng(0)
>>> x = accy.named(rng.normal(size=(4, 16)).astype(np.float32), ("token", "embed"))
>>> w = accy.named(rng.normal(size=(16, 8)).astype(np.float32), ("embed", "hidden"))
>>> y = accy.nn.fp8_matmul(x, w, "embed")
>>> exact = x.array @ w.array
>>> y.shape, bool(np.linalg.norm(y.array - exact) < 0.05 * np.linalg.norm(exact))
({'token': 4, 'hidden': 8}, True)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.cuda import fp8 as cuda_fp8
from ..core.operations import check_contracted_axes
from ..core.types import (
    DType,
    TensorType,
    bf16,
    dtype_named,
    f16,
    f32,
    float8_e4m3fn,
    float8_e5m2,
    float8_format,
    i32,
    saturate_to_float8,
)
from ..custom import CustomCall, register
from ..errors import AccyError, AxisError, DTypeError, TypeRuleError
from .module import Module

OPERAND_DTYPES = (f32, bf16, f16)
"""The dtypes `fp8_matmul` takes (both operands the same)."""


@dataclass(frozen=True)
class Signature:
    """One FP8 GEMM: the contracted axes (in the order both operands enumerate them), each
    operand's axes in layout order, the float8 format of each operand, the format of an output
    gradient, the result's dtype."""

    axes: tuple[str, ...]
    layouts: tuple[tuple[str, ...], tuple[str, ...]]
    formats: tuple[str, str]
    gradient: str
    out: str

    @property
    def target(self) -> str:
        (a, b), (fa, fb) = self.layouts, self.formats
        return (
            f"accy.nn.fp8_matmul[contract={','.join(self.axes)};a={','.join(a)}:{fa};"
            f"b={','.join(b)}:{fb};gradient={self.gradient};out={self.out}]"
        )


def free_axes(t: TensorType, contracted: Sequence[str]) -> tuple[str, ...]:
    """`t`'s axes that are not contracted, in its layout order."""
    return tuple(a for a in t.axes if a not in contracted)


AMAX = TensorType(f32, ())  # an operand's amax: an f32 scalar


def result_type(s: Signature, a: TensorType, b: TensorType, *amaxes: TensorType) -> TensorType:
    """The result of GEMM `s` on `a` and `b` (and their amaxes, f32 scalars): `a`'s free
    axes, then `b`'s, in dtype `s.out`.

    >>> from accy import spec
    >>> s = Signature(("k",), (("m", "k"), ("k", "n")), ("float8_e4m3fn",) * 2, "float8_e5m2",
    ...               "bf16")
    >>> result_type(s, spec(bf16, m=2, k=16), spec(bf16, k=16, n=3))
    <bf16[m=2, n=3]>
    """
    if (a.axes, b.axes) != s.layouts:
        raise TypeRuleError(f"{s.target} takes operands laid out as {s.layouts}, got {a} and {b}")
    if any(t != AMAX for t in amaxes):
        raise TypeRuleError(f"{s.target} takes each operand's amax as {AMAX}, got {amaxes}")
    extents = {**a.shape, **b.shape}
    axes = free_axes(a, s.axes) + free_axes(b, s.axes)
    return TensorType(dtype_named(s.out), tuple((n, extents[n]) for n in axes))


# -- quantisation: NumPy (the reference) and the composition (every backend) ---------------------


def scale_of(amax: np.float32, format: str) -> np.float32:
    """The scale that maps `amax` to the format's largest value: fp8_max / amax, in f32; 1
    when amax is 0, infinite or NaN (Transformer Engine keeps a scale of 1 there too).

    >>> float(scale_of(np.float32(2.0), "float8_e4m3fn"))
    224.0
    >>> float(scale_of(np.float32(0.0), "float8_e5m2"))
    1.0
    """
    amax = np.float32(amax)
    if not (np.isfinite(amax) and amax > 0):
        return np.float32(1.0)
    return np.float32(float8_format(format).max) / amax


def numpy_quantize(
    x: np.ndarray, format: str, amax: np.float32 | None = None
) -> tuple[np.ndarray, np.float32]:
    """`x` scaled by its current per-tensor scale (from `amax`, by default x's own) and rounded
    to `format` (as float32 values), and the inverse scale that maps them back.

    >>> q, inverse = numpy_quantize(np.array([0.5, -1.0, 0.1], np.float32), "float8_e4m3fn")
    >>> q.tolist(), float(inverse) == float(np.float32(1) / np.float32(448))
    ([224.0, -448.0, 44.0], True)
    """
    values = np.asarray(x, np.float32)
    if amax is None:
        amax = np.max(np.abs(values)) if values.size else np.float32(0)
    scale = scale_of(amax, format)
    quantised = saturate_to_float8(values * scale, format).astype(np.float32)
    return quantised, np.float32(1.0) / scale


def numpy_fp8_matmul(
    s: Signature, a: np.ndarray, b: np.ndarray, amax_a: np.ndarray, amax_b: np.ndarray
) -> np.ndarray:
    """The reference of GEMM `s` on arrays `a` and `b` (laid out as `s.layouts`), whose amaxes
    are `amax_a` and `amax_b`."""
    qa, inverse_a = numpy_quantize(a, s.formats[0], amax_a)
    qb, inverse_b = numpy_quantize(b, s.formats[1], amax_b)
    positions = tuple([layout.index(n) for n in s.axes] for layout in s.layouts)
    total = np.tensordot(qa, qb, positions).astype(np.float32)
    return (total * (inverse_a * inverse_b)).astype(dtype_named(s.out).numpy)


def amax_of(e: Any, x: Any) -> Any:
    """Traced: the largest |value| of `x`, an f32 scalar (NaN where `x` holds one).

    >>> import accy, numpy as np
    >>> p = accy.trace.define("amax", [accy.spec(accy.f32, n=3)], lambda b, a: amax_of(b, a[0]))
    >>> float(accy.reference.run(p, [np.array([0.5, -3.0, 1.0], np.float32)])[0])
    3.0
    """
    return e.convert(x, f32).abs().max(None)


def quantize(e: Any, x: Any, format: str, amax: Any) -> tuple[Any, Any]:
    """Traced: `x` scaled (from its `amax`) and rounded to `format` as f32 values, and the f32
    inverse scale (the same numbers as `numpy_quantize`), from elementwise operations.

    >>> import accy, numpy as np
    >>> def body(b, a):
    ...     return quantize(b, a[0], "float8_e4m3fn", amax_of(b, a[0]))[0]
    >>> p = accy.trace.define("q", [accy.spec(accy.f32, n=3)], body)
    >>> accy.reference.run(p, [np.array([0.5, -1.0, 0.1], np.float32)])[0].tolist()
    [224.0, -448.0, 44.0]
    """
    f = float8_format(format)
    values = e.convert(x, f32)
    usable = (amax > 0.0) & (amax < float("inf"))
    scale = e.select(usable, e.scalar(f32, f.max) / e.select(usable, amax, 1.0), 1.0)
    scaled = values * scale
    rounded = round_to_float8(e, scaled, format)
    return rounded, e.scalar(f32, 1.0) / scale


def round_to_float8(e: Any, x: Any, format: str) -> Any:
    """Traced: f32 `x` rounded to the float8 `format` (ties to even), saturating, kept in f32.

    The quantum at |x| is 2^(max(exponent of |x|, the format's smallest normal exponent) -
    mantissa bits): |x| over it, rounded to an integer (ties to even), times it again. Both
    steps are exact in f32, so the result is the format's nearest value, as ml_dtypes rounds.
    """
    f = float8_format(format)
    magnitude = x.abs().min(f.max)
    exponent = e.binary("shift_right_logical", e.bitcast_convert(magnitude, i32), 23)
    smallest = e.scalar(i32, 127 + f.min_exponent)
    quantum_exponent = e.maximum(exponent, smallest) - f.mantissa_bits
    quantum = e.bitcast_convert(e.binary("shift_left", quantum_exponent, 23), f32)
    rounded = e.unary("round", magnitude / quantum) * quantum
    return e.select(x < 0.0, -rounded, rounded)


def composition(e: Any, s: Signature, a: Any, b: Any, amax_a: Any, amax_b: Any) -> Any:
    """Traced: GEMM `s` from the quantisation above and an f32 contraction (the CPU's)."""
    qa, inverse_a = quantize(e, a, s.formats[0], amax_a)
    qb, inverse_b = quantize(e, b, s.formats[1], amax_b)
    total = e.contract(qa, qb, s.axes)
    return e.convert(total * (inverse_a * inverse_b), dtype_named(s.out))


# -- derivatives ----------------------------------------------------------------------------------


def _straight_through(e: Any, s: Signature, primals: list, tangents: list) -> Any:
    """The JVP with quantisation as the identity: da·b + a·db in the operands' dtype (the
    amaxes' tangents do not enter)."""
    a, b = primals[:2]
    total = e.add(e.contract(tangents[0], b, s.axes), e.contract(a, tangents[1], s.axes))
    return e.convert(total, dtype_named(s.out))


def _gradient(e: Any, s: Signature, cotangent: tuple, other: tuple, other_format: str, target):
    """The GEMM of `cotangent` (in `s.gradient`) and `other`, each given as (value, its amax),
    over the axes they share that the result lacks, ordered so that its result is `target`'s
    layout where either order gives it (else transposed to it), in `target`'s dtype."""
    (cotangent, cotangent_amax), (other, other_amax) = cotangent, other
    contracted = tuple(n for n in other.ty.axes if not target.has(n))
    c, o, out = cotangent.ty.axes, other.ty.axes, target.dtype.name
    first = free_axes(cotangent.ty, contracted) + free_axes(other.ty, contracted)
    swapped = free_axes(other.ty, contracted) + free_axes(cotangent.ty, contracted)
    if swapped == target.axes and first != target.axes:
        other_first = Signature(contracted, (o, c), (other_format, s.gradient), s.gradient, out)
        return gemm(other_first).call(e, other, cotangent, other_amax, cotangent_amax)
    formats = (s.gradient, other_format)
    record = gemm(Signature(contracted, (c, o), formats, s.gradient, out))
    result = record.call(e, cotangent, other, cotangent_amax, other_amax)
    return result if first == target.axes else e.transpose(result, target.axes)


def _vjp(s: Signature) -> Callable:
    def vjp(e: Any, primals: list, result: Any, cotangent: Any) -> list:
        a, b, amax_a, amax_b = primals
        gradient = (cotangent, amax_of(e, cotangent))  # one amax for both GEMMs
        da = _gradient(e, s, gradient, (b, amax_b), s.formats[1], a.ty)
        db = _gradient(e, s, gradient, (a, amax_a), s.formats[0], b.ty)
        return [da, db, None, None]

    return vjp


def _declines_everywhere(operand_types: Sequence[TensorType], result: TensorType) -> None:
    """The CPU's kernel: none, so the CPU runs the fallback composition."""
    return None


def gemm(s: Signature) -> CustomCall:
    """The record of GEMM signature `s`, registered (again, if a test's cleanup dropped it)."""
    record = record_for(s)
    register(record)
    return record


@functools.cache  # not a cache: one record per signature for the process's life
def record_for(s: Signature) -> CustomCall:
    """The custom-call record of GEMM signature `s` (made once, registered by `gemm`).

    >>> r = record_for(Signature(("k",), (("m", "k"), ("k", "n")), ("float8_e4m3fn",) * 2,
    ...                          "float8_e5m2", "f32"))
    >>> r.target
    'accy.nn.fp8_matmul[contract=k;a=m,k:float8_e4m3fn;b=k,n:float8_e4m3fn;gradient=float8_e5m2;out=f32]'
    >>> sorted(r.kernels)
    ['cpu_object', 'cuda_ptx']
    """
    return CustomCall(
        s.target,
        result_type=lambda a, b, amax_a, amax_b: result_type(s, a, b, amax_a, amax_b),
        reference=lambda a, b, amax_a, amax_b: numpy_fp8_matmul(s, a, b, amax_a, amax_b),
        jvp=lambda e, primals, tangents, result: _straight_through(e, s, primals, tangents),
        vjp=_vjp(s),
        fallback=lambda a, b, amax_a, amax_b: composition(a.builder, s, a, b, amax_a, amax_b),
        kernels={"cpu": _declines_everywhere, "cuda": cuda_fp8.kernel_factory(s)},
        register=False,
    )


# -- the function -------------------------------------------------------------------------------


def fp8_matmul(
    x: Any,
    w: Any,
    axes: str | Sequence[str],
    *,
    out: DType | None = None,
    formats: tuple[DType, DType] = (float8_e4m3fn, float8_e4m3fn),
    gradient: DType = float8_e5m2,
) -> Any:
    """`x.contract(w, axes)` as an FP8 GEMM with per-tensor current scaling (module docstring):
    `x` and `w` quantised to `formats` (E4M3 both), summed in f32, the result in `out` (the
    operands' dtype by default); its gradients are FP8 GEMMs too, the output gradient in
    `gradient` (E5M2). Every axis the two share must be contracted.

    >>> import accy, numpy as np
    >>> x = accy.named(np.full((2, 16), 0.5, np.float32), ("token", "embed"))
    >>> w = accy.named(np.full((16, 3), 0.25, np.float32), ("embed", "hidden"))
    >>> np.round(accy.nn.fp8_matmul(x, w, "embed").array, 5).tolist()  # 1 / scale is inexact
    [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    """
    contracted = (axes,) if isinstance(axes, str) else tuple(axes)
    _check(x, w, contracted, formats, gradient)
    out = x.ty.dtype if out is None else out
    if not isinstance(out, DType) or out not in OPERAND_DTYPES:
        raise DTypeError(f"fp8_matmul: out must be accy.f32, accy.bf16 or accy.f16, got {out!r}")
    layouts = (x.ty.axes, w.ty.axes)
    s = Signature(contracted, layouts, (formats[0].name, formats[1].name), gradient.name, out.name)
    e = x.builder
    return gemm(s).call(e, x, w, amax_of(e, x), amax_of(e, w))


def _check(x: Any, w: Any, axes: tuple[str, ...], formats, gradient) -> None:
    for name, value in (("x", x), ("w", w)):
        t = getattr(value, "ty", None)
        if not isinstance(t, TensorType):
            raise AccyError(f"fp8_matmul: {name} must be an array or traced value, got {value!r}")
        if t.dtype not in OPERAND_DTYPES:
            raise DTypeError(
                f"fp8_matmul: {name} is {t}; it takes f32, bf16 or f16 operands (it quantises "
                "them to float8 itself)"
            )
    if x.ty.dtype != w.ty.dtype:
        raise DTypeError(f"fp8_matmul: x is {x.ty} but w is {w.ty}; give both one dtype")
    if not axes:
        raise AxisError("fp8_matmul: name at least one axis to contract")
    check_contracted_axes("fp8_matmul", x.ty, w.ty, axes, ("x", "w"))
    shared = [n for n in x.ty.axes if w.ty.has(n) and n not in axes]
    if shared:
        raise AxisError(
            f"fp8_matmul: x {x.ty} and w {w.ty} share {', '.join(map(repr, shared))}, which is "
            "not contracted; it multiplies matrices: contract every shared axis, or rename it"
        )
    named = (*formats, gradient)
    if len(formats) != 2 or not all(isinstance(d, DType) for d in named):
        raise DTypeError(
            f"fp8_matmul: formats must be two float8 dtypes and gradient one, got {formats!r} "
            f"and {gradient!r}"
        )
    for d in named:
        float8_format(d)
    if gradient.name == "float8_e5m2" and "float8_e5m2" in (f.name for f in formats):
        raise DTypeError(
            "fp8_matmul: an E5M2 operand's gradient GEMM would multiply two E5M2 matrices, which "
            "cuBLASLt does not; keep the forward formats E4M3"
        )


# -- the policy -----------------------------------------------------------------------------------

GROUPS = {
    "mlp": "the Linear layers inside an MLP (a path component `mlp`)",
    "attention": "the Linear layers of attention (a path component `attn` or `self_attn`)",
    "head": "the output layer: a Linear named `lm_head`, or in a model without one the "
    "unembed of an Embedding over a `vocab` axis (a tied output layer)",
}


@dataclass(frozen=True)
class Fp8Policy:
    """Which GEMMs of a model run in FP8: group names of `GROUPS`, or a predicate on each
    layer's dotted path (`"blocks.layers.mlp.up"`, `"wte"`) that says True for FP8. `apply`
    returns the model with those layers' GEMMs switched to `fp8_matmul`; its arrays (the
    master weights among them) are the same objects.

    >>> import accy
    >>> layer = accy.nn.Linear.init(accy.random.key(0), {"embed": 2}, {"hidden": 4})
    >>> Fp8Policy(("mlp",)).selects("blocks.layers.mlp.up", layer)
    True
    >>> Fp8Policy(("mlp",)).selects("blocks.layers.attn.query", layer)
    False
    """

    groups: tuple[str, ...] | Callable[[str], bool]

    def __post_init__(self) -> None:
        if callable(self.groups):
            return
        if isinstance(self.groups, list):
            object.__setattr__(self, "groups", tuple(self.groups))
        unknown = [g for g in self.groups if g not in GROUPS]
        if isinstance(self.groups, str) or unknown or not self.groups:  # "mlp" alone: a typo
            raise AccyError(
                f"fp8= takes group names ({', '.join(GROUPS)}) or a predicate on a layer's "
                f"path, got {self.groups!r}"
            )

    def selects(self, path: str, layer: Module, untied: bool = False) -> bool:
        """Whether `layer` (a Linear or an Embedding) at `path` runs its GEMM in FP8; `untied`:
        the model has an `lm_head`, so no Embedding is its output layer."""
        if callable(self.groups):
            return bool(self.groups(path))
        parts, kind = path.split("."), type(layer).__name__
        linear = kind == "Linear"
        vocab = getattr(layer, "vocab", None) == "vocab"
        tied = kind == "Embedding" and vocab and not untied
        chosen = {
            "mlp": linear and "mlp" in parts,
            "attention": linear and bool({"attn", "self_attn"} & set(parts)),
            "head": tied or (linear and parts[-1] == "lm_head"),
        }
        return any(chosen[g] for g in self.groups)

    def apply(self, tree: Any) -> Any:
        """`tree` with the selected layers' `fp8` switched on (modules are walked by field
        name; anything else is returned as it is)."""
        return _walk(tree, "", self, False)


def _walk(node: Any, path: str, policy: Fp8Policy, untied: bool) -> Any:
    if isinstance(node, Module):
        untied = untied or getattr(node, "lm_head", None) is not None
        changes = {}
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            inner = f"{path}.{f.name}" if path else f.name
            walked = _walk(value, inner, policy, untied)
            if walked is not value:
                changes[f.name] = walked
        if hasattr(node, "fp8") and policy.selects(path, node, untied):
            changes["fp8"] = True
        return node.replace(**changes) if changes else node
    if isinstance(node, tuple | list):
        walked = [_walk(v, f"{path}.{i}", policy, untied) for i, v in enumerate(node)]
        if all(w is v for w, v in zip(walked, node, strict=True)):
            return node
        return type(node)(walked)
    return node
