"""The kind `conv` on the reference evaluator: values against JAX's lax.conv_general_dilated
(stride, padding, kernel and input dilation, groups, axes in several layout orders);
gradients against finite differences in f64, and that they are themselves conv operations;
batching; errors. The backends: tests/backends/test_conv_backends.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import accy
from accy import f32, f64, spec
from accy.core.kinds.convolution import conv_attrs
from accy.core.windows import padding_pairs
from accy.lower.expand import expand_compositions
from accy.testing import check_grads

jax = pytest.importorskip("jax")
lax = jax.lax

SPATIAL = ("height", "width")
CANONICAL_X = ("batch", "height", "width", "channel")  # NHWC
CANONICAL_K = ("height", "width", "channel", "out_channel")  # HWIO

# (stride, padding, dilation, groups, channels, outputs, lhs_dilation)
CASES = [
    ((1, 1), "valid", (1, 1), 1, 3, 4, (1, 1)),
    ((2, 1), "same", (1, 1), 1, 2, 3, (1, 1)),
    ((1, 2), ((2, 0), (1, -1)), (2, 1), 1, 2, 2, (1, 1)),
    ((2, 2), "same", (1, 2), 2, 4, 6, (1, 1)),
    ((1, 1), ((1, 2), (0, 1)), (1, 1), 1, 2, 3, (2, 3)),
    ((3, 2), "valid", (2, 1), 3, 3, 6, (2, 1)),
]
IDS = [f"s{c[0]}-{c[1]}-d{c[2]}-g{c[3]}-ld{c[6]}" for c in CASES]
EXTENTS = {"batch": 2, "height": 7, "width": 6}
WINDOW = {"height": 3, "width": 2}


def _types(case, x_order=CANONICAL_X, k_order=CANONICAL_K, dtype=f64):
    _, _, _, groups, channels, outputs, _ = case
    x_extents = {**EXTENTS, "channel": channels}
    k_extents = {**WINDOW, "channel": channels // groups, "out_channel": outputs}
    return [
        spec(dtype, **{a: x_extents[a] for a in x_order}),
        spec(dtype, **{a: k_extents[a] for a in k_order}),
    ]


def _program(case, x_order=CANONICAL_X, k_order=CANONICAL_K, dtype=f64):
    stride, padding, dilation, groups, _, _, lhs_dilation = case

    def body(b, args):
        x, k = args
        return x.conv(
            k,
            SPATIAL,
            "channel",
            "out_channel",
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            lhs_dilation=lhs_dilation,
        )

    return accy.trace.define("conv", _types(case, x_order, k_order, dtype), body)


def _inputs(case, seed=0):
    _, _, _, groups, channels, outputs, _ = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 7, 6, channels))
    k = rng.standard_normal((3, 2, channels // groups, outputs))
    return x, k


def _jax_conv(case, x, k):
    stride, padding, dilation, groups, _, _, lhs_dilation = case
    extents = [(n - 1) * d + 1 for n, d in zip(x.shape[1:3], lhs_dilation, strict=True)]
    pairs = padding_pairs(padding, extents, k.shape[:2], stride, dilation)
    out = lax.conv_general_dilated(
        x.astype(np.float32),
        k.astype(np.float32),
        window_strides=stride,
        padding=pairs,
        lhs_dilation=lhs_dilation,
        rhs_dilation=dilation,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups,
        precision=lax.Precision.HIGHEST,
    )
    return np.asarray(out, np.float64)


def _ordered(array, axes, order):
    return np.transpose(array, [list(axes).index(a) for a in order])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv_matches_jax_on_the_reference(case):
    program = _program(case)
    assert program.count("conv") == 1
    x, k = _inputs(case)
    (got,) = accy.reference.run(program, [x, k])
    np.testing.assert_allclose(got, _jax_conv(case, x, k), rtol=1e-5, atol=1e-5)


def test_same_padding_matches_jax_same():
    case = ((2, 2), "same", (1, 1), 1, 3, 4, (1, 1))
    x, k = _inputs(case)
    (got,) = accy.reference.run(_program(case), [x, k])
    expected = lax.conv_general_dilated(
        x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-5, atol=1e-5)


LAYOUTS = [
    (("channel", "width", "batch", "height"), ("out_channel", "channel", "width", "height")),
    (("batch", "channel", "height", "width"), ("out_channel", "channel", "height", "width")),
    (("width", "height", "channel", "batch"), ("channel", "height", "out_channel", "width")),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda o: "".join(a[0] for a in o[0]))
@pytest.mark.parametrize("case", [CASES[3], CASES[4]], ids=[IDS[3], IDS[4]])
def test_named_results_do_not_depend_on_the_layout(case, layout):
    x_order, k_order = layout
    program = _program(case, x_order, k_order)
    x, k = _inputs(case)
    args = [_ordered(x, CANONICAL_X, x_order), _ordered(k, CANONICAL_K, k_order)]
    (got,) = accy.reference.run(program, args)
    out_axes = program.output_types[0].axes
    assert out_axes == tuple("out_channel" if a == "channel" else a for a in x_order)
    canonical = ("batch", "height", "width", "out_channel")
    np.testing.assert_allclose(
        _ordered(got, out_axes, canonical), _jax_conv(case, x, k), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradients_match_finite_differences_in_f64(case):
    program = _program(case, LAYOUTS[0][0], LAYOUTS[0][1])
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(t.extents) for t in program.parameter_types]
    check_grads(program, args, wrt=(0, 1), order=1, eps=1e-6, atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("case", [CASES[2], CASES[4]], ids=[IDS[2], IDS[4]])
def test_second_order_gradients_match_finite_differences(case):
    program = _program(case)
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(t.extents) for t in program.parameter_types]
    check_grads(program, args, wrt=(0, 1), order=2, eps=1e-5, atol=1e-6, rtol=1e-6)


def test_gradients_are_convolutions():
    """The transposes are conv operations (no im2col in the gradient program itself)."""
    program = _program(CASES[3])

    def loss(b, args):
        y = b.call(program, list(args))
        return (y**2.0).sum()

    grads = accy.grad(accy.trace.define("loss", list(program.parameter_types), loss), wrt=(0, 1))
    assert grads.count("conv") == 3, grads
    assert grads.count("dot_general") == 0
    x, k = _inputs(CASES[3])
    dx, dk = accy.reference.run(grads, [x, k])

    def jax_loss(x, k):
        return (_jax_conv_traced(CASES[3], x, k) ** 2).sum()

    jdx, jdk = jax.grad(jax_loss, argnums=(0, 1))(x.astype(np.float32), k.astype(np.float32))
    np.testing.assert_allclose(dx, np.asarray(jdx), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dk, np.asarray(jdk), rtol=1e-4, atol=1e-4)


def _jax_conv_traced(case, x, k):
    stride, padding, dilation, groups, _, _, lhs_dilation = case
    pairs = padding_pairs(padding, [7, 6], [3, 2], stride, dilation)
    return lax.conv_general_dilated(
        x,
        k,
        stride,
        pairs,
        lhs_dilation,
        dilation,
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups,
        precision=lax.Precision.HIGHEST,
    )


@pytest.mark.parametrize("in_axes", [(True, False), (False, True), (True, True)])
def test_conv_batches_under_vmap(in_axes):
    case = CASES[3]
    program = _program(case)
    batched = accy.vmap(program, "example", in_axes=in_axes, size=3)
    rng = np.random.default_rng(3)
    xs, ks = [], []
    for _ in range(3):
        x, k = _inputs(case, int(rng.integers(1000)))
        xs.append(x)
        ks.append(k)
    args = [np.stack(xs) if in_axes[0] else xs[0], np.stack(ks) if in_axes[1] else ks[0]]
    (got,) = accy.reference.run(batched, args)
    for i in range(3):
        expected = _jax_conv(case, xs[i] if in_axes[0] else xs[0], ks[i] if in_axes[1] else ks[0])
        np.testing.assert_allclose(got[i], expected, rtol=1e-5, atol=1e-5)


def test_the_composition_agrees_with_the_kind():
    """The backends' lowering (`conv_by_windows`) against the kind's own reference."""
    for case in CASES:
        program = _program(case, LAYOUTS[2][0], LAYOUTS[2][1])
        expanded = expand_compositions(program)
        assert expanded.count("conv") == 0
        args = [
            np.random.default_rng(4).standard_normal(t.extents) for t in program.parameter_types
        ]
        (kind,) = accy.reference.run(program, args)
        (composed,) = accy.reference.run(expanded, args)
        np.testing.assert_allclose(composed, kind, rtol=1e-12, atol=1e-12)


def test_paired_axes_and_no_contraction_at_the_kind_level():
    """A depthwise convolution written directly: `channel` paired, nothing contracted."""
    attrs = conv_attrs(["w"], [], [1], [(1, 1)], [1], [1])
    program = accy.trace.define(
        "depthwise",
        [spec(f64, n=2, w=5, channel=3), spec(f64, w=3, channel=3)],
        lambda b, a: b.emit("conv", list(a), attrs),
    )
    assert program.output_types[0] == spec(f64, n=2, w=5, channel=3)
    rng = np.random.default_rng(5)
    x, k = rng.standard_normal((2, 5, 3)), rng.standard_normal((3, 3))
    (got,) = accy.reference.run(program, [x, k])
    padded = np.pad(x, ((0, 0), (1, 1), (0, 0)))
    expected = sum(padded[:, t : t + 5, :] * k[t] for t in range(3))
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    check_grads(program, [x, k], wrt=(0, 1), order=1, eps=1e-6, atol=1e-7, rtol=1e-7)


# errors ---------------------------------------------------------------------------------------

X = spec(f32, n=2, h=5, c=4)
K = spec(f32, h=3, c=4, o=6)


def _conv(x_type, k_type, **kwargs):
    args = {"spatial": ["h"], "in_axis": "c", "out_axis": "o", **kwargs}
    return accy.trace.define("e", [x_type, k_type], lambda b, a: a[0].conv(a[1], **args))


ERRORS = [
    (
        {"spatial": ["w"]},
        X,
        K,
        accy.AxisError,
        r"conv: axis 'w' is not on f32\[n=2, h=5, c=4\]; its axes are n, h, c",
    ),
    ({"in_axis": "d"}, X, K, accy.AxisError, r"axis 'd' is not on"),
    (
        {},
        X,
        spec(f32, h=3, c=3, o=6),
        accy.AxisError,
        r"input's 'c' has extent 4 .* kernel's has 3",
    ),
    ({"groups": 3}, X, K, accy.AxisError, r"3 groups must divide the input's 'c' \(4\)"),
    ({"groups": 2}, X, spec(f32, h=3, c=2, o=5), accy.AxisError, r"'o' \(5\)"),
    ({"groups": 2}, X, K, accy.AxisError, r"kernel's 'c' must be 2 \(the input's 4 / 2\), got 4"),
    ({"groups": 0}, X, K, accy.AxisError, r"groups is 0; use a positive integer"),
    ({"stride": 0}, X, K, accy.AxisError, r"stride of axis 'h' is 0; use a positive integer"),
    ({"dilation": (1, 2)}, X, K, accy.AxisError, r"dilation has 2 entries for the 1 axes"),
    ({"dilation": -1}, X, K, accy.AxisError, r"dilation of axis 'h' is -1"),
    ({"padding": "full"}, X, K, accy.TypeRuleError, r"padding 'full': use 'valid', 'same'"),
    ({"padding": [(1,)]}, X, K, accy.AxisError, r"one \(low, high\) pair of ints per spatial"),
    ({"padding": [(-3, 0)]}, X, K, accy.AxisError, r"window on axis 'h' spans 3 elements"),
    ({"dilation": 3}, X, K, accy.AxisError, r"spans 7 elements, more than the padded input's 5"),
    ({"out_axis": "n"}, X, spec(f32, h=3, c=4, n=6), accy.AxisError, r"already has the output"),
]


@pytest.mark.parametrize(("kwargs", "x", "k", "error", "message"), ERRORS)
def test_conv_errors_say_what_was_wrong(kwargs, x, k, error, message):
    with pytest.raises(error, match=message):
        _conv(x, k, **kwargs)


def test_conv_kind_errors():
    good = conv_attrs(["h"], ["c"], [1], [(0, 0)], [1], [1])

    def emit(types, attrs):
        return accy.trace.define("e", types, lambda b, a: b.emit("conv", list(a), attrs))

    with pytest.raises(accy.TypeRuleError, match=r"stride needs one integer per spatial axis"):
        emit([X, K], {**good, "stride": (1, 1)})
    with pytest.raises(accy.TypeRuleError, match=r"rhs_dilation of axis 'h' is 0"):
        emit([X, K], {**good, "rhs_dilation": (0,)})
    with pytest.raises(accy.AxisError, match=r"paired axis 'n' has extent 2 on the input"):
        emit([X, spec(f32, h=3, c=4, n=3)], good)
    with pytest.raises(accy.AxisError, match=r"repeat an axis"):
        emit([X, K], {**good, "contract": ("h",)})
    with pytest.raises(accy.DTypeError, match=r"different dtypes"):
        emit([X, spec(f64, h=3, c=4, o=6)], good)
    with pytest.raises(accy.TypeRuleError, match=r"bool operands"):
        emit([spec(accy.bool_, h=5, c=4), spec(accy.bool_, h=3, c=4, o=6)], good)


def test_conv_survives_the_text_format():
    program = _program(CASES[4])
    assert accy.core.parse(str(program)).digest == program.digest


def test_all_padding_kinds_give_one_program_per_case():
    """Sanity of the case table: every case traces to one conv of the expected extents."""
    for case in CASES:
        program = _program(case)
        out = program.output_types[0]
        x, k = _inputs(case)
        assert out.extents == _jax_conv(case, x, k).shape
        assert list(itertools.chain(out.axes)) == ["batch", "height", "width", "out_channel"]
