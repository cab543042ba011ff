"""Haliax's tests/test_axis.py, case by case, on accy's axis helpers (`accy.without_axes`,
`eliminate_axes`, `replace_axis`, `rearrange_for_partial_order`). Haliax does not import under
this JAX, so its assertions' own expected values are the oracle. Haliax's `Axis` objects are
accy's shape dicts (name -> extent); its name-only references are tuples of names. A shape
mixing Axis objects and names is positional-only convention accy does not have.

Haliax's 14 cases: all 14 translated, one test each."""

import pytest

import accy
from accy import eliminate_axes, rearrange_for_partial_order, replace_axis, without_axes
from tests.peers.ledger import translates

H, W, C = {"H": 3}, {"W": 4}, {"C": 5}
HWC = {"H": 3, "W": 4, "C": 5}
HW = {"H": 3, "W": 4}


@translates("test_eliminate_axes")
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


@translates("test_without_axes")
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


@translates("test_replace_axis")
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


def check_rearranged(partial_order, candidates, expected):
    got = rearrange_for_partial_order(partial_order, candidates)
    assert_partial_order_respected(partial_order, got)
    assert got == expected


@translates("test_basic_order")
def test_basic_order():
    check_rearranged(("apple", ..., "banana"), CANDIDATES, ("apple", "cherry", "banana"))


@translates("test_start_with_ellipsis")
def test_start_with_ellipsis():
    check_rearranged((..., "apple", "banana"), CANDIDATES, ("cherry", "apple", "banana"))


@translates("test_end_with_ellipsis")
def test_end_with_ellipsis():
    check_rearranged(("apple", ..., "banana", ...), CANDIDATES, ("apple", "banana", "cherry"))


@translates("test_full_flexibility")
def test_full_flexibility():
    check_rearranged((...,), CANDIDATES, CANDIDATES)


@translates("test_no_flexibility")
def test_no_flexibility():
    with pytest.raises(accy.AxisError):
        rearrange_for_partial_order(("apple", "banana"), CANDIDATES)


@translates("test_final_ellipsis")
def test_final_ellipsis():
    check_rearranged(("apple", "banana", ...), CANDIDATES, ("apple", "banana", "cherry"))


@translates("test_lots_of_ellipsis")
def test_lots_of_ellipsis():
    check_rearranged(
        ("apple", ..., "banana", ..., "cherry", ...),
        ("banana", "orange", "cherry", "apple", "grape"),
        ("apple", "banana", "orange", "cherry", "grape"),
    )


@translates("test_no_ellipsis")
def test_no_ellipsis():
    check_rearranged(("apple", "banana", "cherry"), CANDIDATES, ("apple", "banana", "cherry"))


@translates("test_no_elements")
def test_no_elements():
    check_rearranged((...,), (), ())


@translates("test_missing_elements_errors")
def test_missing_elements_errors():
    with pytest.raises(accy.AxisError):
        rearrange_for_partial_order(("qux", ...), CANDIDATES)


@translates("test_duplicate_elements_errors")
def test_duplicate_elements_errors():
    for partial_order, candidates in (
        (("apple", "apple", ...), CANDIDATES),
        (("apple", "apple", ...), ("banana", "apple", "apple")),
        (("apple", "banana", "grape", ...), ("banana", "apple", "apple")),
    ):
        with pytest.raises(accy.AxisError):
            rearrange_for_partial_order(partial_order, candidates)
