"""Haliax's tests/test_axis.py, case by case, on accy's axis helpers (`accy.without_axes`,
`eliminate_axes`, `replace_axis`, `rearrange_for_partial_order`). Haliax does not import under
this JAX, so its assertions' own expected values are the oracle. Haliax's `Axis` objects are
accy's shape dicts (name -> extent); its name-only references are tuples of names. A shape
mixing Axis objects and names is positional-only convention accy does not have."""

import pytest

import accy
from accy import eliminate_axes, rearrange_for_partial_order, replace_axis, without_axes

H, W, C = {"H": 3}, {"W": 4}, {"C": 5}
HWC = {"H": 3, "W": 4, "C": 5}
HW = {"H": 3, "W": 4}


def test_eliminate_axes():
    assert eliminate_axes(HW, H) == W
    assert eliminate_axes(HW, W) == H
    assert eliminate_axes(HW, HW) == {}
    with pytest.raises(accy.AxisError):
        eliminate_axes(HW, C)
    with pytest.raises(accy.AxisError):
        eliminate_axes(HW, {"H": 3, "C": 5})
    assert eliminate_axes(("H", "W"), ("H",)) == ("W",)
    assert eliminate_axes(("H", "W"), ("H", "W")) == ()
    assert eliminate_axes(HWC, HW) == {"C": 5}
    with pytest.raises(accy.AxisError):
        eliminate_axes(HW, HWC)
    assert eliminate_axes(HWC, {"H": 3}) == {"W": 4, "C": 5}
    assert eliminate_axes(HWC, {"W": 4}) == {"H": 3, "C": 5}
    assert eliminate_axes(HWC, {"C": 5}) == HW
    with pytest.raises(accy.AxisError):
        eliminate_axes(HWC, {"C": 6})
    with pytest.raises(accy.AxisError):
        eliminate_axes({"C": 6}, HWC)


def test_without_axes():
    assert without_axes(HW, H) == W
    assert without_axes(HW, HW) == {}
    assert without_axes(HW, C) == HW
    assert without_axes(HW, {"H": 3, "C": 5}) == W
    assert without_axes(("H", "W"), ("H",)) == ("W",)
    assert without_axes(("H", "W"), ("H", "W")) == ()
    assert without_axes(HWC, HW) == {"C": 5}
    assert without_axes(HW, HWC) == {}
    assert without_axes(HWC, {"W": 4}) == {"H": 3, "C": 5}
    assert without_axes(HWC, {"C": 5}) == HW
    with pytest.raises(accy.AxisError):
        without_axes(HWC, {"C": 6})
    with pytest.raises(accy.AxisError):
        without_axes({"C": 6}, HWC)


def test_replace_axis():
    assert replace_axis(HW, "W", C) == {"H": 3, "C": 5}
    with pytest.raises(accy.AxisError):
        replace_axis(HW, "C", H)
    with pytest.raises(accy.AxisError):
        replace_axis(HW, "H2", {"C": 5, "W": 4})
    with pytest.raises(accy.AxisError):
        replace_axis(("H", "W"), "H", ("W",))
    with pytest.raises(accy.AxisError):
        replace_axis(("H", "W"), "H", ("C", "W"))
    assert replace_axis(("H", "W"), "H", ("C",)) == ("C", "W")
    assert replace_axis(("H", "W"), "W", ("C",)) == ("H", "C")
    assert replace_axis(("H", "W"), "W", ("C", "D")) == ("H", "C", "D")
    assert replace_axis(HW, "H", {"H": 3, "C": 5}) == {"H": 3, "C": 5, "W": 4}
    with pytest.raises(accy.AxisError):
        replace_axis(HW, "H", HWC)
    with pytest.raises(accy.AxisError):
        replace_axis(HW, "C", {"H": 3, "C": 5})


def assert_partial_order_respected(partial_order, output):
    positions = {el: i for i, el in enumerate(output)}
    last = -1
    for el in partial_order:
        if el is ...:
            last = -1
        else:
            assert el in positions and positions[el] > last
            last = positions[el]


CANDIDATES = ("banana", "apple", "cherry")


@pytest.mark.parametrize(
    "partial_order, candidates, expected",
    [
        (("apple", ..., "banana"), CANDIDATES, ("apple", "cherry", "banana")),  # basic_order
        ((..., "apple", "banana"), CANDIDATES, ("cherry", "apple", "banana")),  # start_with_...
        (("apple", ..., "banana", ...), CANDIDATES, ("apple", "banana", "cherry")),  # end_with
        ((...,), CANDIDATES, CANDIDATES),  # full_flexibility
        (("apple", "banana", ...), CANDIDATES, ("apple", "banana", "cherry")),  # final_ellipsis
        (  # lots_of_ellipsis
            ("apple", ..., "banana", ..., "cherry", ...),
            ("banana", "orange", "cherry", "apple", "grape"),
            ("apple", "banana", "orange", "cherry", "grape"),
        ),
        (("apple", "banana", "cherry"), CANDIDATES, ("apple", "banana", "cherry")),  # no_ellipsis
        ((...,), (), ()),  # no_elements
    ],
)
def test_rearrange_for_partial_order(partial_order, candidates, expected):
    got = rearrange_for_partial_order(partial_order, candidates)
    assert_partial_order_respected(partial_order, got)
    assert got == expected


@pytest.mark.parametrize(
    "partial_order, candidates",
    [
        (("apple", "banana"), CANDIDATES),  # no_flexibility
        (("qux", ...), CANDIDATES),  # missing_elements_errors
        (("apple", "apple", ...), CANDIDATES),  # duplicate_elements_errors
        (("apple", "apple", ...), ("banana", "apple", "apple")),
        (("apple", "banana", "grape", ...), ("banana", "apple", "apple")),
    ],
)
def test_rearrange_for_partial_order_errors(partial_order, candidates):
    with pytest.raises(accy.AxisError):
        rearrange_for_partial_order(partial_order, candidates)
