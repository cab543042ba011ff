"""Named-axis tensor types: `accy.spec`, `TensorType` and the dtypes."""

import numpy as np
import pytest

import accy
from accy.core.types import DTYPES, TensorType, dtype_named, dtype_of_numpy


def test_spec_keeps_the_layout_order_of_its_axes():
    t = accy.spec(accy.f32, token=4, channel=3)
    assert t.dtype == accy.f32
    assert t.axes == ("token", "channel")
    assert t.extents == (4, 3)
    assert t.shape == {"token": 4, "channel": 3}
    assert t.rank == 2
    assert t.size == 12
    assert t.nbytes == 48


def test_spec_accepts_a_dict_of_extents_in_order():
    t = accy.spec(accy.i32, {"b": 2, "a": 5})
    assert t.axes == ("b", "a")
    assert t.extents == (2, 5)


def test_spec_without_axes_is_a_scalar():
    t = accy.spec(accy.f64)
    assert t.rank == 0
    assert t.axes == ()
    assert t.extents == ()
    assert t.size == 1


def test_types_with_the_same_axes_in_another_order_differ():
    assert accy.spec(accy.f32, a=2, b=3) != accy.spec(accy.f32, b=3, a=2)
    assert accy.spec(accy.f32, a=2, b=3) == accy.spec(accy.f32, a=2, b=3)
    assert hash(accy.spec(accy.f32, a=2)) == hash(accy.spec(accy.f32, a=2))


def test_type_prints_dtype_and_named_extents():
    assert str(accy.spec(accy.bf16, token=4, channel=3)) == "bf16[token=4, channel=3]"
    assert str(accy.spec(accy.bool_)) == "bool[]"
    assert repr(accy.spec(accy.u8, x=1)) == "<u8[x=1]>"


def test_type_helpers_query_and_derive_types():
    t = accy.spec(accy.f32, a=2, b=3, c=4)
    assert t.extent("b") == 3
    assert t.position("c") == 2
    assert t.has("a") and not t.has("z")
    assert t.without(["b"]) == accy.spec(accy.f32, a=2, c=4)
    assert t.with_dtype(accy.i64) == accy.spec(accy.i64, a=2, b=3, c=4)
    assert t.axes_not_in(accy.spec(accy.f32, c=4, a=2)) == ("b",)


def test_the_eight_dtypes_have_names_sizes_and_kinds():
    expected = {
        "f32": (4, True),
        "f64": (8, True),
        "f16": (2, True),
        "bf16": (2, True),
        "i32": (4, False),
        "i64": (8, False),
        "u8": (1, False),
        "bool": (1, False),
    }
    assert {name: (d.itemsize, d.is_float) for name, d in DTYPES.items()} == expected
    assert [accy.f32, accy.f64, accy.f16, accy.bf16] == [
        dtype_named(n) for n in ("f32", "f64", "f16", "bf16")
    ]
    assert repr(accy.i32) == "accy.i32" and str(accy.bool_) == "bool"


def test_numpy_dtypes_map_to_accy_dtypes_and_float32_means_f32():
    assert dtype_of_numpy(np.dtype(np.float32)) == accy.f32
    assert dtype_of_numpy(np.dtype(np.uint8)) == accy.u8
    assert dtype_of_numpy(np.dtype(np.bool_)) == accy.bool_
    with pytest.raises(accy.DTypeError, match="complex128 has no accy dtype"):
        dtype_of_numpy(np.dtype(np.complex128))


def test_unknown_dtype_name_lists_the_dtypes():
    with pytest.raises(accy.DTypeError, match=r"unknown dtype 'f8'; the dtypes are f32, f64"):
        dtype_named("f8")


def test_spec_rejects_duplicate_axis_names():
    with pytest.raises(accy.AxisError, match="'a' is given twice"):
        accy.spec(accy.f32, {"a": 2}, a=3)
    with pytest.raises(accy.AxisError, match=r"unique within a type, but a appears more"):
        TensorType(accy.f32, (("a", 2), ("a", 3)))


@pytest.mark.parametrize("name", ["1st", "two words", "", "a-b", "é"])
def test_axis_names_must_be_ascii_identifiers(name):
    with pytest.raises(accy.AxisError, match="is not an identifier"):
        accy.spec(accy.f32, {name: 2})


@pytest.mark.parametrize("extent", [-1, 2.0, True, "3"])
def test_extents_must_be_non_negative_ints(extent):
    with pytest.raises(accy.AxisError, match="extents are ints >= 0"):
        accy.spec(accy.f32, a=extent)


def test_extent_zero_is_allowed():
    t = accy.spec(accy.f32, a=0, b=3)
    assert t.size == 0


def test_spec_needs_an_accy_dtype_first():
    with pytest.raises(accy.DTypeError, match="needs an accy dtype such as accy.f32"):
        accy.spec(np.float32, a=2)


def test_type_errors_are_accy_errors():
    assert issubclass(accy.AxisError, accy.TypeRuleError)
    assert issubclass(accy.DTypeError, accy.TypeRuleError)
    assert issubclass(accy.TypeRuleError, accy.AccyError)
    assert issubclass(accy.ParseError, accy.AccyError)
    assert issubclass(accy.InvalidInput, accy.AccyError)


def test_axes_seen_valid_before_do_not_let_equal_non_int_extents_through():
    # (("a", 2.0),) == (("a", 2),): the check of valid axes done once must not skip this one.
    accy.spec(accy.f32, a=2, b=1)
    for extents in ((("a", 2.0), ("b", 1)), (("a", 2), ("b", True))):
        with pytest.raises(accy.AxisError, match="extents are ints >= 0"):
            TensorType(accy.f32, extents)
