"""User mistakes give one `AccyError` family with clear messages: the operation, each operand's
named shape, the axes that exist, and (while tracing) the user's line. One test per message."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import accy

from .core_helpers import trace

f32, f64, i32 = accy.f32, accy.f64, accy.i32
spec = accy.spec
THIS_FILE = os.path.basename(__file__)


def traced_at(function, lines_after_def: int) -> str:
    """The 'traced at FILE:LINE' text for the line `lines_after_def` below `function`'s def."""
    line = function.__code__.co_firstlineno + lines_after_def
    return re.escape(f"(traced at {function.__code__.co_filename}:{line})")


# ---------------------------------------------------------------------------------------------
# missing axes: the message lists the axes that exist


def test_sum_over_a_missing_axis_lists_the_axes_that_exist():
    with pytest.raises(
        accy.AxisError,
        match=r"reduce sum: axis 'lanes' is not on the operand f32\[lane=4, row=2\]; "
        r"its axes are lane, row",
    ):
        trace([spec(f32, lane=4, row=2)], lambda b, a: a[0].sum("lanes"))


def test_reducing_a_scalar_over_an_axis_says_it_has_none():
    with pytest.raises(
        accy.AxisError,
        match=r"reduce max: axis 'lane' is not on the operand f32\[\]; its axes are "
        r"\(none, it is a scalar\)",
    ):
        trace([spec(f32)], lambda b, a: a[0].max("lane"))


@pytest.mark.parametrize(
    "operation, call",
    [
        ("rename", lambda x: x.rename("tokn", "key")),
        ("slice", lambda x: x.slice("tokn", 0, 1)),
        ("pad", lambda x: x.pad("tokn", 1, 1)),
        ("merge", lambda x: x.merge(["token", "tokn"], "both")),
        ("split", lambda x: x.split("tokn", a=2, b=2)),
        ("mean", lambda x: x.mean("tokn")),
    ],
)
def test_layout_ops_on_a_missing_axis_list_the_axes_that_exist(operation, call):
    with pytest.raises(
        accy.AxisError,
        match=rf"{operation}: axis 'tokn' is not on f32\[token=4, channel=3\]; "
        r"its axes are token, channel",
    ):
        trace([spec(f32, token=4, channel=3)], lambda b, a: call(a[0]))


def test_gather_along_a_missing_axis_names_the_table_and_its_axes():
    with pytest.raises(
        accy.AxisError,
        match=r"gather: axis 'vocab' is not on the table f32\[word=5, channel=2\]; "
        r"its axes are word, channel",
    ):
        trace(
            [spec(f32, word=5, channel=2), spec(i32, token=3)],
            lambda b, a: a[0].gather(a[1], "vocab"),
        )


def test_rename_onto_an_existing_axis_is_an_error():
    with pytest.raises(accy.AxisError, match=r"rename: f32\[a=2, b=3\] already has an axis 'b'"):
        trace([spec(f32, a=2, b=3)], lambda b, a: a[0].rename("a", "b"))


# ---------------------------------------------------------------------------------------------
# extents that do not match


def test_elementwise_extent_mismatch_shows_both_shapes():
    with pytest.raises(
        accy.AxisError,
        match=r"add: axis 'lane' has extent 4 on one operand and 3 on another "
        r"\(f32\[lane=4\], f32\[row=2, lane=3\]\); equal names need equal extents",
    ):
        trace([spec(f32, lane=4), spec(f32, row=2, lane=3)], lambda b, a: a[0] + a[1])


def test_contraction_extent_mismatch_shows_both_operands():
    with pytest.raises(
        accy.AxisError,
        match=r"contract: axis 'k' has extent 3 on the left operand f32\[m=2, k=3\] and 4 on the "
        r"right operand f32\[k=4, n=5\]",
    ):
        trace([spec(f32, m=2, k=3), spec(f32, k=4, n=5)], lambda b, a: a[0].contract(a[1], "k"))


def test_batch_axis_extent_mismatch_in_a_contraction():
    with pytest.raises(
        accy.AxisError,
        match=r"contract: shared axis 'b' \(a batch axis\) has extent 2 on f32\[b=2, k=3\] and 5 "
        r"on f32\[k=3, b=5\]",
    ):
        trace([spec(f32, b=2, k=3), spec(f32, k=3, b=5)], lambda b, a: a[0].contract(a[1], "k"))


# ---------------------------------------------------------------------------------------------
# contraction over an axis that is not on both sides


def test_contraction_over_an_axis_missing_on_one_side_is_not_an_outer_product():
    with pytest.raises(
        accy.AxisError,
        match=r"contract: axis 'chanel' must be on both operands, but the left operand "
        r"f32\[token=4, chanel=3\] has \(token, chanel\) and the right operand "
        r"f32\[key=4, channel=3\] has \(key, channel\); a typo must not become an outer product",
    ):
        trace(
            [spec(f32, token=4, chanel=3), spec(f32, key=4, channel=3)],
            lambda b, a: a[0].contract(a[1], "chanel"),
        )


# ---------------------------------------------------------------------------------------------
# mixed dtypes


def test_mixed_dtypes_in_elementwise_ops_are_not_promoted():
    with pytest.raises(
        accy.DTypeError,
        match=r"mul: operands have different dtypes \(left f32\[lane=4\], right i32\[lane=4\]\); "
        r"accy does not promote dtypes silently, convert one with \.convert\(accy\.i32\)",
    ):
        trace([spec(f32, lane=4), spec(i32, lane=4)], lambda b, a: a[0] * a[1])


def test_mixed_dtypes_in_a_contraction_show_each_operand():
    with pytest.raises(
        accy.DTypeError,
        match=r"dot_general: operands have different dtypes \(operand 0: f32\[m=2, k=3\], "
        r"operand 1: f64\[k=3\]\)",
    ):
        trace([spec(f32, m=2, k=3), spec(f64, k=3)], lambda b, a: a[0].contract(a[1], "k"))


def test_a_float_scalar_does_not_fit_an_integer_tensor():
    with pytest.raises(
        accy.DTypeError, match="constant 0.5 is not an integer but the dtype is i32"
    ):
        trace([spec(i32, lane=2)], lambda b, a: a[0] + 0.5)


# ---------------------------------------------------------------------------------------------
# wrong number of operands


def test_wrong_number_of_operands_shows_the_operands_given():
    builder = accy.trace.Builder("arity")
    x = builder.parameter(spec(f32, lane=4))
    with pytest.raises(
        accy.TypeRuleError, match=r"add takes 2 operands, got 1 \(operand 0: f32\[lane=4\]\)"
    ):
        builder.emit("add", [x])
    with pytest.raises(accy.TypeRuleError, match=r"unary takes 1 operand, got 2 \(operand 0"):
        builder.emit("unary", [x, x], {"op": "neg"})
    with pytest.raises(accy.TypeRuleError, match=r"iota takes 0 operands, got 1"):
        builder.emit("iota", [x], {"type": spec(i32, a=2), "axis": "a"})


def test_calling_a_program_with_the_wrong_number_of_arguments():
    callee = trace([spec(f32, lane=4)] * 2, lambda b, a: a[0] * a[1], name="callee")
    with pytest.raises(
        accy.AccyError,
        match=r"call 'callee': it takes 2 arguments \(f32\[lane=4\], f32\[lane=4\]\), got 1 "
        r"\(f32\[lane=4\]\)",
    ):
        trace([spec(f32, lane=4)], lambda b, a: b.call(callee, [a[0]]))


def test_calling_a_program_with_an_argument_of_the_wrong_type():
    callee = trace([spec(f32, lane=4)], lambda b, a: -a[0], name="callee")
    with pytest.raises(
        accy.AccyError,
        match=r"call 'callee': argument 0 has type f32\[lane=3\] but the program's parameter 0 "
        r"has type f32\[lane=4\]",
    ):
        trace([spec(f32, lane=3)], lambda b, a: b.call(callee, [a[0]]))


def test_unknown_kind_lists_the_kinds():
    builder = accy.trace.Builder("kinds")
    with pytest.raises(accy.TypeRuleError, match="unknown operation kind 'fma'; the kinds are"):
        builder.emit("fma", [])


# ---------------------------------------------------------------------------------------------
# values that do not belong to the trace


def test_values_from_another_trace_cannot_be_mixed_in():
    outer = accy.trace.Builder("outer")
    stray = outer.parameter(spec(f32, lane=4))
    with pytest.raises(
        accy.AccyError,
        match=r"mul: operand 1 \(<Value %0: f32\[lane=4\]>\) is not a value of the program "
        r"'inner' being traced; values from another trace cannot be mixed in",
    ):
        accy.trace.define("inner", [spec(f32, lane=4)], lambda b, a: a[0] * stray)


def test_returning_a_value_of_another_trace_is_an_error():
    outer = accy.trace.Builder("outer")
    stray = outer.parameter(spec(f32, lane=4))
    with pytest.raises(
        accy.AccyError, match=r"program 'inner': output 0 \(<Value %0: f32\[lane=4\]>\) is not a "
    ):
        accy.trace.define("inner", [spec(f32, lane=4)], lambda b, a: stray)


def test_a_scan_body_captures_values_of_the_enclosing_trace_as_consts():
    def body(b, a):
        return b.scan(
            lambda inner, args: (args[0] + a[0], args[1]),
            carries=[a[0]],
            xs=[a[1]],
            axis="t",
        )[0][0]

    program = trace([spec(f32, c=2), spec(f32, t=3, c=2)], body)
    (scan,) = [op for op in program.operations if op.kind == "scan"]
    assert scan.attrs["num_consts"] == 1 and scan.operands[0] == program.parameters[0]


def test_a_scan_body_cannot_use_values_of_an_unrelated_trace():
    stray = accy.trace.Builder("other").parameter(spec(f32, c=2))

    def body(b, a):
        return b.scan(
            lambda inner, args: (args[0] + stray, args[1]), carries=[a[0]], xs=[a[1]], axis="t"
        )[0][0]

    with pytest.raises(accy.AccyError, match="not a value of the program 'scan_body'"):
        trace([spec(f32, c=2), spec(f32, t=3, c=2)], body)


def test_returning_something_that_is_not_a_value():
    with pytest.raises(accy.AccyError, match=r"output 0 \(3\.0\) is not a traced value"):
        trace([spec(f32, lane=4)], lambda b, a: 3.0)


def test_traced_values_have_no_truth_value():
    with pytest.raises(accy.AccyError, match="a traced value has no truth value while tracing"):
        trace([spec(f32, lane=4)], lambda b, a: a[0] if a[0] > 0.0 else -a[0])


def test_an_operation_needs_at_least_one_traced_value():
    builder = accy.trace.Builder("scalars")
    with pytest.raises(accy.AccyError, match="add needs at least one traced value, got 1.0 and 2"):
        builder.add(1.0, 2)


# ---------------------------------------------------------------------------------------------
# inputs of the reference evaluator


def loss():
    return trace([spec(f32, lane=4), spec(i32, token=3)], lambda b, a: (a[0].sum(), a[1].sum()))


def test_reference_input_of_the_wrong_shape_names_the_parameter():
    with pytest.raises(
        accy.InvalidInput,
        match=r"program 'test', argument 0: an array of shape \(3,\) was given for "
        r"f32\[lane=4\], which has shape \(4,\) \(axes in layout order: lane\)",
    ):
        accy.reference.run(loss(), [np.zeros(3, np.float32), np.zeros(3, np.int32)])


def test_reference_input_of_the_wrong_dtype_names_the_parameter():
    with pytest.raises(
        accy.InvalidInput,
        match=r"program 'test', argument 1: an array of dtype float64 was given for "
        r"i32\[token=3\], which needs int32; convert it with .astype\(numpy.int32\)",
    ):
        accy.reference.run(loss(), [np.zeros(4, np.float32), np.zeros(3, np.float64)])


def test_reference_input_count_must_match_the_parameters():
    with pytest.raises(
        accy.InvalidInput,
        match=r"program 'test' takes 2 arrays \(f32\[lane=4\], i32\[token=3\]\), got 1",
    ):
        accy.reference.run(loss(), [np.zeros(4, np.float32)])


def test_reference_takes_arguments_by_the_rule_of_every_device():
    # Lists convert without loss; an array of another dtype (even of the same kind) does not:
    # an int64 2**40 would become 0 in an i32 parameter, a float64 would be rounded.
    total, count = accy.reference.run(loss(), [[1, 2, 3, 4], [1, 2, 3]])
    assert total.dtype == np.float32 and float(total) == 10.0
    assert count.dtype == np.int32 and int(count) == 6
    for inputs, why in [
        ([np.zeros(4, np.float32), np.array([2**40, 0, 0], np.int64)], "dtype int64"),
        ([np.zeros(4, np.float64), np.zeros(3, np.int32)], "dtype float64"),
        ([np.zeros(4, np.float32), [2**40, 0, 0]], "range is -2147483648 to 2147483647"),
    ]:
        for device in ("reference", "cpu"):
            with pytest.raises(accy.InvalidInput, match=f"program 'test', argument .*{why}"):
                accy.compile(loss(), device)(*inputs)
        with pytest.raises(accy.InvalidInput, match=f"program 'test', argument .*{why}"):
            accy.reference.run(loss(), inputs)


# ---------------------------------------------------------------------------------------------
# errors raised while tracing point at the user's line


def test_a_tracing_error_points_at_the_users_line():
    def body(b, a):
        scores = a[0] * 2.0
        return scores.sum("tokn")  # the user's line: one below the def's first body line

    with pytest.raises(accy.AxisError, match=traced_at(body, 2)) as caught:
        trace([spec(f32, token=4)], body)
    assert THIS_FILE in str(caught.value)
    assert "reduce sum: axis 'tokn' is not on the operand f32[token=4]" in str(caught.value)


def test_a_tracing_error_in_a_helper_points_at_the_innermost_user_line():
    def normalize(x):
        return x / x.sum("chanel")

    def body(b, a):
        return normalize(a[0])

    with pytest.raises(accy.AxisError, match=traced_at(normalize, 1)):
        trace([spec(f32, channel=3)], body)


def test_a_tracing_error_in_a_scan_body_points_at_the_body_line_once():
    def step(b, a):
        return (a[0] + a[1].sum("nope"), a[1])

    def body(b, a):
        return b.scan(step, carries=[a[0]], xs=[a[1]], axis="t")[1][0]

    with pytest.raises(accy.AxisError, match=traced_at(step, 1)) as caught:
        trace([spec(f32), spec(f32, t=2)], body)
    assert str(caught.value).count("traced at") == 1


def test_errors_outside_tracing_carry_no_location():
    builder = accy.trace.Builder("direct")
    x = builder.parameter(spec(f32, lane=2))
    with pytest.raises(accy.AxisError) as caught:
        x.sum("nope")
    assert "traced at" not in str(caught.value)


def test_a_bad_output_points_at_the_line_that_called_define():
    def define_with_bad_output():
        return accy.trace.define("bad", [spec(f32, lane=2)], lambda b, a: "not a value")

    with pytest.raises(accy.AccyError, match=traced_at(define_with_bad_output, 1)):
        define_with_bad_output()


def test_mean_of_integers_is_an_error_not_a_truncation():
    with pytest.raises(
        accy.DTypeError, match=r"mean needs a floating-point operand, got i32\[a=2\]; convert it"
    ):
        trace([spec(i32, a=2)], lambda b, a: a[0].mean())
